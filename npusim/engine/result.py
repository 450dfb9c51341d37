"""Simulating a kernel: the result (time, pipe busy fractions, bound, achieved rates, roofline) and its memo.

Launch cost, added to the engine's time of the trace (the cores' busy span), by launch mode:
  * device: one standalone launch as msprof's Task Duration counts it: the task's dispatch onto its cores and its
    completion (`overheads.task_dispatch`, measured from raw profiles) and a core's prologue before its first tile
    (`overheads.core_start`: kernel entry, arguments and tiling data read from GM). Cores start in parallel, so
    the prologue counts once. A MIX kernel (a group running both an AIC and AIV programs) starts three cores per
    block and pays `overheads.mix_start` more. Prologues a kernel writes itself (initialising outputs, an all-core
    barrier) belong to its tiling, not here.
  * eager / graph: what a model step pays per kernel launched from the host one by one or from a captured graph
    (`overheads.kernel_launch` / `graph_launch`, fitted to published serving rows; they stand for the host's
    enqueue and the device-side costs above together).
  * none: no launch (a member of a fused kernel).

Results are memoised by content: the trace's structure (kernel, shape, tiling, dtype and every instruction, actions
excluded) and the chip's field values (its repr, which leaves out provenance, computed once per chip: Chip.content).
61 identical MoE layers, or the same GEMM at many sweep points, cost one simulation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from npusim.engine.sim import Outcome, Simulation
from npusim.errors import NpusimError
from npusim.kernels.trace import Trace
from npusim.memo import Lru
from npusim.spec.chip import Chip

LAUNCH_MODES = ("eager", "graph", "device", "none")
DMA_PIPES = ("mte2", "mte3", "fixpipe")
MEMO_SIZE = 4096


@dataclass(frozen=True)
class KernelResult:
    """One kernel launch as simulated. Times in seconds, rates in SI units (FLOP/s, B/s)."""

    kernel: str
    chip: str
    shape: dict[str, int]
    dtype: str
    time: float  # launch included
    launch: float
    busy: dict[str, float]  # "aic.cube" -> busy fraction of the kernel time, mean over the cores of that kind
    servers: dict[str, float]  # "hbm" / "l2" -> fraction of the (efficiency-scaled) bandwidth used
    sync: float  # fraction of the time the busiest core spent on AIC<->AIV hand-off latency
    bound: str  # cube | vector | hbm | l2 | sync | launch | mte2 | mte1 | fixpipe | mte3 | scalar
    flops: float  # useful FLOPs of the op
    hbm_bytes: float  # simulated HBM traffic
    l2_bytes: float  # simulated traffic through L2 (every GM read and write crosses it, its misses HBM too)
    roofline: float  # max(compute at peak, compulsory HBM bytes at peak bandwidth), no launch
    roofline_bound: str
    events: int  # simpy events processed
    extrapolated: float  # fraction of the kernel time covered by steady-state jumps

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.time

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bytes / self.time

    @property
    def roofline_fraction(self) -> float:
        return self.roofline / self.time


@dataclass(frozen=True)
class Timeline:
    """Per-instruction spans of one simulation (folded groups: the representative copy)."""

    kernel: str
    launch: float
    tracks: tuple[tuple[str, str], ...]  # per runner: (core label, pipe)
    spans: tuple[tuple[int, str, float, float], ...]  # (track, op, start, end), start after the launch


def roofline(trace: Trace, chip: Chip) -> tuple[float, str]:
    """The analytic lower bound: every unit at peak, HBM moving only the compulsory bytes."""
    cube_flops = trace.pipe_totals().get("cube", {}).get("flops", 0.0)
    vector_time = 0.0
    for flops, dtype in trace.vector_flops:
        vector_time += flops / chip.vector_rate(dtype)
    terms = {"hbm": trace.hbm_bytes / chip.hbm.bandwidth,
             "l2": trace.l2_bytes / (chip.l2.read_bandwidth + chip.l2.write_bandwidth),
             "vector": vector_time / (chip.aiv.count * chip.clock)}
    if cube_flops:
        terms["cube"] = min(trace.flops, cube_flops) / chip.peak_cube_flops(trace.dtype)
    bound = max(terms, key=terms.get)
    return terms[bound], bound


def launch_cost(chip: Chip, mode: str, mix: bool = False) -> float:
    """Seconds a launch adds in `mode`; `mix`: the kernel runs on AICs and AIVs together (see the module)."""
    if mode not in LAUNCH_MODES:
        raise NpusimError(f"launch mode '{mode}' is not one of {', '.join(LAUNCH_MODES)}")
    o = chip.overheads
    device = o.task_dispatch + o.core_start + (o.mix_start if mix else 0.0)
    return {"eager": o.kernel_launch, "graph": o.graph_launch, "device": device, "none": 0.0}[mode]


def is_mix(trace: Trace) -> bool:
    """A MIX kernel: some AI core runs both its AIC and AIV programs."""
    return any(g.aic is not None and any(p.body for p in g.aiv) for g in trace.groups)


def summarise(trace: Trace, chip: Chip, outcome: Outcome, launch: float) -> KernelResult:
    total = outcome.time + launch
    cores = trace.cores
    busy: dict[str, float] = {}
    peak: dict[str, float] = {}
    sync = 0.0
    for r in outcome.runners:
        kind = "aic" if r.core == "aic" else "aiv"
        name = f"{kind}.{r.pipe}"
        busy[name] = busy.get(name, 0.0) + r.busy * r.weight / (cores[kind] * total)
        peak[r.pipe] = max(peak.get(r.pipe, 0.0), r.busy / total)
        sync = max(sync, r.sync / total)
    eff = chip.efficiency
    bandwidth = {"hbm": chip.hbm.bandwidth * eff.hbm, "l2": chip.l2.read_bandwidth * eff.l2,
                 "l2w": chip.l2.write_bandwidth * eff.l2}
    servers = {n: s.moved / (bandwidth[n] * total) for n, s in outcome.servers.items()}
    rl, rl_bound = roofline(trace, chip)
    return KernelResult(
        kernel=trace.kernel, chip=chip.name, shape=dict(trace.shape), dtype=trace.dtype, time=total, launch=launch,
        busy=dict(sorted(busy.items())), servers=servers, sync=sync,
        bound=_bound(peak, servers, sync, launch / total), flops=trace.flops,
        hbm_bytes=outcome.servers["hbm"].moved, l2_bytes=outcome.servers["l2"].moved + outcome.servers["l2w"].moved,
        roofline=rl, roofline_bound=rl_bound, events=outcome.events, extrapolated=outcome.extrapolated / total)


def _bound(peak: dict[str, float], servers: dict[str, float], sync: float, launch: float) -> str:
    """The most used resource; a DMA pipe kept busy by a nearly saturated server is bound by that server."""
    scores = {**peak, **servers, "sync": sync, "launch": launch}
    best = max(scores, key=scores.get)
    if best in DMA_PIPES:
        server = max(servers, key=servers.get)
        if servers[server] >= 0.9 * scores[best]:
            return server
    return best


# ------------------------------------------------------------------------------------------------------ memo
_memo: Lru[KernelResult] = Lru(MEMO_SIZE)


def content_key(trace: Trace, chip: Chip, launch: str = "eager") -> str:
    """A digest of everything the simulated time depends on (the trace's program structure: Trace.structure)."""
    content = (trace.kernel, tuple(sorted(trace.shape.items())), repr(sorted(trace.tiling.items(), key=str)),
               trace.dtype, trace.flops, trace.hbm_bytes, trace.l2_bytes, trace.structure, chip.content, launch)
    return hashlib.blake2b(repr(content).encode(), digest_size=20).hexdigest()


def simulate(trace: Trace, chip: Chip, *, launch: str = "eager") -> KernelResult:
    """Time one kernel launch (memoised by content)."""
    return _memo.get(content_key(trace, chip, launch), lambda: summarise(
        trace, chip, Simulation(trace, chip).run(), launch_cost(chip, launch, is_mix(trace))))


def simulate_timeline(trace: Trace, chip: Chip, *, launch: str = "eager") -> tuple[KernelResult, Timeline]:
    """Time one kernel launch and keep every instruction's span (not memoised: for traces and debugging)."""
    outcome = Simulation(trace, chip, record=True).run()
    cost = launch_cost(chip, launch, is_mix(trace))
    tracks = tuple((f"group {r.group} {r.core}" + (f" (x{r.weight})" if r.weight > 1 else ""), r.pipe)
                   for r in outcome.runners)
    return summarise(trace, chip, outcome, cost), Timeline(trace.kernel, cost, tracks, tuple(outcome.spans))


def completions(trace: Trace, chip: Chip, pipe: str, op: str) -> tuple[float, ...]:
    """When each instance of one instruction ends, in seconds from the first instruction, sorted (a folded group's
    copies counted as their number): e.g. each output block's FIXPIPE store, the moment a consumer on another
    stream may take the block. Run without loop compression, so every instance is seen."""
    outcome = Simulation(trace, chip, record=True, compress=False).run()
    ends = []
    for index, name, _, end in outcome.spans:
        runner = outcome.runners[index]
        if runner.pipe == pipe and name == op:
            ends += [end] * runner.weight
    return tuple(sorted(ends))


def clear_memo() -> None:
    _memo.clear()
