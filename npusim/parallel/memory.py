"""HBM per rank: weights (by quantisation and sharding), KV and indexer caches, activations, communication buffers.

A configuration whose total exceeds the chip's usable HBM is refused with the breakdown, before any time is predicted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from npusim.errors import NpusimError
from npusim.graph import accounting
from npusim.parallel.shard import RankStep
from npusim.spec import units
from npusim.spec.chip import Chip
from npusim.spec.draft import load_draft
from npusim.spec.model import ModelConfig
from npusim.spec.plan import Instance, Plan
from npusim.spec.quant import BF16, QuantScheme


@dataclass(frozen=True)
class Memory:
    """Bytes per rank of one instance role."""

    weights: float
    kv_cache: float
    activations: float
    comm_buffers: float
    capacity: float

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.activations + self.comm_buffers

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def as_dict(self) -> dict[str, float]:
        return {"weights": self.weights, "kv_cache": self.kv_cache, "activations": self.activations,
                "comm_buffers": self.comm_buffers, "total": self.total, "capacity": self.capacity}

    def describe(self) -> str:
        parts = ", ".join(f"{k} {units.format(v, 'bytes', 3)}" for k, v in self.as_dict().items() if k != "capacity")
        return f"{parts} of {units.format(self.capacity, 'bytes', 3)} usable"


def _o_proj_params(model: ModelConfig) -> float:
    """One layer's o_proj (V4: o_b_proj), split over its own group."""
    if model.is_v4:
        return model.o_groups * model.o_lora_rank * model.hidden_size
    return model.num_attention_heads * (model.head_dim if model.is_gqa else model.v_head_dim) * model.hidden_size


def _latent_params(model: ModelConfig) -> float:
    """One layer's projections into the latent, which have no head dimension: q_a_proj and kv_a_proj_with_mqa
    (V4: wq_a and wkv). Every rank of an attention-TP group holds them whole, as shard.REPLICATED runs them: they are
    ReplicatedLinear in cann-recipes-infer @ fbc225d, models/deepseek_v3_2_exp/models/modeling_deepseek.py:831 and
    :846, models/deepseek_r1/models/modeling_deepseek.py:853 and :868, models/deepseek_v4/models/modeling_deepseek.py
    :738 and :756. GQA has none."""
    if model.is_gqa:
        return 0.0
    h, ql = model.hidden_size, model.q_lora_rank
    return h * ql + h * (model.head_dim if model.is_v4 else model.kv_lora_rank + model.qk_rope_head_dim)


def _gqa_kv_params(model: ModelConfig, tp: int, layers: int) -> tuple[float, float]:
    """GQA's K and V projections over `layers` layers: in all, and on one rank of an attention-TP group, which holds
    its max(1, kv_heads / tp) KV heads (replicated once the TP degree exceeds the KV heads, SGLang's / vLLM's
    QKVParallelLinear); (0, 0) for MLA and V4."""
    if not model.is_gqa:
        return 0.0, 0.0
    per_head = 2.0 * model.hidden_size * model.head_dim * layers
    return per_head * model.num_key_value_heads, per_head * max(1, model.num_key_value_heads // tp)


def weight_bytes(model: ModelConfig, plan: Plan, phase: str, quant: QuantScheme) -> float:
    """Weights one rank stores: each class divided by the degree that shards it; with an MTP depth, the MTP layer's
    too, class by class as a decoder layer's (accounting.mtp_projection_class)."""
    inst = plan.instance(phase)
    pc = accounting.parameters(model)
    total = _stored(model, plan, inst, quant, pc.by_class, model.num_hidden_layers)
    if plan.mtp.depth and plan.mtp.draft:
        total += _draft_bytes(load_draft(plan.mtp.draft), model, inst)
    elif plan.mtp.depth:
        total += _stored(model, plan, inst, quant, pc.mtp_by_class, model.num_nextn_predict_layers)
    return inst.busiest_stage(total, model.num_hidden_layers)


def _draft_bytes(draft: ModelConfig, target: ModelConfig, inst: Instance) -> float:
    """An EAGLE-3 draft's BF16 weights on one rank: its decoder layer (q/k/v over twice the hidden width) and lm_head
    split over attention TP like the target's, the embedding (the target's vocabulary) and the fc whole."""
    h, kv = draft.hidden_size, (draft.num_attention_heads + 2 * draft.num_key_value_heads) * draft.head_dim
    split = (2 * h * kv + draft.num_attention_heads * draft.head_dim * h + 3 * h * draft.intermediate_size
             + draft.vocab_size * h) * draft.num_hidden_layers
    whole = target.vocab_size * h + 3 * target.hidden_size * h
    return 2.0 * (split / inst.attention.tp + whole)


def _stored(model: ModelConfig, plan: Plan, inst: Instance, quant: QuantScheme, by_class: dict[str, float],
            layers: int) -> float:
    """Bytes one rank stores of `layers` layers' parameters `by_class`."""
    local_experts = math.ceil((model.n_routed_experts + plan.eplb.redundant_experts) / inst.moe.ep)
    o_proj = _o_proj_params(model) * layers
    whole = _latent_params(model) * layers if accounting.mla_a_class(model) == "attention" else 0.0
    share = {
        "attention": None,  # split below: o_proj over its group, the latent projections whole, the rest by TP
        "kv_b": 1.0 / inst.attention.tp,  # by heads, as the rest of attention
        "mla_a": 1.0,  # V3.2's q_a / kv_a (_latent_params)
        "indexer": 1.0,  # replicated over attention TP (SGLang / vLLM Indexer)
        "indexer_k": 1.0,
        "routed_experts": local_experts / model.n_routed_experts / inst.moe.tp,
        "shared_experts": 1.0 / inst.moe.tp,
        "dense_ffn": 1.0 / inst.dense_tp,
        "lm_head": 1.0 / inst.lm_head_tp,
        "embedding": 1.0 / inst.embed_tp,
        accounting.UNQUANTISED: 1.0,
    }
    total = 0.0
    for cls, n in by_class.items():
        per = BF16.bytes_per_element() if cls == accounting.UNQUANTISED else quant.weights(cls).bytes_per_element()
        if cls == "attention":
            kv, kv_rank = _gqa_kv_params(model, inst.attention.tp, layers)
            total += per * (o_proj / inst.o_proj_group + whole + kv_rank
                            + (n - o_proj - whole - kv) / inst.attention.tp)
        else:
            total += per * n * share[cls]
    return total


def kv_bytes(model: ModelConfig, plan: Plan, step: RankStep, quant: QuantScheme, context: int) -> float:
    """Caches one rank holds at the end of the step: its sequences' rows for every layer of its stage. MLA's latent
    (and V4's shared head) is replicated over attention TP; GQA's KV heads are split over it (replicated once the
    TP degree exceeds the KV heads)."""
    inst = step.instance
    fp = accounting.cache_footprint(model, quant)
    layers_share = inst.busiest_stage(1.0, model.num_hidden_layers)
    if model.is_gqa:
        layers_share /= min(inst.attention.tp, model.num_key_value_heads)
    if step.phase == "prefill" and inst.attention.cp > 1:
        per_layer = fp.bytes_per_token / model.num_hidden_layers
        own = step.sequences * context * fp.bytes_per_token * layers_share
        gathered = step.sequences * inst.attention.cp * context * per_layer  # one layer's whole-sequence KV
        return own + gathered + step.sequences * fp.fixed_bytes_per_sequence
    seqs = step.sequences
    total_len = context + plan.mtp.depth
    resident = total_len * fp.bytes_per_token
    if step.phase == "decode" and plan.kv_offload.enabled:
        # the latent KV lives in host memory; the indexer's keys (it must score every row) and the step's selected
        # rows stay on the device
        kv = min(1.0, accounting.kv_row_bytes(model, quant) * model.num_hidden_layers / fp.bytes_per_token)
        resident *= (1.0 - kv) + kv * min(1.0, (model.index_topk or total_len) / total_len)
    return seqs * (resident + fp.fixed_bytes_per_sequence) * layers_share


CACHE_READERS = ("lightning_indexer", "sparse_flash_attention", "flash_attention", "v4_attention")


def _live(op) -> float:
    """Bytes an op holds live: inputs and outputs, weights apart. Attention and the indexer read the caches, which
    are counted as KV cache, so only their outputs (and queries of the same size) are activations."""
    if op.kind in CACHE_READERS:
        return 2.0 * op.bytes_written
    return op.bytes_read - op.weight_bytes + op.bytes_written


def activation_bytes(step: RankStep) -> float:
    """Peak live activations: the largest op's inputs and outputs, twice for double buffering."""
    return 2.0 * max(_live(op) for layer in step.layers for op in layer.ops)


def comm_groups(plan: Plan, phase: str) -> int:
    inst = plan.instance(phase)
    a = inst.attention
    degrees = {("tp", a.tp), ("cp", a.cp), ("ep", inst.moe.ep * inst.moe.tp), ("o_proj", inst.o_proj_tp),
               ("dense", inst.dense_tp), ("embed", inst.embed_tp), ("lm_head", inst.lm_head_tp), ("pp", inst.pp)}
    return sum(1 for _, d in degrees if d > 1)


def memory(model: ModelConfig, plan: Plan, step: RankStep, quant: QuantScheme, chip: Chip, context: int) -> Memory:
    return Memory(weights=weight_bytes(model, plan, step.phase, quant),
                  kv_cache=kv_bytes(model, plan, step, quant, context),
                  activations=activation_bytes(step),
                  comm_buffers=comm_groups(plan, step.phase) * plan.comm_buffer,
                  capacity=chip.hbm.usable)


def require_fit(mem: Memory, phase: str, where: str) -> None:
    if not mem.fits:
        raise NpusimError(f"the {phase} configuration does not fit in HBM: {mem.describe()} per rank "
                          f"({units.format(mem.total - mem.capacity, 'bytes', 3)} over); use more ranks, a smaller "
                          f"batch or a lighter quantisation", file=where)
