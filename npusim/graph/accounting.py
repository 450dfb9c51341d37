"""What users check first: parameters (total, activated), weight bytes per quantisation, cache bytes per token.

Counted from the config alone, independently of the op graph, so tests can cross-check the two.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from npusim.spec.model import OVERLAP_RATIO, ModelConfig
from npusim.spec.quant import BF16, WEIGHT_CLASSES, QuantScheme

UNQUANTISED = "unquantised"  # norms, MoE gate, indexer weights_proj, mHC mixing, compressor position bias, sinks


def kv_row_bytes(model: ModelConfig, quant: QuantScheme) -> float:
    """One KV cache row: MLA latent (kv_lora_rank) or V4 nope part in the cache format, RoPE part in BF16; GQA's K
    and V of every KV head, all of it in the cache format."""
    if model.is_gqa:
        return quant.kv_cache.bytes_for(kv_row_elements(model))
    nope = model.head_dim - model.qk_rope_head_dim if model.is_v4 else model.kv_lora_rank
    return quant.kv_cache.bytes_for(nope) + BF16.bytes_for(model.qk_rope_head_dim)


def kv_row_elements(model: ModelConfig) -> int:
    if model.is_gqa:
        return 2 * model.num_key_value_heads * model.head_dim
    return model.head_dim if model.is_v4 else model.kv_lora_rank + model.qk_rope_head_dim


def indexer_row_bytes(model: ModelConfig, quant: QuantScheme) -> float:
    """One indexer key row (all of it quantised, RoPE dims included)."""
    return quant.indexer_cache.bytes_for(model.index_head_dim)


@dataclass(frozen=True, kw_only=True)
class CacheFootprint:
    """Cache growth per token of context, per layer kind and for the whole model (fixed windows apart)."""

    per_layer_bytes: dict[str, float]
    per_layer_elements: dict[str, float]
    bytes_per_token: float
    elements_per_token: float
    fixed_bytes_per_sequence: float


def cache_footprint(model: ModelConfig, quant: QuantScheme) -> CacheFootprint:
    kv_b, kv_e = kv_row_bytes(model, quant), kv_row_elements(model)
    idx_b, idx_e = (indexer_row_bytes(model, quant), model.index_head_dim) if model.has_indexer else (0.0, 0)
    if not model.is_v4:
        kinds = {"kv": (kv_b, kv_e), "indexer": (idx_b, idx_e)} if model.has_indexer else {"kv": (kv_b, kv_e)}
        per_b = {k: b for k, (b, _) in kinds.items()}
        per_e = {k: float(e) for k, (_, e) in kinds.items()}
        n, ni = model.num_hidden_layers, model.indexer_layer_count  # shared-indexer layers hold no indexer keys
        return CacheFootprint(per_layer_bytes=per_b, per_layer_elements=per_e, bytes_per_token=n * kv_b + ni * idx_b,
                              elements_per_token=n * kv_e + ni * idx_e, fixed_bytes_per_sequence=0.0)
    per_b: dict[str, float] = {}
    per_e: dict[str, float] = {}
    total_b = total_e = 0.0
    for layer in range(model.num_hidden_layers):
        r = model.compress_ratio(layer)
        name = model.attention_kind(layer)
        b = kv_b / r if r else 0.0
        e = kv_e / r if r else 0.0
        if r == OVERLAP_RATIO:
            b, e = b + idx_b / r, e + idx_e / r
        per_b[name], per_e[name] = b, e
        total_b, total_e = total_b + b, total_e + e
    fixed = model.num_hidden_layers * model.sliding_window * kv_b
    return CacheFootprint(per_layer_bytes=per_b, per_layer_elements=per_e, bytes_per_token=total_b,
                          elements_per_token=total_e, fixed_bytes_per_sequence=fixed)


# ----------------------------------------------------------------------------------------------- parameters


@dataclass(frozen=True, kw_only=True)
class ParamCount:
    """Parameters (elements) per weight class for the main model; the MTP layers' per class apart, as checkpoints
    count them."""

    by_class: dict[str, float]
    activated: float
    indexer: float
    mtp_by_class: dict[str, float]

    @property
    def mtp(self) -> float:
        return sum(self.mtp_by_class.values())

    @property
    def total(self) -> float:
        return sum(self.by_class.values())

    def weight_bytes(self, quant: QuantScheme) -> float:
        """Bytes of the main model's weights stored under `quant` (scales included)."""
        return sum(n * (BF16 if c == UNQUANTISED else quant.weights(c)).bytes_per_element()
                   for c, n in self.by_class.items())


def _add(acc: dict[str, float], cls: str, n: float) -> None:
    acc[cls] = acc.get(cls, 0.0) + n


def _attention(model: ModelConfig, layer: int, acc: dict[str, float]) -> float:
    """Attention (+ indexer, compressor, mHC) parameters of one layer into `acc`; returns the indexer's share."""
    h, nh, ql, rope = model.hidden_size, model.num_attention_heads, model.q_lora_rank, model.qk_rope_head_dim
    _add(acc, UNQUANTISED, 2 * h + ql)  # attn_norm, ffn_norm, q_norm (the q latent's)
    if model.is_gqa:
        hd, kvh = model.head_dim, model.num_key_value_heads
        _add(acc, "attention", h * (nh + 2 * kvh) * hd + nh * hd * h)  # q, k, v, o
        _add(acc, UNQUANTISED, 2 * hd * model.qk_norm)  # the q and k head norms
        return 0.0
    if model.is_v4:
        hd = model.head_dim
        _add(acc, "attention", h * ql + ql * nh * hd + h * hd + nh * hd * model.o_lora_rank
             + model.o_groups * model.o_lora_rank * h)
        mix = (2 + model.hc_mult) * model.hc_mult
        _add(acc, UNQUANTISED, hd + nh + 2 * (mix * model.hc_mult * h + mix + 3))  # kv_norm, sink, hc_attn/hc_ffn
        r = model.compress_ratio(layer)
        if r:
            coff = 2 if r == OVERLAP_RATIO else 1
            _add(acc, "attention", 2 * h * coff * hd)
            _add(acc, UNQUANTISED, r * coff * hd + hd)  # ape, norm
        if r == OVERLAP_RATIO:
            ih, idim = model.index_n_heads, model.index_head_dim
            quantised = ql * ih * idim + 2 * h * 2 * idim
            plain = h * ih + OVERLAP_RATIO * 2 * idim + idim  # weights_proj, compressor ape and norm
            _add(acc, "indexer", quantised)
            _add(acc, UNQUANTISED, plain)
            return quantised + plain
        return 0.0
    nope, v, kvl = model.qk_nope_head_dim, model.v_head_dim, model.kv_lora_rank
    _add(acc, "attention", ql * nh * (nope + rope) + nh * v * h)
    _add(acc, mla_a_class(model), h * ql + h * (kvl + rope))
    _add(acc, "kv_b", kvl * nh * (nope + v))
    _add(acc, UNQUANTISED, kvl)
    if not model.runs_indexer(layer):  # no indexer, or a shared layer reusing an earlier one's top-k
        return 0.0
    ih, idim = model.index_n_heads, model.index_head_dim
    _add(acc, "indexer", ql * ih * idim)
    _add(acc, "indexer_k", h * idim)
    plain = h * ih + 2 * idim  # weights_proj, k LayerNorm weight + bias
    _add(acc, UNQUANTISED, plain)
    return ql * ih * idim + h * idim + plain


def mla_a_class(model: ModelConfig) -> str:
    """Weight class of MLA's q_a_proj and kv_a_proj: V3.2-Exp's INT8 conversion keeps them BF16, R1's (V3)
    quantises them with the rest of attention (spec.quant, ASCEND_INT8_KEEPS_BF16)."""
    return "mla_a" if model.model_type == "deepseek_v32" else "attention"


FFN_CLASSES = ("routed_experts", "shared_experts", "dense_ffn")


def _ffn(model: ModelConfig, layer: int, acc: dict[str, float]) -> float:
    """FFN parameters of one layer into `acc`; returns the FFN weights one token activates (the gate is always)."""
    h = model.hidden_size
    if model.is_dense_ffn(layer):
        n = 3 * h * model.intermediate_size
        _add(acc, "dense_ffn", n)
        return n
    expert = 3 * h * model.moe_intermediate_size
    _add(acc, "routed_experts", model.n_routed_experts * expert)
    _add(acc, "shared_experts", model.n_shared_experts * expert)
    _add(acc, UNQUANTISED, model.n_routed_experts * h + model.n_routed_experts)  # gate weight and bias
    return (model.num_experts_per_tok + model.n_shared_experts) * expert


def _layer(model: ModelConfig, layer: int) -> tuple[dict[str, float], float, float]:
    """(parameters per class, activated parameters, indexer parameters) of decoder layer `layer`."""
    acc: dict[str, float] = {}
    indexer = _attention(model, layer, acc)
    ffn_active = _ffn(model, layer, acc)
    active = sum(n for c, n in acc.items() if c not in FFN_CLASSES) + ffn_active
    return acc, active, indexer


@functools.lru_cache(maxsize=64)
def parameters(model: ModelConfig) -> ParamCount:
    """The model's parameters, counted once per model content (a frozen spec: equal fields, equal counts; every
    sweep point's memory reads them). Shared: its dicts are not to be changed."""
    by_class: dict[str, float] = {c: 0.0 for c in WEIGHT_CLASSES}
    by_class[UNQUANTISED] = 0.0
    activated = indexer = 0.0
    for layer in range(model.num_hidden_layers):
        acc, active, idx = _layer(model, layer)
        for c, n in acc.items():
            by_class[c] += n
        activated += active
        indexer += idx
    h, vocab = model.hidden_size, model.vocab_size
    head_mix = model.hc_mult * model.hc_mult * h + 2 * model.hc_mult if model.hc_mult > 1 else 0
    by_class["embedding"] += vocab * h
    by_class["lm_head"] += vocab * h
    by_class[UNQUANTISED] += h + head_mix  # final norm, hc_head
    activated += vocab * h + h + head_mix  # the LM head is a full GEMM; the embedding is a row lookup
    mtp: dict[str, float] = {}
    for extra in range(model.num_nextn_predict_layers):
        acc, _, _ = _layer(model, model.num_hidden_layers + extra)
        for c, n in acc.items():
            _add(mtp, c, n)
        _add(mtp, mtp_projection_class(model), 2 * h * h)  # eh_proj (V4: e_proj and h_proj)
        _add(mtp, UNQUANTISED, 3 * h)  # enorm, hnorm, shared-head norm
    return ParamCount(by_class={c: n for c, n in by_class.items() if n}, activated=activated, indexer=indexer,
                      mtp_by_class=mtp)


def mtp_projection_class(model: ModelConfig) -> str:
    """Weight class of the MTP layer's input projection. The rest of the MTP layer is a decoder layer, quantised as
    the others: cann-recipes-infer's conversions (@ fbc225d) apply one rule to every layer index up to
    num_hidden_layers + num_nextn_predict_layers. V3 / V3.2 leave eh_proj BF16 (models/deepseek_r1/utils/
    convert_model.py:112, models/deepseek_v3_2_exp/utils/convert_model.py:182: on the ignore list; the V3.2 model
    builds it with quant_config None, modeling_deepseek.py:2608-2613); V4 quantises e_proj and h_proj at 8 bits with
    its attention (models/deepseek_v4/utils/convert_model.py:245-246)."""
    return "attention" if model.is_v4 else UNQUANTISED
