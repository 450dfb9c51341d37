"""Quantisation presets: the storage format of every weight class, the activations and the caches.

A preset is chosen by name (`--quant w8a8c8`). Weight classes are coarse on purpose: the graph asks for the class of
a linear (attention, indexer, routed expert, ...), not for a per-tensor table. Norms, the MoE gate, the indexer
weights_proj and mHC mixing weights stay in BF16 under every preset (all deployments in models.md keep them so).
Scale layouts follow models.md §1.1, §1.5, §2.1 and §3.2; the ones no source states are marked GUESS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from npusim.errors import NpusimError, did_you_mean
from npusim.spec.chip import BYTES_PER_ELEMENT


@dataclass(frozen=True, kw_only=True)
class Storage:
    """How a tensor is stored: element dtype plus one scale of `scale_bytes` per `block` elements (0: none/negligible)."""

    dtype: str
    scale_bytes: float = 0.0
    block: int = 0

    def bytes_for(self, elements: float) -> float:
        """Bytes of `elements` values including their scales (scales rounded up per whole row of `elements`)."""
        scales = math.ceil(elements / self.block) * self.scale_bytes if self.block else 0.0
        return elements * BYTES_PER_ELEMENT[self.dtype] + scales

    def bytes_per_element(self) -> float:
        """Amortised bytes per element over large tensors (weights)."""
        return BYTES_PER_ELEMENT[self.dtype] + (self.scale_bytes / self.block if self.block else 0.0)

    @property
    def quantised(self) -> bool:
        return self.dtype not in ("bf16", "fp16", "fp32")


BF16 = Storage(dtype="bf16")
INT8_CHANNEL = Storage(dtype="int8")  # per-output-channel scales: one per row of k values, negligible
INT4_GROUP = Storage(dtype="int4", scale_bytes=2.0, block=256)  # GUESS: W4A8 group 256, fp16 scale
# Kimi-K2-Thinking's native INT4 experts: compressed-tensors pack-quantized, symmetric int4 in groups of 32 along k
# (its config.json quantization_config.config_groups.group_0.weights: num_bits 4, group_size 32, strategy group; no
# input_activations: the activations stay BF16), only the routed experts (the ignore list holds attention, the shared
# experts, the dense layer and lm_head). estimate: one scale in the checkpoint's bf16 per group (2 B / 32 weights)
INT4_G32 = Storage(dtype="int4", scale_bytes=2.0, block=32)
FP8_BLOCK = Storage(dtype="fp8", scale_bytes=4.0, block=128 * 128)  # DeepSeek checkpoint: e4m3, fp32 per 128x128
FP8_TOKEN = Storage(dtype="fp8", scale_bytes=4.0, block=128)  # activations and caches: one fp32 scale per 128
INT8_TOKEN = Storage(dtype="int8", scale_bytes=4.0, block=128)  # Ascend C8 latent cache: fp32 per 128 (C8_CACHES)
INT8_HEAD = Storage(dtype="int8", scale_bytes=2.0, block=128)  # Ascend C8 indexer cache: fp16 per key (C8_CACHES)
MXFP8 = Storage(dtype="mxfp8", scale_bytes=1.0, block=32)  # OCP MX: e8m0 per 32
MXFP4 = Storage(dtype="mxfp4", scale_bytes=1.0, block=32)
FP8_KV_V4 = Storage(dtype="fp8", scale_bytes=1.0, block=64)  # GUESS: V4 QAT simulates fp8 nope, block 64, ue8m0
WEIGHT_CLASSES = ("attention", "kv_b", "mla_a", "indexer", "indexer_k", "routed_experts", "shared_experts",
                  "dense_ffn", "lm_head", "embedding")
# kv_b: MLA's key/value up-projection (kv_b_proj, and its absorbed halves q_absorb / o_absorb). Ascend's INT8
# checkpoints leave it BF16: cann-recipes-infer models/deepseek_r1/utils/convert_model.py:108 and
# models/deepseek_v3_2_exp/utils/convert_model.py:176 put self_attn.kv_b_proj on the quantisation ignore list, and the
# R1 prefill multiplies by its split BF16 halves with torch.matmul (models/deepseek_r1/models/modeling_deepseek.py
# :1061-1062). The FP8 / MX presets keep the checkpoint's own format.
# mla_a (q_a_proj, kv_a_proj_with_mqa) and indexer_k (the DSA indexer's wk): V3.2-Exp's INT8 conversion ignores them
# too (models/deepseek_v3_2_exp/utils/convert_model.py:174, :177, :178 @ fbc225d); R1's quantises them (its
# generate_ignore_item, deepseek_r1/utils/convert_model.py:102-115, lists kv_b_proj only), so a V3 model's q_a / kv_a
# stay in the class 'attention' (graph.accounting.mla_a_class).
ASCEND_INT8_KEEPS_BF16 = ("kv_b", "mla_a", "indexer_k")
# msModelSlim's V3.2 W8A8 (the checkpoint vLLM-Ascend's tutorial and SGLang's Ascend tests load, modelscope
# vllm-ascend/DeepSeek-V3.2-Exp-W8A8) draws the line elsewhere: its recipe (Ascend/msmodelslim lab_practice/
# deepseek_v3_2/deepseek_w8a8.yaml) quantises every *self_attn* linear, q_a_proj and kv_a_proj_with_mqa included, but
# kv_b_proj and the indexer's wq_b, wk and weights_proj, and every *mlp* linear but the gate. Limit: the recipe's
# attention activations are static per-tensor INT8; the preset keeps W8A8's per-token activation format.
MODELSLIM_KEEPS_BF16 = ("kv_b", "indexer", "indexer_k")
# C8 of the indexer key cache alone (INT8_HEAD, 130 B a key) beside a BF16 latent cache (1152 B a row): the GLM-5.1
# W8A8C8 deployment issue 34 names; the latent cache stays C16, so only the indexer's rows and its scoring shrink
# C8_CACHES: cann-recipes-infer @ fbc225d, models/deepseek_v3_2_exp/models/modeling_deepseek.py:911-972. The latent
# cache row is one int8 tensor of kv_lora_rank + 2 x qk_rope_head_dim + 4 x 4 bytes (:913): 512 int8 values, the 64
# RoPE values in BF16 and four fp32 scales, one per 128 (656 B, FlashMLA's size). The indexer key cache is int8 of
# index_head_dim (:934-943) beside a float16 scale cache of one value per key (:963-972), the key's
# npu_dynamic_quant scale (models/deepseek_v3_2_exp/models/indexer.py:343-344): 130 B per key.


@dataclass(frozen=True, kw_only=True)
class QuantScheme:
    """Storage of each weight class, of activations entering quantised linears, and of the two caches.

    Cache rows keep their RoPE part in BF16 (FlashMLA's 656 B layout, Ascend's split key_rope): the graph applies
    `kv_cache` to the latent/nope elements only, `indexer_cache` to the whole indexer key.
    """

    name: str
    description: str
    attention: Storage
    kv_b: Storage
    mla_a: Storage
    indexer: Storage
    indexer_k: Storage
    routed_experts: Storage
    shared_experts: Storage
    dense_ffn: Storage
    lm_head: Storage = BF16
    embedding: Storage = BF16
    activation: Storage
    kv_cache: Storage
    indexer_cache: Storage

    def weights(self, weight_class: str) -> Storage:
        return getattr(self, weight_class)

    def activation_for(self, weight: Storage) -> Storage:
        """Activation format feeding a linear: quantised only when its weights are (W8A8, FP8), else BF16."""
        return self.activation if weight.quantised else BF16


def _scheme(name: str, description: str, *, linear: Storage, activation: Storage, kv: Storage, index: Storage,
            experts: Storage | None = None, keeps: tuple[str, ...] = ASCEND_INT8_KEEPS_BF16) -> QuantScheme:
    """A preset: every linear in `linear` (the routed experts in `experts`), but the classes an INT8 checkpoint
    `keeps` in BF16."""
    classes = {c: linear for c in WEIGHT_CLASSES if c not in ("lm_head", "embedding")}
    classes |= {c: BF16 for c in keeps if linear.dtype == "int8"}
    classes["routed_experts"] = experts or linear
    return QuantScheme(name=name, description=description, **classes, activation=activation, kv_cache=kv,
                       indexer_cache=index)


PRESETS: dict[str, QuantScheme] = {
    q.name: q
    for q in (
        _scheme("bf16", "all BF16; caches BF16 (C16)", linear=BF16, activation=BF16, kv=BF16, index=BF16),
        _scheme("w8a8", "INT8 linears (per-channel; MLA's kv_b, V3.2's q_a / kv_a / indexer wk BF16), INT8 "
                        "per-token activations; caches BF16",
                linear=INT8_CHANNEL, activation=INT8_TOKEN, kv=BF16, index=BF16),
        _scheme("w8a8-modelslim", "msModelSlim's W8A8 checkpoint (vLLM-Ascend, SGLang): INT8 linears with V3.2's "
                                  "q_a / kv_a INT8, MLA's kv_b and the indexer's wq_b / wk BF16; caches BF16",
                linear=INT8_CHANNEL, activation=INT8_TOKEN, kv=BF16, index=BF16, keeps=MODELSLIM_KEEPS_BF16),
        _scheme("w8a8c8", "W8A8 plus INT8 latent KV cache and INT8 indexer cache (Ascend C8)",
                linear=INT8_CHANNEL, activation=INT8_TOKEN, kv=INT8_TOKEN, index=INT8_HEAD),
        _scheme("w8a8-ic8", "W8A8 plus the INT8 indexer key cache alone (C8 of the DSA indexer, 130 B a key); the "
                            "latent KV cache BF16",
                linear=INT8_CHANNEL, activation=INT8_TOKEN, kv=BF16, index=INT8_HEAD),
        _scheme("w4a16", "INT4 routed experts (group 32) with BF16 activations, every other linear BF16; caches "
                         "BF16 (Kimi-K2-Thinking's native compressed-tensors checkpoint)",
                linear=BF16, activation=BF16, kv=BF16, index=BF16, experts=INT4_G32),
        _scheme("w4a8", "W8A8 with INT4 routed experts; caches BF16",
                linear=INT8_CHANNEL, activation=INT8_TOKEN, kv=BF16, index=BF16, experts=INT4_GROUP),
        _scheme("w4a8c8", "W4A8 plus INT8 latent KV and indexer caches (Ascend PD sample)",
                linear=INT8_CHANNEL, activation=INT8_TOKEN, kv=INT8_TOKEN, index=INT8_HEAD, experts=INT4_GROUP),
        _scheme("fp8", "DeepSeek checkpoint format: FP8 e4m3 128x128-block weights, 1x128 activations, "
                       "FlashMLA FP8 cache (656 B) and FP8 indexer cache (132 B)",
                linear=FP8_BLOCK, activation=FP8_TOKEN, kv=FP8_TOKEN, index=FP8_TOKEN),
        _scheme("mxfp8-mxfp4", "V4 hybrid: MXFP8 linears and activations, MXFP4 routed experts, FP8 KV, MXFP4 "
                               "indexer cache",
                linear=MXFP8, activation=MXFP8, kv=FP8_KV_V4, index=MXFP4, experts=MXFP4),
    )
}


def get_quant(name: str) -> QuantScheme:
    try:
        return PRESETS[name]
    except KeyError:
        raise NpusimError(f"unknown quantisation '{name}'" + did_you_mean(name, PRESETS), field="--quant") from None
