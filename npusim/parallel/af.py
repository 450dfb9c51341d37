"""Attention-FFN disaggregation (AF) of a decode step: attention dies and expert dies exchanging activations every
MoE layer, with microbatches pipelined through the two sides (xDeepServe's disaggregated MoE-attention on
CloudMatrix384, arXiv 2508.02520).

Layout (a decode instance with `ffn_ranks`): its `ranks` are attention dies — DP attention holding the KV cache, the
MoE gate and the weighted combine of the expert outputs, the dense layers' FFN, embedding and LM head; `ffn_ranks`
further dies hold the routed experts (EP x MoE TP over them) and each a replica of the shared experts, which run on
the tokens the die receives. Every MoE layer, each attention die sends its tokens' top-k rows to the expert dies
(A2E, in the dispatch format) and receives their outputs back (E2A, BF16), timed as the MoE dispatch / combine
collectives are: an all-to-all fan-out from every attention die over the expert dies and a fan-in at every expert
die from the attention dies, the slower of the two, on the tier spanning both sides.

Schedule: the attention ranks form `attention_domains` domains (xDeepServe's DP domains: disjoint sets of attention
dies, each with its own sequences, taking turns on the one expert pool), and each domain's batch is split into
`microbatches` (time-sliced on the same dies). A microbatch's layer runs its attention part on its domain's dies,
travels, runs its experts on the expert dies and travels back before its next layer's attention can start; each
domain and the expert side run one microbatch at a time in order, and transfers overlap the work (they use the
links, not the cores). With one microbatch the sides take turns idling; with m the attention of
microbatch i+1 runs while the experts of microbatch i do, so the step tends to L x max(m a, m f) instead of
L x (a + s + f + r) per m-th of the batch. Each side's per-microbatch layer time is its kernels on the engine, as in
every other prediction, at the microbatch's tokens (weights are read again by every microbatch).

Limits: rows go straight from each attention die to their expert dies (xDeepServe's trampoline forward, a second
hop when the sides differ in size, is not modelled); the combine op is timed where the attention side runs it (the
microbatch's next attention pass); expert-side load imbalance is the plan's `eplb.imbalance`, as co-located; no
straggler or synchronisation variance between attention DP ranks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from npusim.graph import accounting
from npusim.parallel.collectives import Collective, collective_time
from npusim.parallel.memory import Memory, activation_bytes, kv_bytes, weight_bytes
from npusim.parallel.shard import ROUTED, SIDE_STREAM_OPS, RankLayer, RankStep, shard
from npusim.parallel.step import LayerTime, StepTime, layer_time
from npusim.spec.model import ModelConfig
from npusim.spec.plan import Attention, Plan
from npusim.spec.quant import QuantScheme
from npusim.spec.system import System

EXPERT_OPS = ROUTED + SIDE_STREAM_OPS  # what runs on the expert dies
MOE_COMMS = ("moe_dispatch", "moe_combine_all_to_all")  # replaced by the A2E / E2A transfers


@dataclass(frozen=True)
class AfStep:
    """One AF decode step: the schedule's makespan and what each side did in it."""

    time: float
    microbatches: int  # per attention domain
    domains: int  # attention domains sharing the expert dies
    attention: StepTime  # one microbatch's layers on an attention die
    experts: StepTime  # one domain's microbatch's MoE layers on an expert die
    a2e: float  # one domain's microbatch's transfer to the experts, per MoE layer
    e2a: float  # and back
    attention_busy: float  # seconds of the step the attention dies compute
    expert_busy: float
    attention_memory: Memory
    expert_memory: Memory

    @property
    def attention_utilisation(self) -> float:
        return self.attention_busy / self.time

    @property
    def expert_utilisation(self) -> float:
        return self.expert_busy / self.time

    def as_step(self) -> StepTime:
        """The step as predict reports it: both sides' layers (experts' renamed), the AF makespan as its time."""
        renamed = tuple(dataclasses.replace(lt, name=f"experts:{lt.name}") for lt in self.experts.layers)
        return StepTime("decode", self.time, self.attention.layers + renamed)


def _attention_layer(layer: RankLayer) -> RankLayer:
    ops = tuple(o for o in layer.ops if o.name not in EXPERT_OPS)
    names = {o.name for o in ops} | {""}
    comms = tuple(c for c in layer.comms if c.name not in MOE_COMMS and c.after in names and c.before in names)
    return dataclasses.replace(layer, ops=ops, comms=comms)


def _expert_layer(layer: RankLayer) -> RankLayer | None:
    ops = tuple(o for o in layer.ops if o.name in EXPERT_OPS)
    return dataclasses.replace(layer, ops=ops, comms=()) if ops else None


def _transfer(rows_out: float, rows_in: float, row_bytes: float, senders: int, receivers: int,
              system: System) -> float:
    """Rows leaving every attention die for the expert dies (fan-out) and arriving at every expert die (fan-in)."""
    span = senders + receivers

    def fan(size: float, peers: int) -> float:
        return collective_time(Collective("all_to_all", size, peers, stride=max(1, span // peers)), system).time

    return max(fan(rows_out * row_bytes, receivers), fan(rows_in * row_bytes, senders))


def schedule(layers: list[tuple[float, float, bool]], m: int, a2e: float, e2a: float, domains: int = 1) -> float:
    """Makespan of m microbatches in each of `domains` attention domains through the layers: (attention time of a
    microbatch on its domain, expert time of one domain's microbatch, has experts) per layer."""
    attention_free = [0.0] * domains
    expert_free = 0.0
    ready = [[0.0] * m for _ in range(domains)]
    for a, f, moe in layers:
        for i in range(m):
            for d in range(domains):
                a_end = max(attention_free[d], ready[d][i]) + a
                attention_free[d] = a_end
                if moe:
                    f_end = max(expert_free, a_end + a2e) + f
                    expert_free = f_end
                    ready[d][i] = f_end + e2a
                else:
                    ready[d][i] = a_end
    return max(max(r) for r in ready)


def af_step(model: ModelConfig, plan: Plan, system: System, *, batch: int, context: int,
            quant: QuantScheme) -> AfStep:
    """The AF decode step of the global `batch` at `context` under the plan's decode instance."""
    inst = plan.instance("decode")
    m, domains = inst.microbatches, inst.attention_domains
    mb = math.ceil(batch / m)
    attention_dies, expert_dies = inst.ranks * inst.instances, inst.ffn_ranks * inst.instances
    # AF's microbatches replace the two-microbatch overlap; the shared expert runs on the expert dies
    streams = dataclasses.replace(plan.streams_of("decode"), two_microbatch=False, shared_expert_side_stream=False)
    a_plan = dataclasses.replace(plan, streams=streams, decode=dataclasses.replace(inst, streams=None))
    a_step = shard(model, a_plan, "decode", batch=mb, length=context, quant=quant)
    e_inst = dataclasses.replace(inst, ranks=inst.ffn_ranks, ffn_ranks=0, attention=Attention(dp=inst.ffn_ranks),
                                 o_proj_tp=1, dense_tp=1, embed_tp=1, lm_head_tp=1, streams=None)
    e_plan = dataclasses.replace(a_plan, decode=e_inst, prefill=None)
    e_step = shard(model, e_plan, "decode", batch=math.ceil(mb / domains), length=context, quant=quant)
    a_layers = tuple(layer_time(_attention_layer(layer), a_plan, system) for layer in a_step.layers)
    e_parts = [(i, _expert_layer(layer)) for i, layer in enumerate(e_step.layers)]
    e_times = {i: layer_time(layer, e_plan, system) for i, layer in e_parts if layer is not None}
    h, k = model.hidden_size, model.num_experts_per_tok
    tokens = a_step.tokens  # per attention die in a microbatch
    rows_out = tokens * k
    senders = attention_dies // domains  # one domain's dies send a microbatch
    rows_in = rows_out * senders / expert_dies * plan.eplb.imbalance
    act = quant.activation.bytes_per_element() if quant.activation.quantised else 2.0
    a2e = _transfer(rows_out, rows_in, h * act, senders, expert_dies, system)
    e2a = _transfer(rows_out, rows_in, h * 2.0, senders, expert_dies, system)
    sequence = []
    for i, lt in enumerate(a_layers):
        f = e_times[i].time if i in e_times else 0.0
        sequence += [(lt.time, f, i in e_times)] * lt.repeat
    time = schedule(sequence, m, a2e, e2a, domains)
    experts = StepTime("decode", sum(t.time * t.repeat for t in e_times.values()), tuple(e_times.values()))
    attention = StepTime("decode", sum(t.time * t.repeat for t in a_layers), a_layers)
    return AfStep(time=time, microbatches=m, domains=domains, attention=attention, experts=experts, a2e=a2e,
                  e2a=e2a, attention_busy=m * attention.time, expert_busy=m * domains * experts.time,
                  attention_memory=_attention_memory(model, plan, a_step, quant, system, context, m),
                  expert_memory=_expert_memory(model, plan, e_step, quant, system))


def _expert_bytes(model: ModelConfig, plan: Plan, quant: QuantScheme) -> tuple[float, float]:
    """(bytes of the routed experts one expert die holds, bytes of the shared experts) over all layers (+ MTP)."""
    inst = plan.instance("decode")
    pc = accounting.parameters(model)
    local = math.ceil((model.n_routed_experts + plan.eplb.redundant_experts) / inst.moe.ep)
    share = local / model.n_routed_experts / inst.moe.tp
    counts = [pc.by_class] + ([pc.mtp_by_class] if plan.mtp.depth else [])
    routed, shared = (sum(c.get(cls, 0.0) for c in counts) for cls in ("routed_experts", "shared_experts"))
    return (routed * share * quant.weights("routed_experts").bytes_per_element(),
            shared * quant.weights("shared_experts").bytes_per_element())


def _attention_memory(model: ModelConfig, plan: Plan, step: RankStep, quant: QuantScheme, system: System,
                      context: int, m: int) -> Memory:
    """An attention die: the co-located weights less the experts, every microbatch's KV cache."""
    routed, shared = _expert_bytes(model, plan, quant)
    weights = weight_bytes(model, plan, "decode", quant) - routed - shared
    return Memory(weights=weights, kv_cache=m * kv_bytes(model, plan, step, quant, context),
                  activations=activation_bytes(step), comm_buffers=plan.comm_buffer,
                  capacity=system.chip_spec.hbm.usable)


def _expert_memory(model: ModelConfig, plan: Plan, step: RankStep, quant: QuantScheme, system: System) -> Memory:
    routed, shared = _expert_bytes(model, plan, quant)
    ops = [o for layer in step.layers for o in layer.ops if o.name in EXPERT_OPS]
    live = max((o.bytes_read - o.weight_bytes + o.bytes_written for o in ops), default=0.0)
    return Memory(weights=routed + shared, kv_cache=0.0, activations=2.0 * live, comm_buffers=plan.comm_buffer,
                  capacity=system.chip_spec.hbm.usable)
