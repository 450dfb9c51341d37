"""One step of one rank as a timeline: each layer type's kernels and collectives on streams, simulated once and
repeated over its identical layers.

The streams and schedule are the phase's own (`prefill.streams` / `decode.streams` over the plan-level `streams`):
a prefill with two microbatches does not impose them on decode. Streams: `compute` runs the kernels in graph order;
`comm` runs the collectives (on `compute` when the plan turns communication overlap off); `side` runs the shared
expert when the plan puts it on a side stream. A kernel that consumes a collective's output waits for it; with two
microbatches each layer's body runs twice at half the tokens, interleaved so that one microbatch's collectives
overlap the other's kernels, and its head (final norm, LM head) once on the whole batch.

Plan switches act here on the schedule: fused groups run back to back with one launch and their intermediates on
chip (fusion.py); with `streams.attention_cores` the attention ops run on an `attn` stream holding that many cores
and the FFN/MoE ops on an `ffn` stream holding the rest, so one microbatch's attention overlaps the other's MoE path
and its dispatch / combine: each kernel is simulated on its partition's cores at their own DMA rates, and kernels
running side by side share the chip's HBM and L2 as fluid servers (engine/streams.py; a kernel's traffic is taken as
steady over its duration). With KV offload, a `host` stream gathers the selected cache rows before attention.

In-network effects (issue 14 item 3; the models are the engine's, npusim.engine.l2state and engine/streams.py):
a kernel whose activation input its predecessor on the stream just wrote reads it from L2 when the predecessor's HBM
footprint fits L2 (`l2state.carried`; after a collective, or a predecessor that touched more, it starts cold); where
collectives overlap kernels (a comm stream), the collectives move `chip.comm.hbm_per_byte` local HBM bytes per byte
delivered through the HBM server the kernels share, and those that run on the vector cores hold AIV cores while they
run: an HCCL AIV-mode collective `comm.aiv_per_rank` per rank of its group, the fused MC2 MoE dispatch / combine
(not the bulk all-to-all of a prefill's double routing) `comm.fused_dispatch_aiv` of the die's AIVs (of the FFN
partition's on core partitions); AI-CPU-expanded collectives (SDMA) hold none. Limits: a kernel's input is taken to
be its predecessor's output in graph order (where it is an earlier op's, such as kv_a_proj reading the normed
hidden state after q_b_proj, the predecessor's footprint still decides); the residual stream, the side stream's
kernels and the collectives' own L2 traffic are not counted as evicting; a collective's AIV cores are held from
the moment it starts, where the NPU would first let the running kernel's blocks finish.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

from npusim.engine.l2state import carried
from npusim.engine.streams import Task, Timeline, run_streams
from npusim.errors import NpusimError
from npusim.parallel.collectives import Collective, CommResult, collective_time, delivered
from npusim.parallel.fusion import Placement, placements, unfused_topk
from npusim.parallel.optime import ATTENTION, Activity, OpRun, OpTime, kernel_name, op_time
from npusim.parallel.shard import SIDE_STREAM_OPS, RankLayer, RankStep, scale_op
from npusim.spec.plan import Plan, Streams
from npusim.spec.reads import ReadsMemo
from npusim.spec.system import System

HEAD_START = "final_norm"  # the op where a layer's head (final norm, LM head) begins
MOE_ALL_TO_ALL = ("moe_dispatch", "moe_combine_all_to_all")  # the MoE's dispatch and combine (shard.py)
ROUTED_GEMM = "experts_gate_up"  # the routed experts' first GEMM: its rows are the rows the dispatch brings
# Chips whose fused MoE dispatch / combine write each (token, expert) row into the peer's window from the AIVs (CANN
# ops-transformer mc2/moe_distribute_dispatch_v2 op_kernel/moe_distribute_dispatch_v2_full_mesh.h, the arch22 kernel
# of A2 / A3). The 950's (op_kernel/arch35/moe_distribute_dispatch_arch35.h) scatters the rows into a local send
# buffer and hands the exchange to the CCU (Hccl<HCCL_SERVER_TYPE_CCU>): its rows cross no fabric one by one.
ROW_WRITING_ARCHS = ("dav-c220",)


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
    activity: Activity = Activity()  # one layer, all microbatches
    link_bytes: float = 0.0  # collective bytes of one layer over the links
    host_bytes: float = 0.0  # KV rows gathered from host memory in one layer


@dataclass(frozen=True)
class StepTime:
    phase: str
    time: float
    layers: tuple[LayerTime, ...]

    def _total(self, attr: str) -> float:
        """A per-layer figure summed over the step (every layer type times its repeats)."""
        return sum(getattr(lt, attr) * lt.repeat for lt in self.layers)

    @property
    def compute(self) -> float:
        return self._total("compute")

    @property
    def comm(self) -> float:
        return self._total("comm")

    @property
    def exposed_comm(self) -> float:
        return self._total("exposed_comm")

    @property
    def link_bytes(self) -> float:
        return self._total("link_bytes")

    @property
    def host_bytes(self) -> float:
        return self._total("host_bytes")

    @property
    def activity(self) -> Activity:
        """Work of the whole step on one rank (every layer times its repeats)."""
        return add_activity((lt.activity, lt.repeat) for lt in self.layers)


def add_activity(parts) -> Activity:
    """Sum of (activity, multiplicity) pairs."""
    fields = [f.name for f in dataclasses.fields(Activity)]
    total = dict.fromkeys(fields, 0.0)
    for a, n in parts:
        for f in fields:
            total[f] += getattr(a, f) * n
    return Activity(**total)


def _halve(layer: RankLayer) -> RankLayer:
    """One of two microbatches: every token-proportional quantity halved (weights still read in full)."""
    ops = tuple(scale_op(op, tokens=0.5, weights=1.0) for op in layer.ops)
    comms = tuple(dataclasses.replace(c, collective=dataclasses.replace(c.collective, bytes=c.collective.bytes / 2))
                  for c in layer.comms)
    return RankLayer(layer.name, ops, comms, layer.repeat, layer.host_bytes / 2)


def _with_topk(layer: RankLayer, plan: Plan) -> RankLayer:
    """Without the in-kernel top-k, a separate selection kernel follows the indexer."""
    if plan.fusion.li_topk or not any(o.kind == "lightning_indexer" for o in layer.ops):
        return layer
    ops = []
    for op in layer.ops:
        ops.append(op)
        if op.kind == "lightning_indexer":
            ops.append(unfused_topk(op))
    return dataclasses.replace(layer, ops=tuple(ops))


@dataclass(frozen=True)
class Partition:
    """Which stream and how many cores each op of a layer gets."""

    split: int  # op index where the FFN/MoE stream starts (len(ops): no split)
    attn_cores: int  # AIC of the attention partition (0: whole chip for everything)
    total: int
    head: int  # op index where the layer's head starts: it runs on the whole chip

    def of(self, index: int) -> tuple[str, int]:
        """(stream, AIC) of the op at `index`: AIC 0 in a kernel run means the whole chip."""
        if not self.attn_cores or index >= self.head:
            return "compute", 0
        return ("attn", self.attn_cores) if index < self.split else ("ffn", self.total - self.attn_cores)

    @property
    def capacity(self) -> dict[str, int]:
        """The core pools: the whole chip, and each partition's own AIC (a side-stream kernel on the FFN partition
        takes that partition's cores, never the attention partition's)."""
        split = {"attn_cores": self.attn_cores, "ffn_cores": self.total - self.attn_cores} if self.attn_cores else {}
        return {"cores": self.total} | split


def _pool(stream: str) -> str:
    """The core pool a kernel of `stream` holds."""
    return {"attn": "attn_cores", "ffn": "ffn_cores"}.get(stream, "cores")


def _partition(names: list[str], streams: Streams, total: int) -> Partition:
    n = streams.attention_cores
    head = names.index(HEAD_START) if HEAD_START in names else len(names)
    if not n or "ffn_norm" not in names:
        return Partition(len(names), 0, total, head)
    return Partition(names.index("ffn_norm"), n, total, head)


def _split_head(layer: RankLayer) -> tuple[RankLayer, RankLayer]:
    """The layer's body and its head (final norm onward: the LM head of the MTP layer, or the whole lm_head layer)
    with the collectives that follow their ops."""
    names = [o.name for o in layer.ops]
    h = names.index(HEAD_START) if HEAD_START in names else len(names)
    head_ops = set(names[h:])

    def part(ops, comms):
        return RankLayer(layer.name, tuple(ops), tuple(comms), layer.repeat, layer.host_bytes if ops else 0.0)

    return (part(layer.ops[:h], [c for c in layer.comms if c.after not in head_ops]),
            part(layer.ops[h:], [c for c in layer.comms if c.after in head_ops]))


@dataclass
class _Schedule:
    """The tasks of one layer being built, with the op and collective times each counts (times its multiplicity)."""

    tasks: list[Task]
    ops: list[tuple[OpTime, int]]
    comms: list[tuple[str, CommResult, int]]


def _op_time(op, chip, run: OpRun, plan: Plan) -> OpTime:
    """op_time, with a refusal of the plan's kernel options named where the user wrote them (the plan file or the
    override, `plan.kernels.gemm.base_m`) rather than as the kernel's own `tiling.base_m`."""
    try:
        return op_time(op, chip, run)
    except NpusimError as exc:
        field = exc.field or ""
        if exc.file is None and field.startswith("tiling.") and run.options:
            key = field.removeprefix("tiling.")
            if key in run.options.tiling():
                raise NpusimError(exc.detail, **plan.provenance.where(f"kernels.{kernel_name(op)}.{key}")) from None
        if exc.file is None and field.startswith("kernels."):
            raise NpusimError(exc.detail, **plan.provenance.where(field)) from None
        raise


_layers = ReadsMemo(size=1024)


def layer_time(layer: RankLayer, plan: Plan, system: System, streams: Streams | None = None) -> LayerTime:
    """One layer on the phase's `streams` (None: the plan-level ones), memoised by content: the layer's ops and
    collectives, the system and its chip (System's repr leaves the chip out, so it is keyed apart), the streams,
    and the values of the plan fields the layer read (npusim.spec.reads: its fusion switches, kernel options,
    streams). Sweep points that differ only where a layer does not look (the MTP acceptance, the batch of the other
    phase, the price) time each layer once. A refusal is not memoised: it is raised again with its own message."""
    key = hashlib.blake2b(repr((layer, system, system.chip_spec.content, streams)).encode(), digest_size=20).hexdigest()
    return _layers.get(key, plan, lambda seen: _layer_time(layer, seen, system, streams))


def clear_layer_memo() -> None:
    _layers.clear()


def _layer_time(layer: RankLayer, plan: Plan, system: System, streams: Streams | None = None) -> LayerTime:
    """One layer on the phase's `streams` (None: the plan-level ones).

    With two microbatches the layer's body runs twice at half the tokens; its head (final norm and LM head) runs once
    on the whole batch after both, on all cores, as the frameworks merge the microbatches before the logits: split, it
    would only read the vocabulary's weights twice. A layer with no collective to hide and no core split (the
    embedding, the LM head) has nothing to overlap and runs whole."""
    chip = system.chip_spec
    streams = streams or plan.streams
    layer = _with_topk(layer, plan)
    names = [o.name for o in layer.ops]
    cores = _partition(names, streams, chip.aic.count)
    body, head = _split_head(layer)
    micro = 2 if streams.two_microbatch and body.ops and (body.comms or cores.attn_cores) else 1
    sched = _Schedule([], [], [])
    if micro == 1:
        _add_part(sched, layer, "", None, 0, 1, plan, system, streams, cores)
    else:
        # over repeated layers a second copy of the layer shows the steady state, where one microbatch's tail (MoE)
        # overlaps the next layer's head (attention) of the other; a layer with a head is not repeated
        copies = 2 if layer.repeat > 1 and not head.ops else 1
        half = _halve(body)
        for copy, mb in ((c, m) for c in range(copies) for m in range(2)):
            tag = f"mb{mb}{'L1' if copy else ''}."
            _add_part(sched, half, tag, f"mb{mb}.layer_end" if copy else None, 0, 2 if copy == 0 and mb == 0 else 0,
                      plan, system, streams, cores)
        if head.ops:
            _add_part(sched, head, "head.", None, len(body.ops), 1, plan, system, streams, cores,
                      ("mb0.layer_end", "mb1.layer_end"))
    tasks = _interleave(sched.tasks, micro, bool(cores.attn_cores))
    capacity = cores.capacity | {"link": 1, "host": 1}
    servers = shared_servers(chip)
    tl = run_streams([t for t in tasks if "L1." not in t.name], capacity, servers)
    time = tl.makespan
    if any("L1." in t.name for t in tasks):  # first layer as simulated, the others at the steady-state increment
        steady = run_streams(tasks, capacity, servers).makespan - time
        time = (time + (layer.repeat - 1) * steady) / layer.repeat
    activity = add_activity((t.activity or Activity(), n) for t, n in sched.ops)
    comm = sum(r.time * n for _, r, n in sched.comms)
    link_bytes = sum(c.collective.bytes for c in layer.comms)
    return LayerTime(layer.name, layer.repeat, time, tl.busy("compute"), comm, tl.exposed("comm"),
                     tuple(t for t, _ in sched.ops), tuple((name, r) for name, r, _ in sched.comms), tl, activity,
                     link_bytes, layer.host_bytes)


def _add_part(sched: _Schedule, part: RankLayer, tag: str, prev: str | None, offset: int, count: int, plan: Plan,
              system: System, streams: Streams, cores: Partition, after_all: tuple[str, ...] = ()) -> None:
    """Tasks of one run of `part` (a layer, a microbatch's half of it, or its head), ending in `tag`layer_end.
    `prev`: the task its first kernel waits for; `offset`: the index of its first op in the layer (for the core
    partition); `count`: how many times its op and collective times count in the layer's totals (0: a repeat of a
    run already counted); `after_all`: tasks every one of its kernels waits for."""
    chip = system.chip_spec
    launch = "graph" if streams.graph_mode else "eager"
    comm_stream = "comm" if streams.comm_overlap else "compute"
    names = [o.name for o in part.ops]
    fused = placements(names, plan.fusion)
    feeds: dict[str, list[str]] = {}
    comm_after: dict[str, list] = {}
    for c in part.comms:
        feeds.setdefault(c.before, []).append(tag + c.name)
        comm_after.setdefault(c.after, []).append(c)
    first = len(sched.tasks)
    sharing = bool(cores.attn_cores) or (chip.comm is not None and comm_stream != "compute" and bool(part.comms))
    producer: OpTime | None = None  # the kernel before this one on the main stream (its output is this one's input)
    for i, op in enumerate(part.ops):
        place = fused.get(op.name, Placement())
        stream, aic = cores.of(offset + i)
        warm_input = (producer is not None and producer.activity is not None and op.name not in feeds
                      and carried(producer.activity.hbm_bytes, chip))
        run = OpRun(launch if place.first else "none", plan.kernels.get(kernel_name(op)), aic,
                    place.input_on_chip or warm_input, place.output_on_chip)
        t = _op_time(op, chip, run, plan)
        if count:
            sched.ops.append((t, count))
        side = streams.shared_expert_side_stream and op.name in SIDE_STREAM_OPS
        pool, stream = _pool(stream), "side" if side else stream
        after = list(feeds.get(op.name, ())) + list(after_all)
        if prev and not side:
            after.append(prev)
        if side and op.name == SIDE_STREAM_OPS[0]:
            after.append(tag + names[names.index(op.name) - 1 - _gate_offset(names, op.name)])
        if part.host_bytes and op.kind in ATTENTION:
            sched.tasks.append(Task(tag + "kv_offload_gather", "host", part.host_bytes / system.host_link,
                                    (prev,) if prev else (), resource="host", units=1, category="comm"))
            after.append(tag + "kv_offload_gather")
        sched.tasks.append(Task(tag + op.name, stream, t.time, tuple(after), resource=pool,
                                units=aic or chip.aic.count, flows=traffic(t, chip) if sharing else ()))
        if not side:
            prev = tag + op.name
            producer = t
        for c in comm_after.get(op.name, ()):
            pool = chip.aiv.count * (cores.total - cores.attn_cores) / cores.total  # the FFN partition's AIVs
            fused_moe = c.name in MOE_ALL_TO_ALL and not c.collective.bulk  # the MC2 dispatch / combine kernels
            coll = mc2_rows(c.collective, part, chip) if fused_moe else c.collective
            r = collective_time(coll, system)
            if count:
                sched.comms.append((c.name, r, count))
            # gating fused into the dispatch: tokens leave as their routing is computed, from the gate's start
            src = op.name if not (c.after == "moe_gate" and "moe_gate" in fused) else names[i - 1]
            flows, holds = comm_load(coll, r, chip, pool, fused_moe) if sharing else ((), ())
            sched.tasks.append(Task(tag + c.name, comm_stream, r.time, (tag + src,), resource="link", units=1,
                                    category="comm", flows=flows, holds=holds,
                                    issuers=int(holds[0][1]) if holds else 0))
    # the part ends when everything of it has finished (side stream and trailing collectives)
    ends = [t.name for t in sched.tasks[first:] if t.name != prev]
    sched.tasks.append(Task(tag + "layer_end", "compute", 0.0, tuple(ends), resource=""))


def mc2_rows(c: Collective, part: RankLayer, chip) -> Collective:
    """The fused MoE dispatch / combine with the (token, expert) rows its AIVs write one at a time
    (npusim.parallel.collectives) on the chips whose kernel does so (ROW_WRITING_ARCHS): the rows this rank's experts
    take (the routed GEMM's), which in balance are the rows it sends out, dealt over the kernel's blocks: its tiling
    takes `comm.fused_dispatch_aiv` of the die's AIVs (blockDim = GetCoreNumAiv(), the source of that share) whatever
    core partition its stream holds; how those blocks share a partition's AIVs is not modelled (`pool` is what it
    holds beside the kernels, `comm_load`)."""
    experts = next((o for o in part.ops if o.name == ROUTED_GEMM), None)
    if experts is None or c.kind != "all_to_all" or not c.fused_moe or chip.arch not in ROW_WRITING_ARCHS:
        return c
    share = chip.comm.fused_dispatch_aiv if chip.comm is not None else 1.0
    return dataclasses.replace(c, rows=int(experts.shape.get("rows", 0)), issuers=share * chip.aiv.count)


def traffic(t: OpTime, chip) -> tuple[tuple[str, float], ...]:
    """What a kernel moves through the chip's shared servers while it runs: its HBM and L2 bytes, and (where the
    chip says what comm kernels hold) its AIV cores' core-seconds."""
    a = t.activity or Activity()
    cores = (("aiv", t.aiv_cores * t.time),) if chip.comm is not None and t.aiv_cores else ()
    return (("hbm", a.hbm_bytes), ("l2", a.l2_bytes)) + cores


def comm_load(c: Collective, r: CommResult, chip, pool: float, fused_moe: bool = False) -> tuple[
        tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]]:
    """(flows, holds) of a collective beside the kernels: its local HBM bytes, and the AIV cores it runs on (the
    fused MC2 MoE dispatch / combine, `fused_moe`; an HCCL AIV-mode kernel; none when the AI CPU expands it onto the
    DMA engines) out of the `pool` it may use (on core partitions the FFN/MoE path's collectives run on that
    partition's)."""
    if chip.comm is None:
        return (), ()
    flows = (("hbm", chip.comm.hbm_per_byte * delivered(c)),)
    if fused_moe:
        held = chip.comm.fused_dispatch_aiv * pool
    elif r.algorithm == "hccl-aiv":
        held = min(pool, chip.comm.aiv_per_rank * c.group)
    else:
        held = 0.0
    return flows, (("aiv", float(held)),) if held else ()


def shared_servers(chip) -> dict[str, float]:
    """The chip's HBM and L2 (reads and writes together) as the kernels beside each other share them, at the
    efficiencies the engine serves them with, and its AIV cores (core-seconds per second)."""
    eff = chip.efficiency
    return {"hbm": chip.hbm.bandwidth * eff.hbm, "l2": (chip.l2.read_bandwidth + chip.l2.write_bandwidth) * eff.l2,
            "aiv": float(chip.aiv.count)}


def _gate_offset(names: list[str], first_side: str) -> int:
    """The side stream starts once the MoE input exists: right after the op before the gate (ffn_norm)."""
    i = names.index(first_side)
    gate = names.index("moe_gate") if "moe_gate" in names else i
    return i - gate if gate < i else 0


def _interleave(tasks: list[Task], micro: int, partitioned: bool = False) -> list[Task]:
    """Two-microbatch order on each stream. On one set of cores: a segment (ops between collectives) of mb0, the
    same segment of mb1, and so on, so that one microbatch's collective runs under the other's kernels. On core
    partitions each stream takes the microbatches whole, one after the other (attention of mb0 then mb1 on its cores,
    the MoE path of mb0 then mb1 on the others, their collectives likewise), so that mb0's MoE never waits in line
    behind mb1's, which waits for mb1's attention on the other partition. The merged head comes last."""
    if micro == 1:
        return tasks

    def run(t: Task) -> tuple[bool, str]:
        prefix = t.name.split(".", 1)[0]
        return prefix == "head", prefix

    if partitioned:
        return sorted(tasks, key=lambda t: ("L1." in t.name, run(t)))
    return sorted(tasks, key=lambda t: ("L1." in t.name, run(t)[0], _segment(t, tasks), run(t)[1]))


def _segment(task: Task, tasks: list[Task]) -> int:
    """Index of the compute segment (ops between collectives) a task belongs to, counted within its microbatch.
    Collectives issued back to back (the double routing's counts, rows and scales: one dispatch call) are one
    boundary, so a microbatch's exchanges stay together on the comm stream ahead of the other's."""
    tag = task.name.split(".", 1)[0]
    seg, after_comm = 0, False
    for t in tasks:
        if not t.name.startswith(tag + "."):
            continue
        if after_comm and t.category != "comm":
            seg += 1
        after_comm = t.category == "comm"
        if t is task:
            return seg
    return seg


def step_time(step: RankStep, plan: Plan, system: System) -> StepTime:
    streams = plan.streams_of(step.phase)
    layers = tuple(layer_time(layer, plan, system, streams) for layer in step.layers)
    pp = step.instance.pp
    body = sum(lt.time * lt.repeat for lt in layers)
    if pp > 1:  # GPipe-style fill and drain over the plan's microbatches, paced by the busiest stage
        mbs = step.instance.microbatches
        stage = step.instance.busiest_stage(body, step.graph.scenario.get("layers", pp))
        body = stage / mbs * (pp + mbs - 1) + (pp - 1) * _p2p(step, system)
    return StepTime(step.phase, body, layers)


def _p2p(step: RankStep, system: System) -> float:
    """One microbatch's hidden states from a pipeline stage to the next, whose ranks are a stage's width apart."""
    h = step.graph.layers[0].ops[0].shape.get("hidden", 0)
    size = step.tokens * h * 2 / max(1, step.instance.microbatches)
    return collective_time(Collective("p2p", size, 2, stride=step.instance.stage_ranks), system).time
