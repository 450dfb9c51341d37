"""Serving frameworks as launch targets: the documented flags of vLLM-Ascend and SGLang on Ascend that npusim may
emit, with the documentation (file and commit) each was read from. A flag table is data
(`workloads/frameworks/<name>.yaml`); the emitter (`npusim.results.launch`) writes only flags listed here, with
values of the listed type, so what it prints can be checked against what the framework documents.
"""

from __future__ import annotations

import json
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
class Framework:
    name: str
    title: str
    version: str
    docs: tuple[str, ...]
    launcher: str
    flags: dict[str, Flag]
    router: str = ""
    router_flags: dict[str, Flag] | None = None

    def check(self, flags: list[tuple[str, str | None]], router: bool = False) -> None:
        """Refuse a flag or a value the documentation does not have: the emitter's own guard."""
        table = self.router_flags if router else self.flags
        for name, value in flags:
            if name not in table:
                raise NpusimError(f"{name} is not in the documented flag table", file=self.name)
            problem = table[name].problem(value)
            if problem:
                raise NpusimError(problem, file=self.name)


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
                     _flags(raw.get("router_flags"), where, "router_flags"))
