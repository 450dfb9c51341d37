"""One step of one rank as a timeline: each layer type's kernels and collectives on streams, simulated once and
repeated over its identical layers.

Streams: `compute` runs the kernels in graph order; `comm` runs the collectives (on `compute` when the plan turns
communication overlap off); `side` runs the shared expert when the plan puts it on a side stream. A kernel that
consumes a collective's output waits for it; with two microbatches each layer runs twice at half the tokens,
interleaved so that one microbatch's collectives overlap the other's kernels.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from npusim.engine.streams import Task, Timeline, run_streams
from npusim.parallel.collectives import CommResult, collective_time
from npusim.parallel.optime import OpTime, op_time
from npusim.parallel.shard import SIDE_STREAM_OPS, RankLayer, RankStep
from npusim.spec.plan import Plan
from npusim.spec.system import System


@dataclass(frozen=True)
class LayerTime:
    name: str
    repeat: int
    time: float  # one layer
    compute: float  # kernel time on the critical streams
    comm: float  # collective time
    exposed_comm: float  # collective time not hidden behind kernels
    ops: tuple[OpTime, ...]
    comms: tuple[tuple[str, CommResult], ...]
    timeline: Timeline


@dataclass(frozen=True)
class StepTime:
    phase: str
    time: float
    layers: tuple[LayerTime, ...]

    @property
    def compute(self) -> float:
        return sum(lt.compute * lt.repeat for lt in self.layers)

    @property
    def comm(self) -> float:
        return sum(lt.comm * lt.repeat for lt in self.layers)

    @property
    def exposed_comm(self) -> float:
        return sum(lt.exposed_comm * lt.repeat for lt in self.layers)


def _halve(layer: RankLayer) -> RankLayer:
    """One of two microbatches: every token-proportional quantity halved (weights still read in full)."""
    from npusim.parallel.shard import _scale_op  # the same scaling the sharding uses

    ops = tuple(_scale_op(op, tokens=0.5, weights=1.0) for op in layer.ops)
    comms = tuple(dataclasses.replace(c, collective=dataclasses.replace(c.collective, bytes=c.collective.bytes / 2))
                  for c in layer.comms)
    return RankLayer(layer.name, ops, comms, layer.repeat)


def layer_time(layer: RankLayer, plan: Plan, system: System) -> LayerTime:
    chip = system.chip_spec
    launch = "graph" if plan.streams.graph_mode else "eager"
    micro = 2 if plan.streams.two_microbatch else 1
    parts = [_halve(layer)] * micro if micro == 2 else [layer]
    comm_stream = "comm" if plan.streams.comm_overlap else "compute"
    tasks: list[Task] = []
    op_times: list[OpTime] = []
    comm_times: list[tuple[str, CommResult]] = []
    names = [o.name for o in layer.ops]
    for mb, part in enumerate(parts):
        tag = f"mb{mb}." if micro > 1 else ""
        feeds = {c.before: [] for c in part.comms}
        for c in part.comms:
            feeds[c.before].append(tag + c.name)
        comm_after = {}
        for c in part.comms:
            comm_after.setdefault(c.after, []).append(c)
        prev_compute = None
        for op in part.ops:
            t = op_time(op, chip, launch)
            if mb == 0:
                op_times.append(t)
            side = plan.streams.shared_expert_side_stream and op.name in SIDE_STREAM_OPS
            stream = "side" if side else "compute"
            after = list(feeds.get(op.name, ()))
            if prev_compute and not side:
                after.append(prev_compute)
            if side and op.name == SIDE_STREAM_OPS[0]:
                after.append(tag + names[names.index(op.name) - 1 - _gate_offset(names, op.name)])
            tasks.append(Task(tag + op.name, stream, t.time, tuple(after), resource="cores", units=chip.aic.count))
            if not side:
                prev_compute = tag + op.name
            for c in comm_after.get(op.name, ()):
                r = collective_time(c.collective, system)
                if mb == 0:
                    comm_times.append((c.name, r))
                tasks.append(Task(tag + c.name, comm_stream, r.time, (tag + op.name,), resource="link", units=1,
                                  category="comm"))
        # the layer ends when everything of the microbatch has finished (side stream and trailing collectives)
        ends = [t.name for t in tasks if t.name.startswith(tag) and t.name != prev_compute]
        tasks.append(Task(tag + "layer_end", "compute", 0.0, tuple(ends), resource=""))
    tasks = _interleave(tasks, micro)
    tl = run_streams(tasks, {"cores": chip.aic.count, "link": 1})
    compute = tl.busy("compute")
    comm = sum(r.time for _, r in comm_times) * micro
    return LayerTime(layer.name, layer.repeat, tl.makespan, compute, comm, tl.exposed("comm"), tuple(op_times),
                     tuple(comm_times), tl)


def _gate_offset(names: list[str], first_side: str) -> int:
    """The side stream starts once the MoE input exists: right after the op before the gate (ffn_norm)."""
    i = names.index(first_side)
    gate = names.index("moe_gate") if "moe_gate" in names else i
    return i - gate if gate < i else 0


def _interleave(tasks: list[Task], micro: int) -> list[Task]:
    """Two-microbatch order on the compute stream: a segment of mb0, the same segment of mb1, and so on."""
    if micro == 1:
        return tasks
    return sorted(tasks, key=lambda t: (_segment(t, tasks), t.name.split(".", 1)[0]))


def _segment(task: Task, tasks: list[Task]) -> int:
    """Index of the compute segment (ops between collectives) a task belongs to, counted within its microbatch."""
    tag = task.name.split(".", 1)[0]
    seg = 0
    for t in tasks:
        if not t.name.startswith(tag + "."):
            continue
        if t is task:
            return seg
        if t.category == "comm":
            seg += 1
    return seg


def step_time(step: RankStep, plan: Plan, system: System) -> StepTime:
    layers = tuple(layer_time(layer, plan, system) for layer in step.layers)
    pp = step.instance.pp
    body = sum(lt.time * lt.repeat for lt in layers)
    if pp > 1:  # GPipe-style fill and drain over the plan's microbatches
        mbs = step.instance.microbatches
        body = body / pp / mbs * (pp + mbs - 1) + (pp - 1) * _p2p(step, system)
    return StepTime(step.phase, body, layers)


def _p2p(step: RankStep, system: System) -> float:
    from npusim.parallel.collectives import Collective

    h = step.graph.layers[0].ops[0].shape.get("hidden", 0)
    size = step.tokens * h * 2 / max(1, step.instance.microbatches)
    return collective_time(Collective("p2p", size, 2, stride=max(1, math.ceil(system.ranks / 2) // 2)), system).time
