"""Choosing a kernel's tiling by the engine, as a real tuner does: its cost model proposes, the measurement decides.

A kernel's tiler ranks its candidate tilings with an analytic estimate (`Kernel.candidates`: the best first, each
with every tiling option explicit). An estimate is a model of the engine, not the engine: where it misranks two
close tilings, more hardware (a larger L0B, a faster cube) could make it pick one that simulates slower, so a
prediction got slower with more resource (issue 15). The tuner simulates each candidate and keeps the fastest; a tie
keeps the estimate's order, so the choice is deterministic (candidates that build the same trace cost one
simulation: the engine's memo is by content). Each candidate is a valid tiling of the same op (the
functional path can execute any of them); one that the chip refuses is skipped.

Limits: the candidates are the few the estimate ranks best (and, per kernel family, the ones a smaller buffer would
have chosen), not every tiling: the tuner is as good as that shortlist. Results are memoised by content (the
candidate's trace and the chip, npusim.engine.result), so a prediction's repeated ops cost one tuning.

Cost: the bundled default's cold prediction simulates 137 candidates for 68 launches where the estimate alone ran
68 (0.80 s user CPU against 0.54 s, most of the difference the second GEMM candidate of 30 launches). The losers are
close (median 1.5 % slower than the winner), so two cuts that keep the choice exact were measured and not kept:
stopping a candidate's simulation when its clock passes the best time saves 2 % of the events, and skipping a
candidate whose lower bound (its busiest pipe's work, each server's bytes at its bandwidth) reaches the best time
skips 3 of 66 losers (the bound is 0.91 of the time, median).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from npusim.engine.result import KernelResult, simulate
from npusim.errors import NpusimError
from npusim.kernels.base import Kernel
from npusim.kernels.trace import Trace
from npusim.spec.chip import Chip


@dataclass(frozen=True)
class Tuned:
    """The chosen candidate, its trace and its simulated launch; `tried` candidates were simulated."""

    kernel: Kernel
    trace: Trace
    result: KernelResult
    tried: int


def tuned(kernel: Kernel, chip: Chip, launch: str = "eager",
          make: Callable[[Kernel], Trace] | None = None) -> Tuned:
    """The fastest of the kernel's candidate tilings on `chip`, as the engine times it. `make` builds a candidate's
    trace as it runs (default: `trace(chip)`; a step may change buffering or route a fused group through L2)."""
    make = make or (lambda k: k.trace(chip))
    best: Tuned | None = None
    tried = 0
    first_error: NpusimError | None = None
    for cand in kernel.candidates(chip):
        try:
            trace = make(cand)
        except NpusimError as exc:
            first_error = first_error or exc
            continue
        r = simulate(trace, chip, launch=launch)
        tried += 1
        if best is None or r.time < best.result.time:
            best = Tuned(cand, trace, r, 0)
    if best is None:
        if first_error is None:
            raise NpusimError(f"kernel {kernel.name} has no tiling on {chip.name}", field="tiling")
        raise first_error
    return Tuned(best.kernel, best.trace, best.result, tried)
