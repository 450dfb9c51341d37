"""Typed spec objects from YAML: unit parsing, sources kept per field, inheritance, dotted overrides, clear errors.

A spec class is a frozen dataclass whose fields declare what they hold with `quantity(dim)`, `count()`, `ratio()`,
`text()`, `shape()`. A YAML leaf is either `{value: X, source: "..."}` or a bare value that takes the `source:` of
the nearest enclosing mapping. Every numeric leaf must end up with a source; the loader keeps them by dotted path.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import types
import typing
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from npusim.errors import NpusimError, did_you_mean
from npusim.spec import units

# ----------------------------------------------------------------------------------------------- field markers


def quantity(dim: str, *, default=MISSING, minimum: float = 0.0, strict: bool = True, doc: str = ""):
    """A float in SI base units of `dim`; must be > minimum (>= when strict is False)."""
    return field(default=default, metadata={"kind": "quantity", "dim": dim, "min": minimum, "strict": strict, "doc": doc})


def internal(*, default=None):
    """Set by the loader, not by YAML (e.g. the sources of a loaded spec)."""
    return field(default=default, compare=False, repr=False, metadata={"internal": True})


def count(*, default=MISSING, minimum: int = 1, doc: str = ""):
    return field(default=default, metadata={"kind": "count", "min": minimum, "doc": doc})


def counts(*, default=MISSING, minimum: int = 0, doc: str = ""):
    """A list of whole numbers, e.g. a per-layer setting such as compress_ratios; built as a tuple."""
    return field(default=default, metadata={"kind": "counts", "min": minimum, "doc": doc})


def flag(*, default=MISSING, doc: str = ""):
    """An on/off switch (YAML true/false)."""
    return field(default=default, metadata={"kind": "flag", "doc": doc})


def ratio(*, default=MISSING, doc: str = ""):
    """A fraction in (0, 1]: efficiencies and acceptance rates."""
    return field(default=default, metadata={"kind": "ratio", "doc": doc})


def text(*, default=MISSING, choices: tuple[str, ...] | None = None, doc: str = ""):
    return field(default=default, metadata={"kind": "text", "choices": choices, "doc": doc})


def shape(*, default=MISSING, doc: str = ""):
    """An M x K x N fractal such as '16x16x16' or [16, 16, 16]."""
    return field(default=default, metadata={"kind": "shape", "doc": doc})


def table(kind_field, *, keys: tuple[str, ...] | None = None, default=MISSING, doc: str = ""):
    """A mapping name -> leaf (e.g. FLOP/cycle per dtype); `kind_field` is one of the markers above, used as a template."""
    meta = dict(kind_field.metadata)
    meta.update({"table": True, "keys": keys, "doc": doc})
    return field(default_factory=dict if default is MISSING else (lambda: dict(default)), metadata=meta)


# ----------------------------------------------------------------------------------------------- raw YAML handling

LEAF_KEYS = {"value", "source"}


@dataclass
class Leaf:
    """One value as written, with its source and the file that wrote it."""

    value: Any
    source: str | None
    file: str
    field: str | None = None  # the user's name for it where that is not its spec path (an override)


def _is_leaf_mapping(node) -> bool:
    return isinstance(node, dict) and "value" in node and set(node) <= LEAF_KEYS


def normalise(node, file: str, source: str | None = None):
    """Turn every scalar (or list) into a Leaf carrying its source; drop section-level `source:` keys."""
    if _is_leaf_mapping(node):
        src = node.get("source", source)
        return Leaf(node["value"], str(src) if src is not None else None, file)
    if isinstance(node, dict):
        src = node.get("source", source)
        return {str(k): normalise(v, file, src) for k, v in node.items() if k != "source"}
    return Leaf(node, source, file)


def merge(base, over):
    """Child file over parent: mappings merge key by key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(base[k], v) if k in base else v
        return out
    return over


# libyaml's scanner and parser under PyYAML's own safe constructor: the same objects as yaml.SafeLoader for every
# shipped spec, ~10x faster (a warm prediction reads chip, system, model and plan files); SafeLoader without libyaml.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=256)
def _parse_yaml(text_: str):
    """Parsing dominates a warm prediction (every predict reads chip, system, model and plan files), so a sweep or
    a plan search parses each distinct file text once per process. Text libyaml refuses is parsed again by the pure
    Python loader, whose error (problem and line) is the one a user is shown, whichever loader is installed."""
    try:
        return yaml.load(str.__str__(text_), Loader=_FAST_LOADER)  # libyaml takes a plain str, not a Setting
    except yaml.YAMLError:
        return yaml.load(text_, Loader=yaml.SafeLoader)


def read_text(path: Path, display: str) -> str:
    """A file's text, refused in one sentence when it cannot be read or is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise NpusimError(f"cannot read the file ({exc.strerror or exc})", file=display) from None
    except UnicodeDecodeError as exc:
        raise NpusimError(f"is not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x})", file=display) from None


def parse_yaml(text_: str, display: str, field: str | None = None):
    """YAML text parsed, or one sentence naming where it is not YAML (or is nested too deeply to be a spec)."""
    try:
        return copy.deepcopy(_parse_yaml(text_))  # callers edit the tree; the parse is memoised by content
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark and field is None else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise NpusimError(f"is not valid YAML{where}: {problem}", file=display, field=field) from None
    except RecursionError:
        raise NpusimError("is nested too deeply to be read", file=display, field=field) from None


def read_yaml(path: Path, display: str) -> dict:
    data = parse_yaml(read_text(path, display), display)
    if not isinstance(data, dict):
        raise NpusimError("must be a YAML mapping of fields at the top level", file=display)
    return data


def read_json(path: Path, display: str):
    """A JSON file parsed (NaN and Infinity are kept for the caller's checks to refuse by field)."""
    text_ = read_text(path, display)
    try:
        return json.loads(text_)
    except json.JSONDecodeError as exc:
        raise NpusimError(f"is not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", file=display) from None
    except RecursionError:
        raise NpusimError("is nested too deeply to be read", file=display) from None


class Setting(str):
    """An override's text that remembers where the user wrote it — a scenario, baseline or sweep file, or '--set' —
    and under which name, so an error in its value names that file and field. Otherwise a plain str."""

    file: str
    field: str

    def __new__(cls, value: str, file: str = "--set", field: str = ""):
        obj = super().__new__(cls, value)
        obj.file, obj.field = file, field
        return obj


def setting(value, file: str, field: str) -> Setting:
    """An override written in `file` under `field`; a value that already is a Setting keeps its origin."""
    return value if isinstance(value, Setting) else Setting(str(value), file, field)


def set_path(tree: dict, dotted: str, raw_value, origin: str, field: str | None = None) -> None:
    """Apply an override 'a.b.c' = value (YAML text, parsed later by the field's unit) to a normalised tree.
    `origin` is where the user wrote it (a file, or '--set'), `field` their name for it, which errors repeat."""
    field = field or dotted
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.get(p)
        if not isinstance(nxt, dict):
            nxt = {}
            node[p] = nxt
        node = nxt
    value = parse_yaml(raw_value, origin, field) if isinstance(raw_value, str) else raw_value
    node[parts[-1]] = Leaf(value, f"override: {origin} {field}", origin, field)


# ----------------------------------------------------------------------------------------------- building objects


@dataclass
class BuildContext:
    """Where each built field came from; errors name the file that wrote the offending value."""

    default_file: str
    require_sources: bool = True
    sources: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    written: dict[str, str] = field(default_factory=dict)  # spec path -> the user's name of an override

    def fail(self, path: str, message: str, file: str | None = None, node=None) -> typing.NoReturn:
        """Refuse field `path`; `node` (the tree under it), when an override wrote it, names it as the user did."""
        name = self.written.get(path) or _written_name(node, path)
        raise NpusimError(message, file=file or self.files.get(path, self.default_file), field=name or path)


def _written_name(node, path: str) -> str | None:
    """The user's name of `path` when an override wrote the tree `node` under it: a leaf's name minus its subpath."""
    if isinstance(node, Leaf):
        return node.field
    if isinstance(node, dict):
        for key, child in node.items():
            name = _written_name(child, f"{path}.{key}")
            if name:
                return name[: len(name) - len(key) - 1] if name.endswith("." + key) else name
    return None


def _first_file(node, fallback: str) -> str:
    if isinstance(node, Leaf):
        return node.file
    if isinstance(node, dict):
        for v in node.values():
            return _first_file(v, fallback)
    return fallback


def build(cls, node: dict, ctx: BuildContext, prefix: str = ""):
    """Build dataclass `cls` from a normalised tree, checking every field."""
    if not isinstance(node, dict):
        ctx.fail(prefix.rstrip("."), f"must be a mapping of fields ({', '.join(f.name for f in dataclasses.fields(cls))})",
                 _first_file(node, ctx.default_file), node)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")}
    for key in node:
        if key not in names:
            ctx.fail(prefix + key, f"is not a known field of {cls.__name__}" + did_you_mean(key, names),
                     _first_file(node[key], ctx.default_file), node[key])
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in names:
            continue
        path = prefix + f.name
        if f.name not in node:
            if f.default is MISSING and f.default_factory is MISSING:
                ctx.fail(path, "is missing", _first_file(node, ctx.default_file))
            continue
        kwargs[f.name] = _build_value(hints[f.name], f.metadata, node[f.name], ctx, path)
    return cls(**kwargs)


def _unwrap_optional(tp):
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _build_value(tp, meta, node, ctx: BuildContext, path: str):
    optional = _unwrap_optional(tp) is not tp
    tp = _unwrap_optional(tp)
    if optional and isinstance(node, Leaf) and node.value is None:
        ctx.files[path] = node.file
        return None
    if dataclasses.is_dataclass(tp):
        return build(tp, node, ctx, path + ".")
    origin = typing.get_origin(tp)
    if origin is dict and not meta.get("table"):
        _, item = typing.get_args(tp)
        if not isinstance(node, dict):
            ctx.fail(path, "must be a mapping of named entries", _first_file(node, ctx.default_file), node)
        return {k: _build_value(item, {}, v, ctx, f"{path}.{k}") for k, v in node.items()}
    if meta.get("table"):
        if not isinstance(node, dict):
            ctx.fail(path, "must be a mapping (name: value)", _first_file(node, ctx.default_file), node)
        keys = meta.get("keys")
        out = {}
        for k, v in node.items():
            if keys and k not in keys:
                ctx.fail(f"{path}.{k}", "is not an allowed key" + did_you_mean(k, keys), _first_file(v, ctx.default_file), v)
            out[k] = _leaf(meta, v, ctx, f"{path}.{k}")
        return out
    return _leaf(meta, node, ctx, path)


def _leaf(meta, node, ctx: BuildContext, path: str):
    if not isinstance(node, Leaf):
        ctx.fail(path, "must be a single value, not a mapping", _first_file(node, ctx.default_file), node)
    ctx.files[path] = node.file
    if node.field:
        ctx.written[path] = node.field
    kind = meta.get("kind", "text")
    value = node.value
    if kind not in ("text", "flag") and ctx.require_sources:
        if not node.source:
            ctx.fail(path, "has no source: give {value: ..., source: \"<document row>\"} or \"estimate: <reason>\"",
                     node.file)
    if node.source:
        ctx.sources[path] = node.source
    try:
        if kind == "quantity":
            x = units.parse(value, meta["dim"])
            lo = meta["min"]
            if (x <= lo) if meta["strict"] else (x < lo):
                raise units.UnitError(f"must be {'>' if meta['strict'] else '>='} {lo:g}, got '{value}'")
            return x
        if kind == "count":
            if isinstance(value, bool) or not isinstance(value, int):
                raise units.UnitError(f"must be a whole number, got '{value}'")
            if value < meta["min"]:
                raise units.UnitError(f"must be >= {meta['min']}, got {value}")
            return value
        if kind == "counts":
            if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
                raise units.UnitError(f"must be a list of whole numbers, got '{value}'")
            if any(v < meta["min"] for v in value):
                raise units.UnitError(f"must hold numbers >= {meta['min']}, got {value}")
            return tuple(value)
        if kind == "ratio":
            x = units.parse(value, "number")
            if not 0.0 < x <= 1.0:
                raise units.UnitError(f"must be a fraction in (0, 1], got '{value}'")
            return x
        if kind == "flag":
            if not isinstance(value, bool):
                raise units.UnitError(f"must be true or false, got '{value}'")
            return value
        if kind == "shape":
            dims = [int(v) for v in (value.lower().split("x") if isinstance(value, str) else value)]
            if len(dims) != 3 or min(dims) <= 0:
                raise ValueError
            return tuple(dims)
        choices = meta.get("choices")
        if value is None or not isinstance(value, (str, int, float)):
            raise units.UnitError(f"must be text, got '{value}'")
        if choices and value not in choices:
            raise units.UnitError(f"'{value}' is not allowed" + did_you_mean(str(value), choices))
        return str(value)
    except units.UnitError as exc:
        ctx.fail(path, str(exc), node.file)
    except (ValueError, TypeError, AttributeError):
        ctx.fail(path, f"must be a shape such as 16x16x16, got '{value}'", node.file)


def describe(cls, prefix: str = "") -> dict[str, dict]:
    """Every leaf field of a spec class by dotted path, with its marker metadata (for docs and `--set` help)."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = _unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            out.update(describe(tp, f"{prefix}{f.name}."))
        elif f.init and not f.metadata.get("internal"):
            out[prefix + f.name] = dict(f.metadata)
    return out


def leaves(obj, prefix: str = "", meta: dict | None = None):
    """(dotted path, value, field metadata) of every leaf of a built spec, in declaration order."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if f.metadata.get("internal"):
                continue
            yield from leaves(getattr(obj, f.name), f"{prefix}{f.name}.", dict(f.metadata))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, f"{prefix}{k}.", meta)
    elif obj is not None:
        yield prefix.rstrip("."), obj, meta or {}
