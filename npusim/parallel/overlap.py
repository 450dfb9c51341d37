"""Fused GEMM + all-reduce: the output blocks reduce-scattered while the GEMM still runs, the all-gather after them
(pto-isa kernels/manual/a2a3/gemm_ar and a5/gemm_ar; the shape of CANN's MC2 MatmulAllReduce).

Model
-----
* The GEMM is the engine's tile trace of npusim.kernels.gemm on one rank's chip, on the AI cores. Each output block
  is ready when its FIXPIPE store to GM ends (npusim.engine.completions), as pto-isa's compute kernel enqueues a
  block's index after its TSTORE.
* The communication kernel runs beside it on the vector cores of the same chip (pto-isa: 24 AIVs on their own
  stream, one ready queue per AIC). Reduce-scatter phase: it takes the blocks in the order they are ready and sends
  each to the rank that owns it (a remote atomic add); the link is one server, so a block of b bytes holds it for
  b / C of the reduce-scatter of the whole output C, npusim.parallel.collectives' time on the system.
* After the last block has been sent and a cross-rank barrier, the all-gather phase broadcasts each rank's reduced
  blocks to the others: the all-gather of C, exposed after the GEMM.
* The schedule runs on npusim.engine.streams, so what the reduce-scatter hides behind the GEMM is computed from the
  block times, not taken as a max.

Limits: the communication kernel's GM reads do not slow the GEMM (pto-isa measured no loss with 24 AIVs on A2,
+24 % AIC time with 48); the reduce-scatter's fixed setup and latency are spread over the blocks in proportion to
their bytes (the fused kernel starts its communication once); the barrier between the phases costs nothing beyond
the all-gather's own latency; the launch is the GEMM's device launch (the comm kernel's is hidden behind it).
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.engine import completions, simulate
from npusim.engine.streams import Task, run_streams
from npusim.kernels.base import nbytes
from npusim.kernels.gemm import Gemm
from npusim.parallel.collectives import Collective, collective_time
from npusim.spec.system import System


@dataclass(frozen=True)
class FusedTime:
    """Seconds of one fused launch and of its parts run alone."""

    time: float  # device launch + the schedule's makespan
    gemm: float  # the GEMM alone, device launch included
    reduce_scatter: float
    all_gather: float
    hidden: float  # communication time the GEMM hides

    @property
    def sequential(self) -> float:
        """The same work with the all-reduce after the GEMM."""
        return self.gemm + self.reduce_scatter + self.all_gather


def gemm_all_reduce(gemm: Gemm, system: System, group: int) -> FusedTime:
    """A GEMM whose [m, n] output is all-reduced over `group` ranks of `system`, fused as described above."""
    chip = system.chip_spec
    trace = gemm.trace(chip)
    alone = simulate(trace, chip, launch="device")
    ready = completions(trace, chip, "fixpipe", "store")
    size = nbytes(gemm.out_dtype, gemm.batch * gemm.m, gemm.n)
    rs = collective_time(Collective("reduce_scatter", size, group), system).time
    ag = collective_time(Collective("all_gather", size, group), system).time
    tasks, last = [], 0.0
    for i, end in enumerate(ready):
        tasks.append(Task(f"gemm.{i}", "compute", end - last, resource=""))
        tasks.append(Task(f"rs.{i}", "comm", rs / len(ready), after=(f"gemm.{i}",), resource="link",
                          category="comm"))
        last = end
    tasks.append(Task("ag", "comm", ag, resource="link", category="comm"))
    schedule = run_streams(tasks, {"link": 1})
    return FusedTime(alone.launch + schedule.makespan, alone.time, rs, ag,
                     rs + ag - schedule.exposed("comm", "compute"))
