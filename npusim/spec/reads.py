"""Memoising a function of a spec by exactly the fields it reads.

A kernel's tiling reads a handful of a chip's fields (core counts, buffer sizes, a few rates for its estimates), so
its trace is the same on chips that differ elsewhere: a sweep over HBM bandwidth builds each tile trace once, not
once per bandwidth. `ReadsMemo` runs the function on a view of the spec that logs every field handed out (a nested
spec is viewed in turn, a method runs on the view so that its own reads are logged, anything else — a number, a
text, a rate table — is logged whole), and reuses a result for another spec only when every logged field has the
same type and value there. The key is therefore the values the function saw, never an object's identity, and a
field the function never read cannot make it stale.

Limits: the function must depend on the spec only through attribute reads (no `repr`, hashing or `is` of the spec
itself: the view is not the spec), must not keep the view in its result, and must be deterministic given the key
arguments and those reads.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections import OrderedDict
from typing import Any, Callable, Hashable

_MISSING = object()


class Reads:
    """A read-only view of a spec object that logs each field it hands out (dotted path -> value)."""

    __slots__ = ("_target", "_path", "_log")

    def __init__(self, target: Any, path: str = "", log: dict | None = None):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_log", {} if log is None else log)

    def __getattr__(self, name: str):
        target = object.__getattribute__(self, "_target")
        value = getattr(target, name)
        path = f"{self._path}.{name}" if self._path else name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return view(value, path, self._log)
        if inspect.ismethod(value) and value.__self__ is target:
            return getattr(type(target), name).__get__(self)  # the method's reads of its spec are logged too
        self._log[path] = value
        return value

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"a spec view is read-only ({name})")


_VIEW_TYPES: dict[type, type] = {}


def view(target: Any, path: str = "", log: dict | None = None) -> Reads:
    """A Reads view of a dataclass instance that passes for one: `isinstance` and `dataclasses.replace` see the
    target's class (a tiling may derive a smaller buffer set with replace; every field it copies is logged)."""
    cls = type(target)
    kind = _VIEW_TYPES.get(cls)
    if kind is None:
        namespace = {"__slots__": (), "__dataclass_fields__": cls.__dataclass_fields__,
                     "__class__": property(lambda self: cls)}
        kind = type(f"Reads[{cls.__name__}]", (Reads,), namespace)
        _VIEW_TYPES[cls] = kind
    return kind(target, path, log)


def resolve(spec: Any, path: str):
    """The value at a dotted path of `spec` (properties evaluated), or _MISSING."""
    node = spec
    for part in path.split("."):
        node = getattr(node, part, _MISSING)
        if node is _MISSING:
            return _MISSING
    return node


def same(a, b) -> bool:
    """Equal and of the same type (1 and 1.0 can build different traces)."""
    return type(a) is type(b) and a == b


class ReadsMemo:
    """f(key, spec) memoised by `key` and the values of the spec fields f read; at most `size` keys kept."""

    def __init__(self, size: int = 4096):
        self.size = size
        self._entries: OrderedDict[Hashable, list[tuple[tuple[tuple[str, Any], ...], Any]]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: Hashable, spec: Any, compute: Callable[[Reads], Any]):
        entries = self._entries.get(key)
        if entries is not None:
            self._entries.move_to_end(key)
            for reads, value in entries:
                if all(same(resolve(spec, path), seen) for path, seen in reads):
                    self.hits += 1
                    return value
        self.misses += 1
        seen = view(spec)
        value = compute(seen)
        self._entries.setdefault(key, []).append((tuple(object.__getattribute__(seen, "_log").items()), value))
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        self._entries.clear()
