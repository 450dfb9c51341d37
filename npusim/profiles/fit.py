"""Fitting a chip's named efficiency parameters to a profile, written as an overlay chip file.

Parameters: the ratios under the chip file's `efficiency:` and the times under its `overheads:` (npusim.spec.chip)
that the profile's mapped kernels read -- found by perturbing each and keeping those that move at least one op's
simulated time, ranked by how much they move them. A parameter is fitted only where the profile's rows constrain
it: at least `MIN_ROWS` distinct ops whose time it binds (`BOUND_SHARE`: the op's time moves at least half as much as
an op bound by it alone would), and an effect on the rows not that of a parameter already chosen (`COLLINEAR`: two
parameters that move the same rows in the same proportions, as cube and L2 efficiency on large GEMMs, cannot be told
apart by them). One LayerNorm shape bound by HBM does not make an HBM efficiency: a mechanism npusim lacks explains
one row as well. The three most influential constrained parameters are fitted, unless the user names the fields
(--params), which are refused, with the reason, when the rows do not constrain them. Each fitted value names the
rows it rests on.

Objective: the mean, over the profile's distinct ops (one kernel and shape each, so a thousand identical small
launches do not outweigh one large GEMM), of |log(predicted / measured)| (measured: the median of the op's
launches; predicted without launch cost, as `compare` explains). An absolute, not a squared, error: one op that
npusim models badly cannot drag a parameter shared by every other op away from where they agree.

Method: bounded coordinate search. Each parameter in turn, the most influential first: a coarse grid over its
bounds (ratios in [0.05, 1]; times in [0, max(10x the chip's value, 100 us)], geometric), then golden-section
search inside the best grid cell; a second pass, in the grid cells either side of each value, follows when the
first gained more than 1e-3. It needs no
derivatives, so the tilers' discrete choices (a tile size that changes with a rate) cannot derail it, and a
parameter never leaves its physical range.

The overlay `inherits:` the shipped chip and holds only the fitted numbers, each with
`source: fitted to <profile>, <n> ops`; the figures reported after the fit are recomputed from that file. Limits:
the fitted values describe these kernels on this chip as profiled (replays, not in-network launches); they are the
user's calibration, not the project's (the shipped chips are fitted only on shared/reference rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from npusim.errors import NpusimError
from npusim.profiles.compare import Op, simulate_op
from npusim.spec import units
from npusim.spec.chip import Chip, load_chip
from npusim.spec.schema import leaves

GOLDEN = (math.sqrt(5) - 1) / 2
RATIO_LOW = 0.05
TIME_HIGH = 100e-6
GRID = 9
GOLDEN_STEPS = 10
PASSES = 2
GAIN = 1e-3
BOUND_SHARE = 0.5  # a row binds a parameter when its time moves >= half as much as a row bound by it alone
MIN_ROWS = 2  # distinct ops a parameter must bind to be fitted: one row cannot tell an efficiency from a mechanism
COLLINEAR = 0.95  # cosine of two parameters' effects on the rows above which the rows cannot tell them apart


@dataclass(frozen=True)
class Parameter:
    path: str  # dotted field of the chip file, e.g. efficiency.cube
    dim: str  # "number" (a ratio) or "time"
    value: float  # the chip's
    low: float
    high: float
    influence: float = 0.0  # sum over ops of |log time change| when perturbed
    shares: tuple[float, ...] = ()  # per op: its |log time change| over that of an op bound by this parameter alone

    def text(self, v: float, digits: int = 6) -> str:
        return units.format(v, self.dim, digits) if self.dim == "time" else f"{v:.{digits}g}"

    def perturbed(self) -> float:
        """The value the influence is measured at: a ratio 20 % lower, a time doubled (plus 1 us)."""
        return self.value * 0.8 if self.dim == "number" else self.value * 2 + 1e-6

    def rows(self) -> tuple[int, ...]:
        """The ops (indices) whose time this parameter binds (`BOUND_SHARE`)."""
        return tuple(i for i, s in enumerate(self.shares) if s >= BOUND_SHARE)

    def grid(self) -> list[float]:
        if self.dim == "time":
            return [0.0] + [self.high * 2.0 ** -i for i in range(GRID - 2, -1, -1)]
        return list(np.linspace(self.low, self.high, GRID))


@dataclass(frozen=True)
class Fit:
    params: tuple[tuple[Parameter, float], ...]  # (parameter, fitted value)
    loss_before: float
    loss_after: float
    rests_on: tuple[tuple[str, ...], ...] = ()  # per fitted parameter: the rows (op and shape) that constrain it
    refused: tuple[str, ...] = ()  # parameters that move the ops but that the rows do not constrain, with why

    def warnings(self) -> list[str]:
        """Fitted values that compensate for something other than an efficiency: at a bound, or moved > 1.5x (a
        time: and by more than 1 us)."""
        out = []
        for p, v in self.params:
            at_bound = v <= p.low + 1e-9 or v >= p.high * (1 - 1e-6)
            moved = max(v, p.value) > 1.5 * min(v, p.value) + (1e-6 if p.dim == "time" else 0.0)
            if at_bound or moved:
                out.append(f"{p.path} went from {p.text(p.value, 4)} to {p.text(v, 4)}"
                           f"{' (its bound)' if at_bound else ''}: more than an efficiency explains, so these "
                           f"kernels likely differ from npusim's by a mechanism (a floor, a gather, a tiling); "
                           f"compare the pipe ratios")
        return out


def candidates(chip: Chip) -> list[Parameter]:
    """Every efficiency ratio and overhead time of the chip, with its bounds."""
    out = []
    for path, value, meta in leaves(chip):
        if path.startswith("efficiency.") and meta.get("kind") == "ratio":
            out.append(Parameter(path, "number", float(value), RATIO_LOW, 1.0))
        elif path.startswith("overheads.") and meta.get("kind") == "quantity" and meta.get("dim") == "time":
            out.append(Parameter(path, "time", float(value), 0.0, max(10 * float(value), TIME_HIGH)))
    return out


class Problem:
    """The chip's predicted times of the profile's ops as a function of parameter values (memoised)."""

    def __init__(self, hw: str, ops: list[Op]):
        self.hw, self.ops = hw, ops
        self.measured = np.array([op.measured for op in ops])
        self._memo: dict[tuple, np.ndarray] = {}

    def times(self, values: dict[Parameter, float]) -> np.ndarray:
        key = tuple(sorted((p.path, p.text(v)) for p, v in values.items()))
        if key not in self._memo:
            chip = load_chip(self.hw, {p.path: p.text(v) for p, v in values.items()})
            self._memo[key] = self.times_on(chip)
        return self._memo[key]

    def times_on(self, chip: Chip) -> np.ndarray:
        try:
            return np.array([simulate_op(op.mapping, chip).time for op in self.ops])
        except NpusimError:
            return np.full(len(self.ops), np.inf)  # a value at which some kernel cannot run: never the optimum

    def loss(self, times: np.ndarray) -> float:
        if not np.all(np.isfinite(times)):
            return math.inf
        return float(np.mean(np.abs(np.log(times / self.measured))))


def influential(problem: Problem, params: list[Parameter]) -> list[Parameter]:
    """The parameters that move some op's time, most influential first."""
    base = problem.times({})
    out = []
    for p in params:
        t = problem.times({p: p.perturbed()})
        change = np.abs(np.log(t / base)) if np.all(np.isfinite(t)) else np.zeros(len(base))
        alone = abs(math.log(p.perturbed() / p.value)) if p.value > 0 else math.inf  # an op bound by p alone
        if change.sum() > 1e-6:
            out.append(Parameter(p.path, p.dim, p.value, p.low, p.high, float(change.sum()),
                                 tuple(float(c / alone) for c in change)))
    return sorted(out, key=lambda p: -p.influence)


def constrained(params: list[Parameter], labels: list[str]) -> tuple[list[Parameter], list[str]]:
    """The parameters (most influential first) that the rows constrain, and why each other one is not: it binds
    fewer than `MIN_ROWS` ops, or it moves the rows as a parameter already kept does (`COLLINEAR`)."""
    kept, refused = [], []
    for p in params:
        rows = p.rows()
        twin = next((k for k in kept if _cosine(k.shares, p.shares) >= COLLINEAR), None)
        if len(rows) < MIN_ROWS:
            on = "; ".join(labels[i] for i in rows) or "no row"
            refused.append(f"{p.path}: binds {len(rows)} row(s) of the profile ({on}), fewer than the {MIN_ROWS} a "
                           "fit needs to tell an efficiency from a mechanism npusim lacks")
        elif twin is not None:
            refused.append(f"{p.path}: moves the same rows in the same proportions as {twin.path}, so they cannot "
                           "tell the two apart")
        else:
            kept.append(p)
    return kept, refused


def _cosine(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    x, y = np.array(a), np.array(b)
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y) / norm if norm else 0.0


def fit(problem: Problem, chip: Chip, only: list[str] | None = None, labels: list[str] | None = None) -> Fit:
    """Fit the `only` fields (refused when the rows do not constrain one), or the three most influential that the
    rows constrain. `labels`: each op's name in the messages (default: its index)."""
    params = candidates(chip)
    if only:
        known = {p.path for p in params}
        for name in only:
            if name not in known:
                raise NpusimError(f"--params '{name}' is not a fittable field of {chip.name}; allowed: "
                                  f"{', '.join(sorted(known))}", field="--params")
        params = [p for p in params if p.path in only]
    chosen = influential(problem, params)
    if not chosen:
        raise NpusimError(f"none of {', '.join(p.path for p in params)} changes the simulated time of the "
                          f"profile's ops: nothing to fit")
    labels = labels or [f"row {i + 1}" for i in range(len(problem.measured))]
    chosen, refused = constrained(chosen, labels)
    if only and refused:
        raise NpusimError(refused[0], field="--params")
    if not chosen:
        raise NpusimError("the profile's rows constrain no parameter, so there is nothing to fit: "
                          + "; ".join(refused), field="--fit")
    chosen = chosen if only else chosen[:3]
    values = {p: p.value for p in chosen}
    before = best = problem.loss(problem.times(values))
    for n in range(PASSES):
        start = best
        for p in chosen:
            values[p], best = _line(problem, values, p, best, coarse=n == 0)
        if start - best < GAIN:
            break
    return Fit(tuple((p, values[p]) for p in chosen), before, best,
               tuple(tuple(labels[i] for i in p.rows()) for p in chosen), tuple(refused))


def _line(problem: Problem, values: dict, p: Parameter, best: float, coarse: bool) -> tuple[float, float]:
    """The best value of one parameter, the others held: golden section in the best cell of a grid over its
    bounds (coarse), or in the grid cells either side of its value (later passes)."""
    def f(v: float) -> float:
        return problem.loss(problem.times({**values, p: v}))

    grid = p.grid()
    if coarse:
        grid = sorted(set(grid) | {values[p]})
        scores = [f(v) for v in grid]
        i = int(np.argmin(scores))
        x, fx = grid[i], scores[i]
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    else:
        x, fx = values[p], best
        j = int(np.searchsorted(grid, x))
        lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
    a, b = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(GOLDEN_STEPS):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - GOLDEN * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + GOLDEN * (hi - lo)
            fb = f(b)
    for v, fv in ((a, fa), (b, fb)):
        if fv < fx:
            x, fx = v, fv
    return (x, fx) if fx < best else (values[p], best)


def write_overlay(result: Fit, chip: Chip, profile: str, ops: list[Op], out: str | Path) -> Path:
    """The overlay chip file: `inherits:` the shipped chip, the fitted numbers with their source."""
    out = Path(out)
    kinds = sorted({op.mapping.kernel for op in ops})
    launches = sum(len(op.times) for op in ops)
    source = (f"fitted to {profile}, {launches} ops ({len(ops)} distinct shapes of {', '.join(kinds)}; "
              f"npusim profile --fit, bounded coordinate search)")
    tree: dict = {}
    for p, v in result.params:
        node = tree
        *parents, leaf = p.path.split(".")
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = {"value": float(p.text(v, 4)) if p.dim == "number" else p.text(v, 4), "source": source}
    head = (f"# Chip overlay written by `npusim profile {profile} --fit`: {chip.name} with the efficiency parameters "
            f"that its\n# mapped kernels read fitted to that profile. Use it as --hw {out}.\n")
    body = {"inherits": chip.name, "description": f"{chip.description} -- fitted to {profile}", **tree}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(head + yaml.safe_dump(body, sort_keys=False, width=200))
    return out


@dataclass(frozen=True)
class Calibration:
    fit: Fit
    path: Path  # the overlay written
    times: np.ndarray  # each op's predicted time on the chip as written (rounding included)


def calibrate(hw: str, ops: list[Op], profile: str, out: str | Path, only: list[str] | None = None) -> Calibration:
    """Fit `hw` (a shipped chip) to the ops, write the overlay, and time the ops again on the file written."""
    chip = load_chip(hw)
    problem = Problem(hw, ops)
    result = fit(problem, chip, only, [f"{op.op_type} {op.mapping.shape_text}" for op in ops])
    path = write_overlay(result, chip, profile, ops, out)
    return Calibration(result, path, problem.times_on(load_chip(str(path))))
