"""GEMMs fused with a collective on the same chip: the GEMM on the AI cores, the communication kernel beside it on the
vector cores, each waiting on the other only where the data demands (pto-isa kernels/manual/a2a3/gemm_ar and
allgather_gemm; the shape of CANN's MC2 MatmulAllReduce / AllGatherMatmul).

GEMM + all-reduce (`gemm_all_reduce`), the output blocks reduce-scattered while the GEMM still runs:
* The GEMM is the engine's tile trace of npusim.kernels.gemm on one rank's chip, on the AI cores. Each output block
  is ready when its FIXPIPE store to GM ends (npusim.engine.completions), as pto-isa's compute kernel enqueues a
  block's index after its TSTORE. A store ends in the write-back L2; the GEMM ends when HBM has the last blocks'
  write-back (npusim.engine.sim), which runs beside the collective.
* The communication kernel runs beside it on the vector cores of the same chip (pto-isa: 24 AIVs on their own
  stream, one ready queue per AIC). Reduce-scatter phase: it takes the blocks in the order they are ready and sends
  each to the rank that owns it (a remote atomic add); the link is one server, so a block of b bytes holds it for
  b / C of the reduce-scatter of the whole output C, npusim.parallel.collectives' time on the system.
* After the last block has been sent and a cross-rank barrier, the all-gather phase broadcasts each rank's reduced
  blocks to the others: the all-gather of C, exposed after the GEMM.

All-gather + GEMM (`all_gather_gemm`), A split by rows over the ranks:
* The compute kernel multiplies the rank's own rows first (no wait), then the other ranks' rows chunk by chunk as
  they arrive, in the order they are sent; the peers send their slices at once over the mesh, so chunk j of the
  R = (group - 1) x `chunks` arrives after j + 1 of R shares of npusim's all-gather of A on the system (pto-isa's
  ComputeOptimalChunkSize keeps 64-128 chunks per source: `chunks` 64).
* The local rows and the remote rows are each the engine's time of the GEMM's tile trace over those rows; a remote
  chunk takes its share of the remote GEMM.

Both schedules run on npusim.engine.streams, so what the collective hides behind the GEMM is computed from the
block and chunk times, not taken as a max.

Limits: the communication kernel's GM traffic does not slow the GEMM (pto-isa measured no loss with 24 AIVs on A2,
+24 % AIC time with 48); the reduce-scatter's fixed setup and latency are spread over the blocks in proportion to
their bytes (the fused kernel starts its communication once); the barrier between the phases costs nothing beyond
the all-gather's own latency; a remote chunk's GEMM runs at the remote GEMM's average rate (the last chunk's wave
is not modelled on its own); the launch is the GEMM's device launch (the comm kernel's is hidden behind it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from npusim.engine import completions
from npusim.engine.tune import tuned
from npusim.engine.streams import Task, run_streams
from npusim.errors import NpusimError
from npusim.kernels.base import cdiv, nbytes
from npusim.kernels.gemm import Gemm
from npusim.parallel.collectives import Collective, collective_time
from npusim.spec.system import System


@dataclass(frozen=True)
class FusedTime:
    """Seconds of one fused launch and of its parts run alone."""

    time: float  # device launch + the schedule's makespan
    gemm: float  # the GEMM alone, device launch included
    comm: float  # the collective(s) alone
    hidden: float  # communication time the GEMM hides

    @property
    def sequential(self) -> float:
        """The same work with the collective and the GEMM one after the other."""
        return self.gemm + self.comm


def gemm_all_reduce(gemm: Gemm, system: System, group: int) -> FusedTime:
    """A GEMM whose [m, n] output is all-reduced over `group` ranks of `system`, fused as described above."""
    _check(group, 1)
    chip = system.chip_spec
    best = tuned(gemm, chip, "device")
    trace, alone = best.trace, best.result
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
    tasks.append(Task("gemm.write_back", "compute", max(0.0, alone.time - alone.launch - last), resource=""))
    tasks.append(Task("ag", "comm", ag, resource="link", category="comm"))
    return _fused(tasks, alone.launch, alone.time, rs + ag)


def all_gather_gemm(gemm: Gemm, system: System, group: int, chunks: int = 64) -> FusedTime:
    """A GEMM whose A [m, k] is all-gathered by rows from `group` ranks of `system`, fused as described above."""
    _check(group, chunks)
    chip = system.chip_spec
    own = cdiv(gemm.m, group)
    local, remote = (tuned(dataclasses.replace(gemm, m=rows), chip, "device").result for rows in (own, gemm.m - own))
    ag = collective_time(Collective("all_gather", nbytes(gemm.scheme.cube, gemm.batch * gemm.m, gemm.k), group),
                         system).time
    pieces = (group - 1) * chunks
    tasks = [Task("gemm.local", "compute", local.time - local.launch, resource="")]
    for j in range(pieces):
        tasks.append(Task(f"ag.{j}", "comm", ag / pieces, resource="link", category="comm"))
        tasks.append(Task(f"gemm.{j}", "compute", (remote.time - remote.launch) / pieces, after=(f"ag.{j}",),
                          resource=""))
    whole = tuned(gemm, chip, "device").result
    return _fused(tasks, whole.launch, whole.time, ag)


def _check(group: int, chunks: int) -> None:
    if group < 2 or chunks < 1:
        raise NpusimError(f"a fused GEMM + collective needs group >= 2 ranks (and chunks >= 1), not group {group}"
                          + (f", chunks {chunks}" if chunks < 1 else ""), field="group")


def _fused(tasks: list[Task], launch: float, gemm: float, comm: float) -> FusedTime:
    schedule = run_streams(tasks, {"link": 1})
    return FusedTime(launch + schedule.makespan, gemm, comm, comm - schedule.exposed("comm", "compute"))
