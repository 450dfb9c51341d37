"""A sweep file: the base scenario and the points to predict, as a grid (every combination) and/or a list.

    name: v32-batch
    base: {hw: cloudmatrix384, model: deepseek-v3.2-exp, plan: v32-a3-pd-a17, input: 8192, output: 1024, batch: 64}
    grid: {batch: [16, 64, 256], hbm.bandwidth: [1.6TB/s, 3.2TB/s]}
    list: [{hw: atlas-800-a3}, {hw: cloudmatrix384, plan.decode.moe.ep: 64}]

Scenario keys go to predict's arguments; any other dotted key is an override (plan.*, model.*, else hardware),
exactly as `--set`. With both grid and list, every list entry is combined with every grid combination.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from npusim.api import DEFAULT
from npusim.errors import NpusimError, as_written, option
from npusim.spec.schema import read_yaml, setting

SCENARIO_KEYS = ("hw", "model", "plan", "input", "output", "batch", "prefill_batch", "context", "quant")
INT_KEYS = ("input", "output", "batch", "prefill_batch", "context")


@dataclass(frozen=True)
class Point:
    """One prediction to make: predict's arguments and the overrides, both as plain values."""

    args: tuple[tuple[str, object], ...]
    overrides: tuple[tuple[str, str], ...]
    file: str = ""  # the sweep file, and where in it each argument was written (a refusal names them)
    written: tuple[tuple[str, str], ...] = ()

    def named(self, exc: NpusimError) -> NpusimError:
        """A refusal of one of predict's arguments named as the sweep file wrote it (`grid.input`, not `--input`)."""
        return as_written(exc, {option(k): {"file": self.file, "field": w} for k, w in self.written})

    def params(self) -> dict:
        return {**dict(self.args), **dict(self.overrides)}


@dataclass(frozen=True)
class SweepSpec:
    name: str
    base: dict = field(default_factory=dict)
    grid: dict = field(default_factory=dict)
    points: list = field(default_factory=list)
    file: str = "sweep"

    @classmethod
    def load(cls, path: str | Path) -> SweepSpec:
        path = Path(path)
        if not path.exists():
            raise NpusimError("no such sweep file", file=str(path))
        data = read_yaml(path, str(path))
        unknown = set(data) - {"name", "description", "base", "grid", "list"}
        if unknown:
            raise NpusimError(f"unknown key '{sorted(unknown)[0]}' (allowed: name, description, base, grid, list)",
                              file=str(path), field=sorted(unknown)[0])
        return cls(str(data.get("name", path.stem)), data.get("base") or {}, data.get("grid") or {},
                   data.get("list") or [], str(path))

    def expand(self) -> list[Point]:
        """Every point, in a fixed order: list entries outer, grid combinations inner (last key fastest)."""
        if not isinstance(self.base, dict):
            raise NpusimError("must be a mapping of field: value", file=self.file, field="base")
        if not isinstance(self.grid, dict) or any(not isinstance(v, list) or not v for v in self.grid.values()):
            raise NpusimError("must map each field to a non-empty list of values", file=self.file, field="grid")
        if not isinstance(self.points, list) or any(not isinstance(p, dict) for p in self.points):
            raise NpusimError("must be a list of mappings of field: value", file=self.file, field="list")
        keys = list(self.grid)
        combos = [{k: (v, f"grid.{k}") for k, v in zip(keys, vals)} for vals in itertools.product(*self.grid.values())]
        base = {k: (v, f"base.{k}") for k, v in self.base.items()}
        entries = [{k: (v, f"list[{i}].{k}") for k, v in e.items()} for i, e in enumerate(self.points)] or [{}]
        return [self._point({**base, **entry, **combo}) for entry in entries for combo in combos]

    def _point(self, values: dict) -> Point:
        """One point from (value, the field that wrote it) per key; a value of the wrong type is refused by name."""
        args = {k: DEFAULT.get(k) for k in SCENARIO_KEYS if k in DEFAULT}
        over, names = {}, {}
        for key, (value, written) in values.items():
            key = str(key)
            names[key] = written
            if key in INT_KEYS:
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                    raise NpusimError(f"must be a positive whole number, got {value!r}", file=self.file, field=written)
                args[key] = value
            elif key in SCENARIO_KEYS:
                if not isinstance(value, str) or not value:
                    raise NpusimError(f"must be a name, got {value!r}", file=self.file, field=written)
                args[key] = value
            elif value is None or isinstance(value, (dict, list)):
                raise NpusimError(f"must be a single value, got {value!r}", file=self.file, field=written)
            else:
                over[key] = setting(str(value), self.file, written)
        return Point(tuple(sorted(args.items(), key=lambda kv: SCENARIO_KEYS.index(kv[0]))),
                     tuple(sorted(over.items())), self.file,
                     tuple((k, w) for k, w in names.items() if k in SCENARIO_KEYS))
