"""Extract the serving frameworks' launch flags from their released packages into workloads/frameworks/flags/.

    pip download --no-deps sglang==0.5.23 vllm==0.23.0 sglang-router==0.3.2 -d /tmp/wheels
    pip download --no-deps vllm-ascend==0.23.0.post1 -d /tmp/wheels    # an sdist; its tarball is enough
    python scripts/framework_flags.py /tmp/wheels

Each package's argument definitions are read from its source by parsing it (ast), never by importing it (the
packages import torch and CUDA/NPU runtimes at import time): SGLang's server_args.py and the dataclass fields of
sglang/srt/arg_groups/fields/*.py it registers, vLLM's vllm/engine/arg_utils.py (EngineArgs.add_cli_args and the
config dataclasses of vllm/config/ its kwargs come from), vLLM-Ascend's additional_config keys
(vllm_ascend/ascend_config.py and the `"key" in additional_config` tests of vllm_ascend/utils.py), and the PD router's
sglang_router/router_args.py. Each flag records
its type, choices (where the source states them as literals), whether it is hidden (help=argparse.SUPPRESS) or
deprecated (a Deprecated* argparse action, `deprecated=True`, or help text starting "Deprecated"). The output names
the package file (and its sha256) and the source paths read.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import tarfile
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "workloads" / "frameworks" / "flags"


class Package:
    """A wheel or sdist: its files by path inside the package (an sdist's top directory dropped)."""

    def __init__(self, path: Path):
        self.path = path
        self.sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        if path.suffix == ".whl":
            with zipfile.ZipFile(path) as z:
                self.files = {n: z.read(n) for n in z.namelist() if n.endswith(".py")}
        else:
            with tarfile.open(path) as t:
                self.files = {m.name.split("/", 1)[1]: t.extractfile(m).read() for m in t.getmembers()
                              if m.isfile() and m.name.endswith(".py")}

    def tree(self, name: str) -> ast.Module:
        return ast.parse(self.files[name].decode(), name)

    def under(self, prefix: str) -> list[str]:
        return sorted(n for n in self.files if n.startswith(prefix))


def literal(node: ast.AST, names: dict) -> object:
    """A literal value, or a list/tuple/set of literals, resolving module-level constant names; None if not."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        pass
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [literal(e, names) for e in node.elts]
        return None if any(i is None for i in items) else list(items)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = literal(node.left, names), literal(node.right, names)
        return list(a) + list(b) if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("set", "frozenset",
                                                                                           "list", "tuple"):
        return literal(node.args[0], names) if node.args else []
    return None


def constants(tree: ast.Module, names: dict | None = None) -> dict:
    """Module-level NAME = literal assignments."""
    out = dict(names or {})
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            and node.value is not None else []
        for t in targets:
            if isinstance(t, ast.Name):
                value = literal(node.value, out)
                if value is not None:
                    out[t.id] = value
    return out


def _is_suppress(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "SUPPRESS"


def _help_text(node: ast.AST | None) -> str:
    if node is None:
        return ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    value = literal(node, {})
    return value if isinstance(value, str) else ""


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _annotation_type(node: ast.AST, names: dict) -> tuple[str, list | None]:
    """(type, literal choices) of a field annotation: Optional/Union unwrapped, Literal[...] gives choices."""
    if isinstance(node, ast.Subscript):
        head = _name(node.value)
        if head in ("Optional",):
            return _annotation_type(node.slice, names)
        if head == "Union":
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            kinds = [_annotation_type(e, names) for e in elts if not (isinstance(e, ast.Constant) and e.value is None)]
            return kinds[0] if len(kinds) == 1 else ("str", None)
        if head == "Literal":
            vals = literal(node.slice, names)
            vals = list(vals) if isinstance(vals, (list, tuple)) else [vals]
            return ("int" if all(isinstance(v, int) for v in vals) else "str"), vals
        if head in ("list", "List"):
            return "list", None
        if head in ("dict", "Dict"):
            return "json", None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | None
        sides = [s for s in (node.left, node.right) if not (isinstance(s, ast.Constant) and s.value is None)]
        return _annotation_type(sides[0], names) if len(sides) == 1 else ("str", None)
    base = _name(node)
    return {"int": "int", "float": "float", "bool": "bool", "str": "str", "dict": "json"}.get(base, "str"), None


def _flag(names: list[str], type_: str, choices, help_node, action: str = "", deprecated: bool = False) -> dict:
    help_ = _help_text(help_node)
    deprecated = deprecated or "Deprecated" in action or help_.lstrip().lower().startswith("deprecated")
    return {"names": names, "type": type_, "choices": [str(c) for c in choices] if choices else None,
            "hidden": _is_suppress(help_node), "deprecated": deprecated, "action": action or None}


def _add_argument_flag(call: ast.Call, names: dict, fallback_type: tuple[str, list | None] = ("str", None)) -> dict:
    """One parser.add_argument(...) call as a flag record."""
    opts = [_help_text(a) for a in call.args if isinstance(a, (ast.Constant, ast.JoinedStr))]
    opts = [o for o in opts if isinstance(o, str) and o]  # f"--{prefix}name": the unprefixed name
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = _help_text(kw.get("action")) or _name(kw.get("action")) if "action" in kw else ""
    choices = literal(kw["choices"], names) if "choices" in kw else fallback_type[1]
    if "store_true" in action or "store_false" in action or "BooleanOptional" in action or action.startswith(
            "DeprecatedStore") or (action == "store_const"):
        type_ = "bool"
    elif "type" in kw:
        type_ = {"int": "int", "float": "float", "str": "str"}.get(_name(kw["type"]), "str")
    else:
        type_ = fallback_type[0]
    dep = kw.get("deprecated")
    return _flag(opts, type_, choices, kw.get("help"), action, isinstance(dep, ast.Constant) and dep.value is True)


# ------------------------------------------------------------------------------------------------------ SGLang

def sglang(pkg: Package) -> dict:
    """SGLang's launch_server flags: the A[T, Arg(...)] fields of arg_groups/fields/*.py (the names
    add_cli_args_from_dataclass derives: --field-name or cli_name, plus aliases; no_cli fields skipped) and the
    flags server_args.py's add_cli_args registers by hand (dynamic choices, deprecated spellings)."""
    names = constants(pkg.tree("sglang/srt/arg_groups/choices.py"))
    flags, sources = {}, ["sglang/srt/arg_groups/choices.py"]
    for path in pkg.under("sglang/srt/arg_groups/fields/"):
        tree = pkg.tree(path)
        local = constants(tree, names)
        sources.append(path)
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for node in cls.body:
                record = _sglang_field(node, local)
                if record:
                    flags[record["names"][0]] = record
    tree = pkg.tree("sglang/srt/server_args.py")
    sources.append("sglang/srt/server_args.py")
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "add_cli_args":
            for call in ast.walk(fn):
                if isinstance(call, ast.Call) and _name(call.func) == "add_argument":
                    record = _add_argument_flag(call, names)
                    if record["names"]:
                        flags[record["names"][0]] = record
    return {"flags": flags, "sources": sources}


def _sglang_field(node: ast.AST, names: dict) -> dict | None:
    """A dataclass field `name: A[T, "help" | Arg(...)] = default` as the flag add_cli_args_from_dataclass adds."""
    if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
        return None
    ann = node.annotation
    if not (isinstance(ann, ast.Subscript) and _name(ann.value) in ("A", "Annotated")
            and isinstance(ann.slice, ast.Tuple)):
        return None
    inner, *meta = ann.slice.elts
    arg = next((m for m in meta if isinstance(m, ast.Call) and _name(m.func) == "Arg"), None)
    help_node = next((m for m in meta if isinstance(m, (ast.Constant, ast.JoinedStr))), None)
    if arg is None and help_node is None:
        return None  # no Arg metadata: registered by hand, if at all
    kw = {k.arg: k.value for k in (arg.keywords if arg else []) if k.arg}
    if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value:
        return None
    cli = _help_text(kw.get("cli_name")) or "--" + node.target.id.replace("_", "-")
    aliases = literal(kw["aliases"], names) if "aliases" in kw else []
    type_, choices = _annotation_type(inner, names)
    if "choices" in kw and literal(kw["choices"], names) is not None:
        choices = literal(kw["choices"], names)
    action = _help_text(kw.get("action")) or _name(kw.get("action")) if "action" in kw else ""
    if action and action not in ("store_true", "store_false"):
        type_ = "bool" if ("Boolean" in action or "StoreTrue" in action) else type_
    if "type_parser" in kw and type_ == "list":
        type_ = "str"
    record = _flag([cli] + list(aliases or []), type_, choices, kw.get("help", help_node), action)
    if "BooleanOptional" in action:
        record["names"].append("--no-" + cli[2:])
    return record


# -------------------------------------------------------------------------------------------------------- vLLM

def vllm(pkg: Package) -> dict:
    """vLLM's `vllm serve` engine flags: the add_argument calls of EngineArgs.add_cli_args (and of the other
    add_cli_args functions in arg_utils.py), with a `**x_kwargs["field"]` flag's type and Literal choices taken from
    the config dataclass field it names (vllm/config/*.py)."""
    src = "vllm/engine/arg_utils.py"
    fields = {}
    for path in pkg.under("vllm/config/"):
        tree = pkg.tree(path)
        local = constants(tree)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in cls.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    fields.setdefault(node.target.id, _annotation_type(node.annotation, local))
    tree = pkg.tree(src)
    names = constants(tree)
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineArgs"):
        for node in cls.body:  # EngineArgs' own field types first: the config fields may share a name
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                fields[node.target.id] = _annotation_type(node.annotation, names)
    flags = _frontend(pkg)
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and _name(call.func) == "add_argument":
            field = next((n.slice.value for k in call.keywords if k.arg is None for n in ast.walk(k.value)
                          if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant)), None)
            record = _add_argument_flag(call, names, fields.get(field, ("str", None)))
            if not record["names"]:
                continue
            if record["type"] == "bool" and record["action"] is None and fields.get(field, ("",))[0] == "bool":
                record["names"].append("--no-" + record["names"][0][2:])  # vLLM's bool fields are BooleanOptional
            flags[record["names"][0]] = record
    return {"flags": flags, "sources": [src, "vllm/config/*.py", FRONTEND]}


FRONTEND = "vllm/entrypoints/openai/cli_args.py"


def _frontend(pkg: Package) -> dict:
    """`vllm serve`'s server flags: make_arg_parser's add_argument calls and the --field-name flags get_kwargs
    derives from the FrontendArgs / BaseFrontendArgs dataclass fields."""
    tree, flags = pkg.tree(FRONTEND), {}
    names = constants(tree)
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("FrontendArgs")):
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                type_, choices = _annotation_type(node.annotation, names)
                cli = "--" + node.target.id.replace("_", "-")
                extra = ["--no-" + cli[2:]] if type_ == "bool" else []
                flags[cli] = _flag([cli] + extra, type_, choices, None)
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and _name(call.func) == "add_argument":
            record = _add_argument_flag(call, names)
            if record["names"] and record["names"][0].startswith("-"):
                flags[record["names"][0]] = record
    return flags


# ------------------------------------------------------------------------------------------------- vLLM-Ascend

def vllm_ascend(pkg: Package) -> dict:
    """vLLM-Ascend's --additional-config keys: `additional_config.get("key")` / `"key" in additional_config` at the
    top level, and `<name>_config.get("key")` inside each sub-config read from `additional_config.get("<name>")`
    (dotted: finegrained_tp_config.oproj_tensor_parallel_size)."""
    keys: set[str] = set()
    sources = ["vllm_ascend/ascend_config.py", "vllm_ascend/utils.py"]
    for path in sources:
        tree = pkg.tree(path)
        subs = {}  # local variable -> sub-config key
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                key = _get_key(node.value, "additional_config")
                if key:
                    subs[node.targets[0].id] = key
        for node in ast.walk(tree):
            key = _get_key(node, "additional_config")
            if key:
                keys.add(key)
            for var, sub in subs.items():
                inner = _get_key(node, var)
                if inner:
                    keys.add(f"{sub}.{inner}")
            if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In) \
                    and isinstance(node.left, ast.Constant) and _name(node.comparators[0]) == "additional_config":
                keys.add(node.left.value)
    return {"additional_config": sorted(keys), "sources": sources}


def _get_key(node: ast.AST, owner: str) -> str:
    """"key" of `owner.get("key", ...)` (owner a name or an attribute named so), else ''."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
            and _name(node.func.value) == owner and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        return node.args[0].value
    return ""


# ------------------------------------------------------------------------------------------------ sglang-router

def sglang_router(pkg: Package) -> dict:
    """The PD router's flags (`python -m sglang_router.launch_router`): the add_argument calls of
    RouterArgs.add_cli_args in sglang_router/router_args.py, unprefixed (use_router_prefix False, as launch_router
    registers them)."""
    src = "sglang_router/router_args.py"
    tree = pkg.tree(src)
    names, flags = constants(tree), {}
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and _name(call.func) == "add_argument":
            record = _add_argument_flag(call, names)
            if record["names"] and record["names"][0].startswith("--"):
                flags[record["names"][0]] = record
    return {"flags": flags, "sources": [src]}


# ---------------------------------------------------------------------------------------------- environment

ENV_FILES = {"sglang": "sglang/srt/environ.py", "vllm": "vllm/envs.py", "vllm_ascend": "vllm_ascend/envs.py"}


def env_names(pkg: Package, path: str) -> list[str]:
    """The environment variables a package reads: the string keys of its env dicts, the names passed to
    os.getenv / os.environ.get, and (SGLang's environ.py) the class attributes bound to Env*(...) declarations."""
    names = set()
    for node in ast.walk(pkg.tree(path)):
        if isinstance(node, ast.Dict):
            names |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        elif isinstance(node, ast.Call) and _name(node.func) in ("getenv", "get") and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            names.add(node.args[0].value)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and _name(node.value.func).startswith("Env"):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return sorted(n for n in names if n.isupper() and n.replace("_", "").isalnum())


# ---------------------------------------------------------------------------------------------------------- main

EXTRACT = {"sglang": sglang, "vllm": vllm, "vllm_ascend": vllm_ascend, "sglang_router": sglang_router}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("wheels", type=Path, help="directory holding the downloaded sglang, vllm and vllm-ascend packages")
    args = p.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    for path in sorted(args.wheels.iterdir()):
        stem = path.name.split("-")
        if not (path.suffix == ".whl" or path.name.endswith(".tar.gz")) or stem[0] not in EXTRACT:
            continue
        name, version = stem[0], stem[1].removesuffix(".tar.gz")
        pkg = Package(path)
        data = EXTRACT[name](pkg)
        if name in ENV_FILES:
            data["env"] = env_names(pkg, ENV_FILES[name])
            data["sources"].append(ENV_FILES[name])
        out = {"framework": name.replace("_", "-"), "version": version, "package": path.name,
               "sha256": pkg.sha256, "extracted_by": "scripts/framework_flags.py", **data}
        target = OUT / f"{out['framework']}-{version}.json"
        target.write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")
        count = len(data.get("flags", data.get("additional_config", [])))
        print(f"{target.relative_to(OUT.parents[2])}: {count} entries from {path.name}", file=sys.stderr)


if __name__ == "__main__":
    main()
