"""One rank's work under a plan: the op graph cut to the rank's tokens, heads and experts, with collectives inserted.

The graph builder gives the ops of a step for a batch. A rank under the plan sees:
- attention side: its DP share of the sequences; under context parallelism 1/cp of the tokens (the zig-zag split
  balances the causal work, so every token-proportional quantity divides by cp); heads split by attention TP (MLA
  approximated as 1/tp of the tokens with every head; GQA cut exactly: the die's query and KV heads, the latter
  replicated when fewer than the dies, on all of the group's tokens, GQA_HEADS). The
  latent path that has no head dimension (q_a / kv_a projections, their norms, the cache write) and the whole DSA
  indexer are replicated: every die of an attention-TP group runs them on the group's tokens (SGLang and vLLM build
  them as replicated linears);
- after attention the group's tokens are split over its dies (SGLang DP attention with an all-to-all MoE backend,
  LayerCommunicator's SCATTERED mode; vLLM's sequence-parallel MoE): the row-parallel o_proj's partial sums are
  reduce-scattered (or all-reduced and chunked, `attention.tp_reduce`) and the next layer's attention all-gathers
  the group's tokens again after its input norm. Everything between sees the die's share, 1/tp of the group's tokens;
- o_proj, dense FFN, LM head: the die's share gathered from their TP group, weights split across it; o_proj is split
  over at least the attention-TP group, whose heads it reduces;
- routed experts: the rank's experts ((routed + redundant) / ep) fed with its share's top-k rows (gathered over the
  MoE-TP group) times the routing imbalance (busiest rank / mean), weights read once per touched expert;
- MoE tensor parallelism without EP (moe.tp > 1, ep 1): no token leaves its rank. Every die of the group holds a
  1/tp slice of every expert's intermediate dimension, so the group's hidden states are all-gathered after the FFN
  norm, the gate, the local routing, the experts, their finalize (moe_combine) and the shared expert (split as a
  dense TP MLP) run on all of the group's tokens, and the partial sums are reduce-scattered back to each die's share
  (an all-reduce of the hidden state in bytes): SGLang's Qwen3MoeSparseMoeBlock (python/sglang/srt/models/
  qwen3_moe.py: experts then tensor_model_parallel_all_reduce) and vllm-ascend's all-gather MoE path
  (vllm_ascend/ops/fused_moe/token_dispatcher.py TokenDispatcherWithAllGather: npu_moe_init_routing on the rank's
  own rows, npu_moe_finalize_routing, the FusedMoE's all-reduce after it); no all-to-all, no re-routing;
- kv_b_proj of an MHA-mode prefill: every key the rank attends to, under CP the whole gathered sequence.
- a prefill's MoE routing passes (init_routing, re_routing, the un-sort) and its bulk all-to-alls, unless its
  tokens per die fit the fused dispatch (`moe.fused_dispatch_tokens`, vllm-ascend's MC2 capacity), which routes
  inside its kernel as decode's does; no re-routing where the experts' rows never leave the rank.
Collectives are placed between the op that produces their input and the op that consumes their output.

A step is memoised by the content of what it is cut from (the model, the plan, the quantisation, the phase and the
scenario's batch, length and cached tokens): sweep points along a rate (HBM bandwidth) or a figure the step does not
read (MTP acceptance) share it, and a refusal is raised anew.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

from npusim.errors import NpusimError
from npusim.graph import accounting
from npusim.graph.builder import build_graph
from npusim.graph.ops import ModelGraph, Op
from npusim.memo import Lru
from npusim.parallel.collectives import Collective
from npusim.spec.draft import load_draft
from npusim.spec.model import ModelConfig
from npusim.spec.plan import Instance, ModelCode, Plan
from npusim.spec.quant import QuantScheme

ROUTED = ("experts_gate_up", "experts_swiglu", "experts_down", "moe_re_routing", "moe_unsort")
REROUTING = ("moe_re_routing", "moe_unsort")  # only where an all-to-all brought the rows (EP or MoE TP > 1)
ROUTING = ("moe_init_routing", *REROUTING)  # the bulk path's passes; the fused dispatch routes inside its kernel
DENSE_FFN = ("gate_up_proj", "swiglu", "down_proj")
O_PROJ = ("o_proj", "o_b_proj")
HEAD = ("lm_head",)
EMBED = ("embedding",)
TOKEN_KEYS = ("m", "tokens", "rows", "pairs", "sequences")
SIDE_STREAM_OPS = ("shared_gate_up", "shared_swiglu", "shared_down")
GATING = ("moe_gate_cast", "moe_gate", "moe_init_routing", "moe_combine")
# up-projects (or repeats) every key the rank attends to: under CP the whole gathered sequence
ALL_KEYS = ("kv_b_proj", "k_rope_repeat")
# GQA's head-parallel attention under attention TP: each die runs its query heads and its KV heads (replicated when
# the KV heads are fewer than the dies) on all of its group's tokens, as SGLang's / vLLM's QKVParallelLinear and
# attention split them; cut from the graph of a model with the die's heads
GQA_HEADS = ("qkv_proj", "qk_head_norm", "rope", "kv_cache_update", "attention", "draft_qkv_embed")
# no head dimension (the latent path), or never split (the DSA indexer: "no tensor parallel, just replicated" in
# SGLang's and vLLM's Indexer)
REPLICATED = ("q_a_proj", "q_norm", "kv_a_proj", "kv_proj", "kv_norm", "kv_cache_update", "idx_q_b_proj", "idx_k_proj",
              "idx_k_norm", "idx_rope", "idx_hadamard", "idx_q_quant", "idx_weights_proj", "idx_compressor",
              "indexer_cache_update", "lightning_indexer")


@dataclass(frozen=True)
class Comm:
    """A collective that consumes the output of op `after` and feeds op `before` ('' = layer boundary)."""

    name: str
    collective: Collective
    after: str
    before: str


@dataclass(frozen=True)
class RankLayer:
    name: str
    ops: tuple[Op, ...]
    comms: tuple[Comm, ...]
    repeat: int
    host_bytes: float = 0.0  # KV rows gathered from host memory before attention (KV offload)


@dataclass(frozen=True)
class RankStep:
    """What one (busiest) rank executes for one prefill or one decode step."""

    phase: str
    instance: Instance
    sequences: float  # sequences per attention rank (fractional under CP)
    tokens: int  # new tokens per attention rank
    layers: tuple[RankLayer, ...]
    graph: ModelGraph  # the unsharded graph the rank's ops were cut from


def scale_op(op: Op, *, tokens: float = 1.0, n_div: int = 1, k_div: int = 1, weights: float | None = None) -> Op:
    """The op with its token dimension scaled and its n / k dimensions split (weights scale as 1/(n_div k_div))."""
    w_scale = 1.0 / (n_div * k_div) if weights is None else weights
    shape = dict(op.shape)
    for key in TOKEN_KEYS:
        if key in shape:
            shape[key] = max(1, math.ceil(shape[key] * tokens))
    for key, div in (("n", n_div), ("k", k_div), ("width", n_div)):
        if key in shape and div > 1:
            shape[key] = max(1, shape[key] // div)
    act_in = op.bytes_read - op.weight_bytes
    w = op.weight_bytes * w_scale
    return dataclasses.replace(op, shape=shape, flops=op.flops * tokens / (n_div * k_div),
                               bytes_read=act_in * tokens / k_div + w, bytes_written=op.bytes_written * tokens / n_div,
                               weight_bytes=w)


def _touched(experts: float, rows: float) -> float:
    """Expected distinct experts hit by `rows` uniformly routed rows among `experts` (each read once)."""
    if experts <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - 1.0 / experts) ** rows)


def _routed(op: Op, tokens: float, inst: Instance, model: ModelConfig, plan: Plan) -> Op:
    rows = op.shape["rows"] * tokens * plan.eplb.imbalance
    local = math.ceil((model.n_routed_experts + plan.eplb.redundant_experts) / inst.moe.ep)
    hit = _touched(local, rows)
    per_expert = op.weight_bytes / max(op.shape.get("experts", 1), 1)
    scaled = scale_op(op, tokens=tokens * plan.eplb.imbalance, n_div=inst.moe.tp if op.name != "experts_down" else 1,
                       k_div=inst.moe.tp if op.name == "experts_down" else 1, weights=0.0)
    w = per_expert * hit / inst.moe.tp if op.weight_bytes else 0.0
    shape = dict(scaled.shape)
    if "experts" in shape:
        shape["experts"] = max(1, round(hit))
    return dataclasses.replace(scaled, shape=shape, bytes_read=scaled.bytes_read + w, weight_bytes=w)


def tp_experts(inst: Instance) -> bool:
    """MoE tensor parallelism without expert parallelism: every die holds a slice of every expert, tokens stay."""
    return inst.moe.ep == 1 and inst.moe.tp > 1


def shard_op(op: Op, inst: Instance, model: ModelConfig, plan: Plan, token_scale: float) -> Op:
    """One op as the rank runs it; `token_scale` is the rank's share of the graph's tokens on the attention side
    (the whole attention-TP group's), `die` the share each die keeps once attention has split them."""
    a = inst.attention
    die = token_scale / a.tp
    if op.name in ROUTED:
        return _routed(op, die * inst.moe.tp, inst, model, plan)
    if op.name in DENSE_FFN:
        d = inst.dense_tp
        split_k = op.name == "down_proj"
        return scale_op(op, tokens=die * d, n_div=1 if split_k else d, k_div=d if split_k else 1)
    if op.name in O_PROJ:
        o = inst.o_proj_group
        return scale_op(op, tokens=die * o, k_div=o)
    if op.name in HEAD:
        t = inst.lm_head_tp
        return scale_op(op, tokens=die * t, n_div=t)
    if op.name in EMBED:
        return scale_op(op, tokens=token_scale, weights=1.0 / inst.embed_tp)
    if tp_experts(inst) and op.name in SIDE_STREAM_OPS:  # the shared expert split as a dense TP MLP
        g = inst.moe.tp
        split_k = op.name == "shared_down"
        return scale_op(op, tokens=die * g, n_div=1 if split_k else g, k_div=g if split_k else 1)
    if tp_experts(inst) and op.name in GATING:  # the group's tokens, gathered before the gate
        return scale_op(op, tokens=die * inst.moe.tp, weights=1.0)
    if op.name in SIDE_STREAM_OPS or op.name in GATING:
        return scale_op(op, tokens=die, weights=1.0)
    if op.name in ALL_KEYS:
        return scale_op(op, tokens=1.0 / a.tp, weights=1.0 / a.tp)
    if op.name in REPLICATED and not (model.is_gqa and op.name == "kv_cache_update"):  # GQA's K/V split by head
        return scale_op(op, tokens=token_scale, weights=1.0)
    # attention side: tokens by DP/CP share, heads split by attention TP (head-parallel approximation)
    return scale_op(op, tokens=die, weights=1.0 / a.tp)


def rank_heads(model: ModelConfig, tp: int) -> ModelConfig:
    """The GQA model one die of an attention-TP group runs: its share of the query heads, and of the KV heads (at least
    one: with fewer KV heads than dies each is replicated, SGLang's QKVParallelLinear num_kv_head_replicas)."""
    return dataclasses.replace(model, num_attention_heads=math.ceil(model.num_attention_heads / tp),
                               num_key_value_heads=max(1, model.num_key_value_heads // tp))


def _act_bytes(quant: QuantScheme) -> float:
    return quant.activation.bytes_per_element() if quant.activation.quantised else 2.0


def _comms(name: str, ops: tuple[Op, ...], inst: Instance, model: ModelConfig, quant: QuantScheme, tokens: float,
           seq_tokens: float, phase: str, code: ModelCode = ModelCode()) -> list[Comm]:
    """Collectives of one layer type (its sharded `ops`) for a rank handling `tokens` new attention-side tokens."""
    h = model.hidden_size
    a = inst.attention
    names = [o.name for o in ops]
    out: list[Comm] = []

    def add(name, kind, size, group, after, before, bulk=False, hccl=False):
        if group > 1 and after in names and (before in names or before == ""):
            out.append(Comm(name, Collective(kind, size, group, bulk=bulk, hccl=hccl), after, before))

    if phase == "prefill" and a.cp > 1 and "attention" in names:
        row = accounting.kv_row_bytes(model, quant) + (  # indexer keys only where a rank scores them
            accounting.indexer_row_bytes(model, quant) if "lightning_indexer" in names else 0.0)
        kv_bytes = seq_tokens * row  # the whole sequence's new cache rows, gathered on every rank
        consumer = next(n for n in ("lightning_indexer", "kv_b_proj", "attention") if n in names)
        producer = next(n for n in ("indexer_cache_update", "kv_compressor", "kv_cache_update") if n in names)
        if a.cp_mode == "allgather":
            add("cp_kv_allgather", "all_gather", kv_bytes, a.cp, producer, consumer)
        else:
            add("cp_kv_ring_first", "p2p", kv_bytes / a.cp, 2, producer, consumer)
            rest = Collective("p2p", kv_bytes * (a.cp - 2) / a.cp, 2)
            if a.cp > 2:
                out.append(Comm("cp_kv_ring_rest", rest, consumer, "attention" if consumer != "attention" else ""))
    die = tokens / a.tp  # each die's share once attention has split the group's tokens
    first = next((n for n in ("q_a_proj", "qkv_proj") if n in names), None)  # MLA's latent path, GQA's fused qkv
    if first and a.tp > 1:  # the split tokens of the last layer gathered again for attention
        prev = names[names.index(first) - 1]
        add("attn_tp_all_gather", "all_gather", tokens * h * 2, a.tp, prev, first)
    o_op = next((n for n in O_PROJ if n in names), None)
    o = inst.o_proj_group
    if o_op and o > 1:
        prev = names[names.index(o_op) - 1]
        nxt = names[names.index(o_op) + 1] if names.index(o_op) + 1 < len(names) else ""
        if o > a.tp:  # heads of other attention-TP groups' tokens brought in
            add("o_proj_all_to_all", "all_to_all", tokens * model.num_attention_heads *
                (model.v_head_dim or model.head_dim) * 2 / a.tp, o, prev, o_op, hccl=True)  # torch all_to_all
        kind = "all_reduce" if a.tp > 1 and a.tp_reduce == "all_reduce" and o == a.tp else "reduce_scatter"
        add("o_proj_reduce_scatter" if kind == "reduce_scatter" else "o_proj_all_reduce", kind, die * o * h * 2, o,
            o_op, nxt)
    if "experts_gate_up" in names and tp_experts(inst):  # the hidden state gathered, the partial sums reduced
        g = inst.moe.tp
        add("moe_tp_all_gather", "all_gather", die * g * h * 2, g, "ffn_norm", names[names.index("ffn_norm") + 1])
        add("moe_tp_reduce_scatter", "reduce_scatter", die * g * h * 2, g, "moe_combine", "")
    elif "experts_gate_up" in names and inst.moe.ep * inst.moe.tp > 1:
        k, sent = model.num_experts_per_tok, die * inst.moe.tp  # every die of an expert's MoE-TP group gets its rows
        bulk = "moe_re_routing" in names  # a prefill's double routing: the rows are permuted around the all-to-all
        g = inst.moe.ep * inst.moe.tp
        if bulk and code.split_exchanges:  # the int32 tokens-per-expert counts, all_to_all_single'd before the rows
            # (cann-recipes-infer models/deepseek_r1/models/modeling_deepseek.py:652-655 @ fbc225d)
            add("moe_count_all_to_all", "all_to_all", model.n_routed_experts * 4.0, g, "moe_init_routing",
                "moe_re_routing", bulk)
        add("moe_dispatch", "all_to_all", sent * k * h * _act_bytes(quant), g,
            "moe_init_routing" if bulk else "moe_gate", "moe_re_routing" if bulk else "experts_gate_up", bulk)
        if bulk and code.split_exchanges and quant.activation.quantised:  # the INT8 rows' fp32 scales (:674-679)
            add("moe_scale_all_to_all", "all_to_all", sent * k * 4.0, g, "moe_init_routing", "moe_re_routing", bulk)
        add("moe_combine_all_to_all", "all_to_all", sent * k * h * 2, g,
            "moe_unsort" if bulk else "experts_down", "moe_combine", bulk)
    if "gate_up_proj" in names and inst.dense_tp > 1:
        d = inst.dense_tp
        add("dense_all_gather", "all_gather", die * d * h * 2, d, "ffn_norm", "gate_up_proj")
        add("dense_reduce_scatter", "reduce_scatter", die * d * h * 2, d, "down_proj", "")
    if "lm_head" in names and inst.lm_head_tp > 1:
        t = inst.lm_head_tp
        m = next(o for o in ops if o.name == "lm_head").shape["m"]  # tokens gathered over the TP group
        add("lm_head_all_gather", "all_gather", m * h * 2, t, "final_norm", "lm_head")
    if "embedding" in names and inst.embed_tp > 1 and name == "embedding":
        out.append(Comm("embed_all_reduce", Collective("all_reduce", tokens * h * 2, inst.embed_tp), "embedding", ""))
    return out


def _offload_bytes(ops: tuple[Op, ...], plan: Plan, model: ModelConfig, quant: QuantScheme, phase: str) -> float:
    """Decode with the KV cache in host memory: every query's selected rows (top-k, or the whole context of a dense
    layer) that are not already on the device from earlier steps cross the host link."""
    if phase != "decode" or not plan.kv_offload.enabled:
        return 0.0
    att = next((o for o in ops if o.name == "attention"), None)
    if att is None:
        return 0.0
    s = att.shape
    rows = s["tokens"] * min(s.get("topk") or s["keys"], s["keys"])
    return rows * accounting.kv_row_bytes(model, quant) * (1.0 - plan.kv_offload.reuse)


def _unrouted(inst: Instance, die_tokens: float) -> tuple[str, ...]:
    """Routing passes a prefill step does not run: all of them when its die's tokens fit the fused dispatch
    (moe.fused_dispatch_tokens), the re-routing when the experts' rows never leave the rank (EP = 1)."""
    if tp_experts(inst):  # no dispatch kernel to route in: the rank routes its rows itself, none leave it
        return REROUTING
    if die_tokens <= inst.moe.fused_dispatch_tokens:
        return ROUTING
    return REROUTING if inst.moe.ep * inst.moe.tp == 1 else ()


_steps: Lru[RankStep] = Lru(1024)


def shard(model: ModelConfig, plan: Plan, phase: str, *, batch: int, length: int, quant: QuantScheme,
          cached: int = 0) -> RankStep:
    """The busiest rank's step. `batch` is the instance's global batch; `length` the prompt tokens computed now
    (prefill, on top of `cached` per sequence already in the cache) or the context (decode). Memoised by content
    (see the module)."""
    key = hashlib.blake2b(repr((model, plan, phase, batch, length, quant, cached)).encode(), digest_size=20).hexdigest()
    return _steps.get(key, lambda: _shard(model, plan, phase, batch, length, quant, cached))


def clear_memo() -> None:
    _steps.clear()


def _shard(model: ModelConfig, plan: Plan, phase: str, batch: int, length: int, quant: QuantScheme,
           cached: int) -> RankStep:
    inst = plan.instance(phase)
    a = inst.attention
    replicas = a.dp * inst.instances
    if phase == "decode" and a.cp > 1:
        raise NpusimError("context parallelism is modelled for prefill only; use attention.cp: 1 for decode",
                          file=plan.provenance.file if plan.provenance else None, field="decode.attention.cp")
    per_replica = math.ceil(batch / replicas)
    mtp = plan.mtp.depth
    draft = load_draft(plan.mtp.draft, file=plan.provenance.file if plan.provenance else None) \
        if plan.mtp.draft and mtp else None
    dense = phase == "prefill" and plan.prefill_attention.dense(cached + length)
    graph = build_graph(model, phase, per_replica, length, mtp_tokens=mtp, quant=quant, cached=cached,
                        dense_prefill=dense, code=plan.model_code, local_routing=tp_experts(inst), draft=draft)
    token_scale = 1.0 / a.cp if phase == "prefill" else 1.0
    tokens = graph.scenario["tokens"] * token_scale
    seq_tokens = graph.scenario["tokens"]
    layers = []
    dropped = _unrouted(inst, tokens / a.tp)
    heads = {}  # GQA under attention TP: the die's head-parallel ops, by layer and name
    if model.is_gqa and a.tp > 1:
        rank = build_graph(rank_heads(model, a.tp), phase, per_replica, length, mtp_tokens=mtp, quant=quant,
                           cached=cached, dense_prefill=dense, code=plan.model_code, local_routing=tp_experts(inst),
                           draft=rank_heads(draft, a.tp) if draft else None)
        heads = {(lg.name, op.name): scale_op(op, tokens=token_scale, weights=1.0)
                 for lg in rank.layers for op in lg.ops if op.name in GQA_HEADS}
    for lg in graph.layers:
        ops = tuple(heads.get((lg.name, op.name)) or shard_op(op, inst, model, plan, token_scale)
                    for op in lg.ops if op.name not in dropped)
        comms = tuple(_comms(lg.name, ops, inst, model, quant, tokens, seq_tokens, phase, plan.model_code))
        layers.append(RankLayer(lg.name, ops, comms, lg.repeat, _offload_bytes(ops, plan, model, quant, phase)))
    return RankStep(phase=phase, instance=inst, sequences=per_replica * token_scale, tokens=math.ceil(tokens),
                    layers=tuple(layers), graph=graph)
