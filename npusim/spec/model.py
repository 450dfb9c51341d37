"""Model configs: DeepSeek-V3 / V3.2 (MLA, optional DSA indexer), V4 (shared-KV MQA, Compressor, mHC), and MoE
models with GQA attention (Qwen3-MoE, GLM-4.5).

Field names are those of the Hugging Face `config.json` of the DeepSeek models, so `load_model` also accepts such a
file: npusim.spec.hf maps it by its `model_type` (the architecture), drops the keys that do not change cost (kept
in `ignored`, shown by --verbose) and refuses by name any key it does not know — the same rule our own YAML files
follow, where no key is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from npusim.errors import NpusimError
from npusim.spec.catalog import Catalog, Provenance, display_path
from npusim.spec import hf
from npusim.spec.quant import PRESETS
from npusim.spec.schema import count, counts, internal, normalise, quantity, read_json, text

MODEL_TYPES = ("deepseek_v3", "deepseek_v32", "deepseek_v4", "gqa_moe")
COMPRESS_RATIOS = (0, 4, 128)  # 0 = sliding window only, 4 = CSA (overlapping, with indexer), 128 = HCA
OVERLAP_RATIO = 4

@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """One checkpoint's architecture. Fields a family does not use keep their zero default."""

    name: str = text()
    description: str = text(default="")
    model_type: str = text(choices=MODEL_TYPES,
                           doc="deepseek_v3: MLA; deepseek_v32: MLA + DSA; deepseek_v4; gqa_moe: GQA attention + MoE")
    default_quant: str = text(default="bf16", choices=tuple(PRESETS), doc="format of the released weights")
    vocab_size: int = count()
    hidden_size: int = count()
    num_hidden_layers: int = count()
    num_nextn_predict_layers: int = count(default=0, minimum=0, doc="MTP layers")
    max_position_embeddings: int = count()
    # attention (shared)
    num_attention_heads: int = count()
    q_lora_rank: int = count(default=0, minimum=0, doc="MLA / V4 query latent; 0 for GQA")
    qk_rope_head_dim: int = count()
    # MLA (V3, V3.2)
    kv_lora_rank: int = count(default=0, minimum=0)
    qk_nope_head_dim: int = count(default=0, minimum=0)
    v_head_dim: int = count(default=0, minimum=0)
    # DSA / V4 indexer; index_topk 0 means no indexer (dense attention, V3.1)
    index_n_heads: int = count(default=0, minimum=0)
    index_head_dim: int = count(default=0, minimum=0)
    index_topk: int = count(default=0, minimum=0)
    indexer_layers: tuple[int, ...] = counts(
        default=(), doc="DSA: per decoder layer 1 = runs its indexer, 0 = reuses the top-k of the last layer that ran "
                        "one and has no indexer of its own (GLM-5.x index_topk_freq / indexer_types); empty = every "
                        "layer runs one (the MTP layer always does)")
    # GQA attention (head_dim is also V4's)
    num_key_value_heads: int = count(default=0, minimum=0, doc="GQA: heads of K and of V, shared by query groups")
    qk_norm: int = count(default=0, minimum=0, doc="GQA: 1 = RMSNorm on each q and k head (Qwen3, GLM-4.5)")
    # V4 attention
    head_dim: int = count(default=0, minimum=0, doc="V4 shared K=V head width; GQA head width")
    o_groups: int = count(default=0, minimum=0)
    o_lora_rank: int = count(default=0, minimum=0)
    sliding_window: int = count(default=0, minimum=0)
    compress_ratios: tuple[int, ...] = counts(default=(), doc="per layer, then the MTP layer; extra entries unused")
    hc_mult: int = count(default=1, doc="mHC residual streams; 1 = plain residual")
    hc_sinkhorn_iters: int = count(default=0, minimum=0)
    # FFN / MoE
    intermediate_size: int = count(default=0, minimum=0, doc="dense FFN width")
    first_k_dense_replace: int = count(default=0, minimum=0)
    moe_intermediate_size: int = count()
    n_routed_experts: int = count()
    n_shared_experts: int = count(default=0, minimum=0)
    num_experts_per_tok: int = count()
    n_group: int = count(default=1)
    topk_group: int = count(default=1)
    num_hash_layers: int = count(default=0, minimum=0)
    scoring_func: str = text(choices=("sigmoid", "softmax", "sqrtsoftplus"))
    routed_scaling_factor: float = quantity("number")
    swiglu_limit: float = quantity("number", default=0.0, minimum=0.0, strict=False, doc="0 = no clamp")
    provenance: Provenance = internal()
    source_model_type: str = internal(default="")  # a config.json's model_type (its architecture)
    ignored: tuple[str, ...] = internal(default=())  # config.json keys dropped: they do not change cost
    checked: tuple[str, ...] = internal(default=())  # config.json keys holding the value npusim's model assumes

    # ------------------------------------------------------------------ derived
    @property
    def is_v4(self) -> bool:
        return self.model_type == "deepseek_v4"

    @property
    def is_gqa(self) -> bool:
        return self.model_type == "gqa_moe"

    @property
    def has_indexer(self) -> bool:
        return self.index_topk > 0

    def compress_ratio(self, layer: int) -> int:
        """Compress ratio of decoder layer `layer`; index num_hidden_layers is the MTP layer (0 when not listed)."""
        return self.compress_ratios[layer] if layer < len(self.compress_ratios) else 0

    def runs_indexer(self, layer: int) -> bool:
        """Whether DSA layer `layer` scores its own top-k (index num_hidden_layers, the MTP layer, always does)."""
        return self.has_indexer and (layer >= len(self.indexer_layers) or bool(self.indexer_layers[layer]))

    def attention_kind(self, layer: int) -> str:
        """mla (dense), dsa (indexer + sparse MLA), dsa_shared (sparse MLA over the top-k an earlier layer's indexer
        chose), or V4's swa / csa / hca by the layer's compress ratio."""
        if self.is_v4:
            return {0: "swa", OVERLAP_RATIO: "csa"}.get(self.compress_ratio(layer), "hca")
        if self.is_gqa:
            return "gqa"
        if not self.has_indexer:
            return "mla"
        return "dsa" if self.runs_indexer(layer) else "dsa_shared"

    @property
    def indexer_layer_count(self) -> int:
        """Decoder layers that run an indexer (and hold its key cache and weights)."""
        return sum(self.runs_indexer(layer) for layer in range(self.num_hidden_layers)) if self.has_indexer else 0

    def is_dense_ffn(self, layer: int) -> bool:
        return layer < self.first_k_dense_replace

    def check(self) -> list[tuple[str, str]]:
        """Rules that tie fields together: (field, sentence) per violation."""
        p: list[tuple[str, str]] = []
        if self.n_routed_experts % self.n_group:
            p.append(("n_group", f"{self.n_group} does not divide n_routed_experts ({self.n_routed_experts})"))
        elif self.topk_group > self.n_group:
            p.append(("topk_group", f"{self.topk_group} is more than n_group ({self.n_group})"))
        elif self.num_experts_per_tok > self.topk_group * self.n_routed_experts // self.n_group:
            p.append(("num_experts_per_tok", f"{self.num_experts_per_tok} is more than the experts of "
                                             f"{self.topk_group} groups"))
        if self.first_k_dense_replace > self.num_hidden_layers:
            p.append(("first_k_dense_replace", f"{self.first_k_dense_replace} is more than num_hidden_layers"))
        if self.first_k_dense_replace and not self.intermediate_size:
            p.append(("intermediate_size", "is missing: dense FFN layers (first_k_dense_replace) need their width"))
        if self.has_indexer and not (self.index_n_heads and self.index_head_dim):
            p.append(("index_n_heads", "and index_head_dim must be set when index_topk > 0"))
        if self.model_type == "deepseek_v3" and self.has_indexer:
            p.append(("index_topk", "must be 0 for deepseek_v3 (no indexer); use model_type deepseek_v32"))
        if self.model_type == "deepseek_v32" and not self.has_indexer:
            p.append(("index_topk", "must be > 0 for deepseek_v32 (the DSA indexer picks index_topk keys)"))
        if self.indexer_layers and (self.model_type != "deepseek_v32" or set(self.indexer_layers) - {0, 1}
                                    or not self.indexer_layers[0]):
            p.append(("indexer_layers", "is a deepseek_v32 schedule of 0 / 1 per layer whose first layer runs its "
                                        "indexer (a shared layer reuses an earlier layer's top-k)"))
        if self.is_gqa:
            return p + self._check_gqa()
        if not self.q_lora_rank:
            p.append(("q_lora_rank", "is missing: MLA and DeepSeek-V4 queries go through the q latent"))
        return p + (self._check_v4() if self.is_v4 else self._check_mla())

    def _check_gqa(self) -> list[tuple[str, str]]:
        p = [(f, "is missing: GQA attention needs it") for f in ("num_key_value_heads", "head_dim")
             if not getattr(self, f)]
        if self.num_key_value_heads and self.num_attention_heads % self.num_key_value_heads:
            p.append(("num_key_value_heads", f"{self.num_key_value_heads} does not divide num_attention_heads "
                                             f"({self.num_attention_heads})"))
        if self.has_indexer:
            p.append(("index_topk", "must be 0 for gqa_moe (dense attention)"))
        if self.head_dim and self.qk_rope_head_dim > self.head_dim:
            p.append(("qk_rope_head_dim", f"{self.qk_rope_head_dim} is more than head_dim ({self.head_dim})"))
        return p

    def _check_mla(self) -> list[tuple[str, str]]:
        return [(f, "is missing: MLA needs it") for f in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim")
                if not getattr(self, f)]

    def _check_v4(self) -> list[tuple[str, str]]:
        p = [(f, "is missing: DeepSeek-V4 attention needs it")
             for f in ("head_dim", "o_groups", "o_lora_rank", "sliding_window") if not getattr(self, f)]
        if self.o_groups and self.num_attention_heads % self.o_groups:
            p.append(("o_groups", f"{self.o_groups} does not divide num_attention_heads ({self.num_attention_heads})"))
        if self.head_dim and self.qk_rope_head_dim >= self.head_dim:
            p.append(("qk_rope_head_dim", f"{self.qk_rope_head_dim} must be smaller than head_dim ({self.head_dim})"))
        if len(self.compress_ratios) < self.num_hidden_layers:
            p.append(("compress_ratios", f"has {len(self.compress_ratios)} entries, needs one per layer "
                                         f"({self.num_hidden_layers})"))
        bad = sorted({r for r in self.compress_ratios if r not in COMPRESS_RATIOS})
        if bad:
            p.append(("compress_ratios", f"holds {bad}; allowed ratios: {', '.join(map(str, COMPRESS_RATIOS))}"))
        if OVERLAP_RATIO in self.compress_ratios[: self.num_hidden_layers] and not self.has_indexer:
            p.append(("index_topk", "must be > 0: ratio-4 (CSA) layers select keys with the indexer"))
        if self.num_hash_layers > self.num_hidden_layers:
            p.append(("num_hash_layers", f"{self.num_hash_layers} is more than num_hidden_layers"))
        return p


MODELS = Catalog("model", "workloads/models", ModelConfig, require_sources=False)


def _quant_of_hf(config: dict, shown: str) -> str:
    """The preset matching a checkpoint's quantization_config / expert_dtype; a format without one is refused (it
    changes the weights' bytes)."""
    quant = config.get("quantization_config") or {}
    if not isinstance(quant, dict):
        raise NpusimError(f"must be a JSON object (such as {{\"quant_method\": \"fp8\"}}), got {quant!r}", file=shown,
                          field="quantization_config")
    method = quant.get("quant_method")
    if method is None:
        return "bf16"
    if method == "fp8":
        return "mxfp8-mxfp4" if config.get("expert_dtype") == "fp4" else "fp8"
    if method == "compressed-tensors" and _int4_weight_only(quant):
        return "w4a16"
    raise NpusimError(f"quant_method '{method}' has no npusim preset (allowed: fp8, compressed-tensors with int4 "
                      f"group-32 weights and unquantised activations, or none for BF16); remove "
                      f"quantization_config and choose the format with --quant", file=shown,
                      field="quantization_config")


def _int4_weight_only(quant: dict) -> bool:
    """A compressed-tensors config whose every group stores int4 weights in groups of 32 and leaves the activations
    unquantised: the w4a16 preset (Kimi-K2-Thinking's INT4 experts)."""
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return False
    for group in groups.values():
        w = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(w, dict) or group.get("input_activations"):
            return False
        if (w.get("num_bits"), w.get("type", "int"), w.get("group_size")) != (4, "int", 32):
            return False
    return True


def _load_hf(path: Path, overrides: dict[str, str] | None) -> ModelConfig:
    shown = display_path(path)
    data = read_json(path, shown)
    if not isinstance(data, dict):
        raise NpusimError("must be a JSON object of config fields", file=shown)
    mapped = hf.map_config(data, shown)
    kept = dict(mapped.fields)
    kept["default_quant"] = _quant_of_hf(data, shown)
    kept.setdefault("name", path.parent.name if path.stem == "config" else path.stem)
    model = MODELS.from_tree(normalise(kept, shown), shown, overrides)
    return replace(model, source_model_type=mapped.source_model_type, ignored=mapped.ignored, checked=mapped.checked)


def load_model(name: str, overrides: dict[str, str] | None = None) -> ModelConfig:
    """A model by catalog name (workloads/models/<name>.yaml), YAML path, or Hugging Face config.json path."""
    if name.endswith(".json"):
        path = Path(name)
        if not path.is_file():
            raise NpusimError("no such model config file", file=name)
        return _load_hf(path, overrides)
    return MODELS.load(name, overrides)


def model_names() -> list[str]:
    return MODELS.names()

