"""Measured vs predicted per op of a profile: identical launches grouped, each group's kernel simulated once.

Measured is msprof's Task Duration: the device time of one launch (dispatch to the cores, execution, completion),
without the host's launch cost. Predicted is the engine's time of the mapped kernel's tile trace in the `device`
launch mode (`npusim kernel sim ... --launch device`): the trace plus the chip's `overheads.task_dispatch` and
`overheads.core_start` (and `overheads.mix_start` for a MIX kernel), what Task Duration counts beyond the cores'
work, so the two are the same kind of time. A group is the launches of one OP Type that map onto the same kernel and
shape; its measured figure is the median of its launches (robust to a cold first launch), beside their mean and
count. Where the profile carries msprof's pipe
ratios (aic_mac_ratio, aiv_vec_ratio, ... with --aic-metrics PipeUtilization) their mean is shown beside the
engine's busy fraction of the same pipe: a diagnostic of why a time differs, not a fitted quantity.

Limits: launches inside a model step (in-network) run 1.5-4x slower than single-op replays (cold L2, concurrent
communication kernels); the prediction is of a replay. Unmapped ops are listed with their reason and their share
of the profile's device time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd

from npusim.engine import KernelResult
from npusim.engine.tune import tuned
from npusim.errors import NpusimError
from npusim.kernels import catalog
from npusim.profiles.mapping import Mapping, Unmapped, map_launch
from npusim.profiles.msprof import Launch, Profile
from npusim.spec.chip import Chip


@dataclass(frozen=True)
class Op:
    """Launches of one OP Type on one kernel and shape."""

    op_type: str
    mapping: Mapping
    times: tuple[float, ...]  # seconds, one per launch
    ratios: tuple[tuple[str, float], ...]  # measured pipe busy fraction, mean over the launches that record it

    @property
    def measured(self) -> float:
        return statistics.median(self.times)


@dataclass(frozen=True)
class Skipped:
    """Launches npusim cannot time, with why."""

    op_type: str
    reason: str
    times: tuple[float, ...]


def group(profile: Profile, shape: dict[str, str] | None = None, kernel: str | None = None
          ) -> tuple[list[Op], list[Skipped]]:
    """The profile's launches grouped by (OP Type, kernel and shape) or (OP Type, reason), in order of appearance."""
    found: dict[tuple, list[Launch]] = {}
    for launch in profile.launches:
        m = map_launch(launch, shape, kernel)
        found.setdefault((launch.op_type, m), []).append(launch)
    ops, skipped = [], []
    for (op_type, m), launches in found.items():
        times = tuple(x.duration for x in launches)
        if isinstance(m, Unmapped):
            skipped.append(Skipped(op_type, m.reason, times))
        else:
            ops.append(Op(op_type, m, times, _mean_ratios(launches)))
    return ops, _merge(skipped)


def _mean_ratios(launches: list[Launch]) -> tuple[tuple[str, float], ...]:
    acc: dict[str, list[float]] = {}
    for x in launches:
        for pipe, v in x.ratios:
            acc.setdefault(pipe, []).append(v)
    return tuple((p, statistics.fmean(v)) for p, v in acc.items())


def _merge(skipped: list[Skipped]) -> list[Skipped]:
    """One line per (OP Type, reason)."""
    out: dict[tuple[str, str], tuple[float, ...]] = {}
    for s in skipped:
        out[(s.op_type, s.reason)] = out.get((s.op_type, s.reason), ()) + s.times
    return [Skipped(t, r, times) for (t, r), times in out.items()]


def simulate_op(m: Mapping, chip: Chip) -> KernelResult:
    """The mapped kernel's time as msprof's Task Duration counts it (launch mode `device`: no host launch cost);
    NpusimError if it cannot run on the chip."""
    kern = catalog.kernel(m.kernel, {k: v for k, v in m.shape})
    return tuned(kern, chip, "device").result


def predict(ops: list[Op], chip: Chip) -> tuple[list[tuple[Op, KernelResult]], list[Skipped]]:
    """Each op's simulated result; ops whose kernel refuses the shape on this chip become Skipped with the reason."""
    done, refused = [], []
    for op in ops:
        try:
            done.append((op, simulate_op(op.mapping, chip)))
        except NpusimError as exc:
            refused.append(Skipped(op.op_type, f"{op.mapping.kernel} {op.mapping.shape_text}: {exc}", op.times))
    return done, refused


def error(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def op_table(results: list[tuple[Op, KernelResult]]) -> pd.DataFrame:
    rows = []
    for op, r in results:
        busy = {**r.busy, **{f"{n} (shared)": v for n, v in r.servers.items()}}
        rows.append({"op": op.op_type, "kernel": op.mapping.kernel, "shape": op.mapping.shape_text,
                     "launches": len(op.times), "measured_us": op.measured * 1e6,
                     "mean_us": statistics.fmean(op.times) * 1e6, "predicted_us": r.time * 1e6,
                     "error_pct": error(r.time, op.measured), "bound": r.bound, "roofline_us": r.roofline * 1e6,
                     "busy measured/simulated": ", ".join(f"{p} {v:.2f}/{busy.get(p, 0.0):.2f}"
                                                          for p, v in op.ratios if v or busy.get(p)),
                     "note": op.mapping.note})
    return pd.DataFrame(rows, columns=["op", "kernel", "shape", "launches", "measured_us", "mean_us", "predicted_us",
                                       "error_pct", "bound", "roofline_us", "busy measured/simulated", "note"])


def with_fitted(table: pd.DataFrame, times) -> pd.DataFrame:
    """The op table with each op's predicted time after --fit (seconds, in table order) and its error."""
    out = table.copy()
    out["fitted_us"] = [t * 1e6 for t in times]
    out["fitted_error_pct"] = [error(t * 1e6, m) for t, m in zip(times, out["measured_us"])]
    return out


def skipped_table(skipped: list[Skipped]) -> pd.DataFrame:
    rows = [{"op": s.op_type, "launches": len(s.times), "device_us": sum(s.times) * 1e6, "reason": s.reason}
            for s in skipped]
    frame = pd.DataFrame(rows, columns=["op", "launches", "device_us", "reason"])
    return frame.sort_values("device_us", ascending=False, kind="stable").reset_index(drop=True)


def by_kernel(table: pd.DataFrame) -> pd.DataFrame:
    """Median |error| per kernel, before and (with --fit) after."""
    cols = ["error_pct"] + (["fitted_error_pct"] if "fitted_error_pct" in table else [])
    rows = []
    for kernel, g in table.groupby("kernel", sort=True):
        row = {"kernel": kernel, "ops": len(g), "launches": int(g["launches"].sum())}
        for c in cols:
            row[f"median |{c}|"] = statistics.median(g[c].abs())
        rows.append(row)
    return pd.DataFrame(rows)
