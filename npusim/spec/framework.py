"""Serving frameworks as launch targets: the documented flags of vLLM-Ascend and SGLang on Ascend that npusim may
emit, with the documentation (file and commit) each was read from, checked against the flag set of a named release.

A flag table is data (`workloads/frameworks/<name>.yaml`); the emitter (`npusim.results.launch`) writes only flags
listed there, with values of the listed type. Each table names the release it is checked against
(`release.flags`: a file of `workloads/frameworks/flags/`, extracted from the released package's own argument
definitions by scripts/framework_flags.py): a flag that release does not have, hides (argparse.SUPPRESS) or
deprecates is refused, as is a value outside its choices, an --additional-config key it does not read, and an
environment variable neither it nor the Ascend runtime (the table's `runtime_env`) reads.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from npusim.errors import NpusimError, did_you_mean
from npusim.spec.catalog import data_root, display_path
from npusim.spec.schema import read_yaml

FLAG_TYPES = ("int", "bool", "str", "choice", "json")


@dataclass(frozen=True)
class Flag:
    """One documented flag: its value type, the allowed choices or JSON keys (dotted), and where it is documented."""

    name: str
    type: str
    doc: str
    choices: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()

    def problem(self, value: str | None) -> str:
        """Why `value` is not what the documentation allows ('' when it is)."""
        if self.type == "bool":
            return "" if value is None else f"{self.name} is a switch and takes no value"
        if value is None:
            return f"{self.name} needs a value"
        if self.type == "int":
            return "" if value.lstrip("-").isdigit() else f"{self.name} takes a whole number, got {value}"
        if self.type == "choice":
            return "" if value in self.choices else f"{self.name} takes one of {', '.join(self.choices)}, got {value}"
        if self.type == "json":
            try:
                tree = json.loads(value)
            except json.JSONDecodeError:
                return f"{self.name} takes JSON, got {value}"
            unknown = sorted(set(json_keys(tree)) - set(self.keys))
            return f"{self.name} keys {', '.join(unknown)} are not documented" if unknown else ""
        return ""


def json_keys(tree: dict, prefix: str = "") -> list[str]:
    """The dotted paths of a JSON object's leaves."""
    out = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        out += json_keys(value, path + ".") if isinstance(value, dict) else [path]
    return out


@dataclass(frozen=True)
class Release:
    """The flag set of one released package, as scripts/framework_flags.py extracted it: every flag by each of its
    names (aliases included), the --additional-config keys (dotted) and the environment variables it reads."""

    title: str  # e.g. "SGLang 0.5.23"
    files: tuple[str, ...]  # the extracted files, with the package and sha256 each names
    flags: dict[str, dict]
    config_keys: frozenset[str] = frozenset()
    env: frozenset[str] = frozenset()

    def problem(self, name: str, value: str | None) -> str:
        """Why the release would refuse `name value` ('' when it accepts it)."""
        rec = self.flags.get(name)
        if rec is None:
            return f"{name} is not a flag of {self.title}"
        if rec["hidden"] or rec["deprecated"]:
            return f"{name} is {'hidden' if rec['hidden'] else 'deprecated'} in {self.title}"
        if rec["choices"] and value is not None and value not in rec["choices"]:
            return f"{name} takes one of {', '.join(rec['choices'])} in {self.title}, got {value}"
        if name == "--additional-config" and value is not None and self.config_keys:
            unknown = sorted(k for k in json_keys(json.loads(value)) if k not in self.config_keys
                             and k.split(".")[0] not in self.config_keys)
            if unknown:
                return f"{name} keys {', '.join(unknown)} are not read by {self.title}"
        return ""


@dataclass(frozen=True)
class Framework:
    name: str
    title: str
    version: str
    docs: tuple[str, ...]
    launcher: str
    flags: dict[str, Flag]
    router: str = ""
    router_flags: dict[str, Flag] | None = None
    release: Release | None = None
    runtime_env: tuple[str, ...] = ()  # prefixes / names the Ascend runtime reads (CANN, torch_npu), not the framework
    env: dict[str, dict[str, str]] | None = None  # role (all, prefill, decode, mixed) -> published environment
    router_release: Release | None = None  # the PD router's own package (SGLang's sglang-router)

    def check(self, flags: list[tuple[str, str | None]], router: bool = False) -> None:
        """Refuse a flag or a value the documentation or the release does not have: the emitter's own guard."""
        table = self.router_flags if router else self.flags
        for name, value in flags:
            if value is not None and value.startswith('"'):  # written for the shell: check what it receives
                value = " ".join(shlex.split(value))
            if name not in table:
                raise NpusimError(f"{name} is not in the documented flag table", file=self.name)
            release = self.router_release if router else self.release
            problem = table[name].problem(value) or (release.problem(name, value) if release else "")
            if problem:
                raise NpusimError(problem, file=self.name)

    def env_problem(self, name: str) -> str:
        """Why `name` is an environment variable nobody reads ('' when the release or the runtime reads it)."""
        if self.release is None or name in self.release.env or any(name.startswith(p) for p in self.runtime_env):
            return ""
        return f"environment variable {name} is read neither by {self.release.title} nor by the Ascend runtime"


def _flags(raw: dict, where: str, field: str) -> dict[str, Flag]:
    out = {}
    for name, spec in (raw or {}).items():
        if not isinstance(spec, dict) or spec.get("type") not in FLAG_TYPES:
            raise NpusimError(f"needs a type, one of {', '.join(FLAG_TYPES)}", file=where, field=f"{field}.{name}")
        out[name] = Flag(name, spec["type"], str(spec.get("doc", "")), tuple(str(c) for c in spec.get("choices", ())),
                         tuple(spec.get("keys", ())))
    return out


def frameworks() -> list[str]:
    return sorted(p.stem for p in (data_root() / "workloads" / "frameworks").glob("*.yaml"))


def load_framework(name: str) -> Framework:
    path = data_root() / "workloads" / "frameworks" / f"{name}.yaml"
    if not path.exists():
        raise NpusimError(f"unknown framework '{name}'" + did_you_mean(name, frameworks()), field="--emit")
    where = display_path(path)
    raw = read_yaml(path, where)
    for key in ("name", "title", "version", "docs", "launcher", "flags"):
        if key not in raw:
            raise NpusimError("is missing", file=where, field=key)
    return Framework(raw["name"], raw["title"], raw["version"], tuple(raw["docs"]), raw["launcher"],
                     _flags(raw["flags"], where, "flags"), raw.get("router", ""),
                     _flags(raw.get("router_flags"), where, "router_flags"), _release(raw.get("release"), where),
                     tuple(raw.get("runtime_env", ())),
                     {role: {k: str(v) for k, v in env.items()} for role, env in (raw.get("env") or {}).items()},
                     _release(raw.get("router_release"), where))


def _release(raw: dict | None, where: str) -> Release | None:
    """The release a table is checked against: its `flags` file (and an `additional_config` file of keys)."""
    if not raw:
        return None
    root = data_root() / "workloads" / "frameworks" / "flags"
    files = [raw["flags"]] + ([raw["additional_config"]] if raw.get("additional_config") else [])
    trees = []
    for name in files:
        path = root / name
        if not path.exists():
            raise NpusimError(f"names {name}, which is not in {display_path(root)}", file=where, field="release")
        trees.append(json.loads(path.read_text()))
    flags = {alias: rec for rec in trees[0]["flags"].values() for alias in rec["names"]}
    keys = frozenset(k for t in trees[1:] for k in t.get("additional_config", ()))
    env = frozenset(e for t in trees for e in t.get("env", ()))
    return Release(raw["title"], tuple(files), flags, keys, env)
