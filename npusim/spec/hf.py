"""Hugging Face `config.json` -> npusim model fields, by architecture (the file's `model_type`), not by name.

Each architecture says which npusim family it is (MLA: deepseek_v3; MLA + DSA indexer: deepseek_v32; DeepSeek-V4;
GQA attention + MoE: gqa_moe), how its keys map onto our fields (renamed, derived, or taken as they are), which keys
do not change shapes, FLOPs or bytes (ignored, and listed as such under `--verbose`), and which keys are only
accepted with the value the model npusim builds assumes (anything else changes compute or memory in a way npusim
does not model: refused by name). Every other key is refused by name, so a field a new checkpoint adds is never
silently dropped.

Families and what they cover:
- deepseek_v3, kimi_k2 (DeepSeek-V3 / R1, Kimi-K2: `DeepseekV3ForCausalLM`), deepseek_v32 (V3.2, V3.2-Exp: the DSA
  indexer), glm_moe_dsa (GLM-5: DeepSeek-V3.2's network at other sizes; vLLM runs it as `GlmMoeDsaForCausalLM
  (DeepseekV2ForCausalLM)`, SGLang through its DeepSeek-V2 model): MLA keys map 1:1.
- deepseek_v4: the keys map 1:1 (shared-KV MQA, Compressor, mHC).
- qwen3_moe, glm4_moe: GQA attention (q/k/v projections, optional q/k RMSNorm, `num_key_value_heads` heads of
  `head_dim`, RoPE on `partial_rotary_factor` of each head) and MoE; flash attention and grouped GEMM run them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable

from npusim.errors import NpusimError

# Keys that do not change shapes, FLOPs or bytes: numerics (eps, RoPE frequencies and their scaling, routing
# normalisation, gate method), tokeniser ids, training-only settings, serving hints and file metadata.
COMMON_IGNORED = frozenset({
    "architectures", "auto_map", "attention_dropout", "bos_token_id", "eos_token_id", "pad_token_id",
    "initializer_range", "rms_norm_eps", "rope_scaling", "rope_theta", "rope_parameters", "torch_dtype", "dtype",
    "transformers_version", "use_cache", "norm_topk_prob", "topk_method", "aux_loss_alpha", "seq_aux",
    "router_aux_loss_coef", "output_router_logits", "pretraining_tp", "ep_size", "_name_or_path",
    "keys_to_ignore_at_inference", "num_key_value_heads",
    "generation_config", "bias_update_speed", "routed_scaling_factor_init", "max_window_layers",
    "rope_interleave",
})
QUANT_KEYS = frozenset({"quantization_config", "expert_dtype"})  # the weights' format: npusim.spec.model reads them
# keys an MLA config carries that MLA does not use: HF's head_dim is the RoPE width, num_key_value_heads = heads
MLA_IGNORED = frozenset({"head_dim", "qk_head_dim"})
DSA_IGNORED = frozenset({"indexer_rope_interleave"})  # which RoPE pairing the indexer uses: numerics only
V4_IGNORED = frozenset({"hc_eps", "compress_rope_theta", "scale_fmt"})

MLA_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_nextn_predict_layers", "max_position_embeddings",
              "num_attention_heads", "q_lora_rank", "qk_rope_head_dim", "kv_lora_rank", "qk_nope_head_dim",
              "v_head_dim", "intermediate_size", "first_k_dense_replace", "moe_intermediate_size",
              "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "n_group", "topk_group",
              "scoring_func", "routed_scaling_factor")
DSA_FIELDS = ("index_n_heads", "index_head_dim", "index_topk")
V4_FIELDS = ("head_dim", "o_groups", "o_lora_rank", "sliding_window", "compress_ratios", "hc_mult",
             "hc_sinkhorn_iters", "num_hash_layers", "swiglu_limit")
GQA_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "max_position_embeddings", "num_attention_heads",
              "num_key_value_heads", "head_dim", "moe_intermediate_size", "num_experts_per_tok")


@dataclass(frozen=True)
class Mapped:
    """What a config.json became: our fields, the keys ignored (they do not change cost), and the family."""

    fields: dict[str, Any]
    ignored: tuple[str, ...]
    checked: tuple[str, ...]  # keys accepted because they hold the value the model assumes
    source_model_type: str


@dataclass(frozen=True)
class Architecture:
    """How one HF `model_type` maps onto an npusim family."""

    family: str
    taken: tuple[str, ...]  # keys copied to our field of the same name
    renamed: dict[str, str] = field(default_factory=dict)  # HF key -> our field
    ignored: frozenset[str] = frozenset()
    # key -> (value the model assumes, why another value is not modelled); a missing key takes that value
    fixed: dict[str, tuple[Any, str]] = field(default_factory=dict)
    derive: Callable[[dict, dict, str], None] | None = None  # (config, fields, file) -> adds derived fields
    derived_from: frozenset[str] = frozenset()  # keys `derive` reads (mapped, not ignored)
    defaults: dict[str, Any] = field(default_factory=dict)  # fields the architecture implies when the key is absent


def _require(config: dict, key: str, file: str) -> Any:
    if config.get(key) is None:
        raise NpusimError("is missing: the architecture needs it", file=file, field=key)
    return config[key]


def _glm_dsa(config: dict, fields: dict, file: str) -> None:
    """GLM-5 differs from DeepSeek-V3.2 in sizes only, plus per-layer schedules that must match what we build."""
    dense = config.get("first_k_dense_replace", 0)
    n = _require(config, "num_hidden_layers", file)
    mlp = config.get("mlp_layer_types")
    if mlp is not None and list(mlp) != ["dense"] * dense + ["sparse"] * (n - dense):
        raise NpusimError(f"must be {dense} 'dense' layers then 'sparse' ones (first_k_dense_replace); other "
                          f"patterns of dense and MoE layers are not modelled", file=file, field="mlp_layer_types")
    kinds = config.get("layer_types")
    if kinds is not None and set(kinds) - {"deepseek_sparse_attention"}:
        raise NpusimError(f"holds {sorted(set(kinds) - {'deepseek_sparse_attention'})}: only DSA layers "
                          f"('deepseek_sparse_attention') are modelled", file=file, field="layer_types")
    _indexer_schedule(config, fields, file)


def _indexer_schedule(config: dict, fields: dict, file: str) -> None:
    """GLM-5.x layers that reuse the top-k of the last layer that ran its indexer ('shared': no indexer of their own,
    no indexer key cache). The schedule is, in the order the model code reads it (transformers GlmMoeDsaConfig,
    vLLM / SGLang deepseek_v2.py skip_topk): `indexer_types` ('full' / 'shared' per layer), `index_topk_pattern`
    ('F' / 'S'), else `index_topk_freq` k: layer l runs its indexer when l < index_skip_topk_offset or
    (l - offset) % k == 0, the k - 1 after it reuse its top-k. `use_index_cache` false: every layer runs one."""
    n = _require(config, "num_hidden_layers", file)
    if config.get("use_index_cache") is False:
        return
    types, pattern = config.get("indexer_types"), config.get("index_topk_pattern")
    if types is not None:
        layers = _schedule(types, {"full": 1, "shared": 0}, n, file, "indexer_types")
    elif pattern is not None:
        layers = _schedule(pattern, {"F": 1, "full": 1, "S": 0, "shared": 0}, n, file, "index_topk_pattern")
    else:
        freq, offset = config.get("index_topk_freq", 1), config.get("index_skip_topk_offset", 0)
        for key, value, low in (("index_topk_freq", freq, 1), ("index_skip_topk_offset", offset, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise NpusimError(f"is {value!r}: must be a whole number >= {low}", file=file, field=key)
        layers = tuple(int(lay < offset or (lay - offset) % freq == 0) for lay in range(n))
    if not layers[0]:
        raise NpusimError("shares the first layer's top-k, but no earlier layer runs an indexer: the first layer "
                          "must be 'full'", file=file, field="indexer_types" if types is not None else
                          "index_topk_pattern")
    if not all(layers):
        fields["indexer_layers"] = list(layers)


def _schedule(values: Any, allowed: dict[str, int], n: int, file: str, key: str) -> tuple[int, ...]:
    """One 0 / 1 per layer from a config's per-layer list (or string) of indexer kinds."""
    if not isinstance(values, (list, str)) or len(values) != n or set(values) - set(allowed):
        raise NpusimError(f"must list one of {', '.join(repr(a) for a in allowed)} for each of the {n} layers",
                          file=file, field=key)
    return tuple(allowed[v] for v in values)


def _v4(config: dict, fields: dict, file: str) -> None:
    kv = config.get("num_key_value_heads", 1)
    if kv != 1:
        raise NpusimError(f"is {kv}: DeepSeek-V4 attention has one shared K=V head; allowed: 1", file=file,
                          field="num_key_value_heads")


def _gqa(config: dict, fields: dict, file: str) -> None:
    """RoPE width from partial_rotary_factor; q/k norms (Qwen3 always, GLM-4.5 by use_qk_norm)."""
    head = config.get("head_dim") or _require(config, "hidden_size", file) // _require(config, "num_attention_heads",
                                                                                           file)
    fields["head_dim"] = head
    factor = config.get("partial_rotary_factor", 1.0)
    if not 0 < factor <= 1:
        raise NpusimError(f"is {factor}: must be in (0, 1]", file=file, field="partial_rotary_factor")
    fields["qk_rope_head_dim"] = int(head * factor)


def _qwen3(config: dict, fields: dict, file: str) -> None:
    _gqa(config, fields, file)
    fields["qk_norm"] = 1  # Qwen3MoeAttention always has q_norm and k_norm
    if config.get("mlp_only_layers"):
        raise NpusimError(f"lists dense layers {config['mlp_only_layers']}: dense layers among MoE layers are "
                          f"not modelled; allowed: []", file=file, field="mlp_only_layers")
    if config.get("use_sliding_window"):
        raise NpusimError("is true: sliding-window GQA layers are not modelled; allowed: false", file=file,
                          field="use_sliding_window")


def _glm4(config: dict, fields: dict, file: str) -> None:
    _gqa(config, fields, file)
    fields["qk_norm"] = int(bool(config.get("use_qk_norm", False)))


INDEXER_SCHEDULES = frozenset({"indexer_types", "index_topk_pattern", "index_topk_freq", "index_skip_topk_offset",
                               "use_index_cache"})
GLM_SCHEDULES = INDEXER_SCHEDULES | {"mlp_layer_types", "layer_types"}
GQA_DERIVED = frozenset({"partial_rotary_factor"})
SILU = ("silu", "the FFN is SwiGLU; other activations are not modelled")
UNTIED = (False, "tied embeddings share the LM head's weights; npusim counts them apart")
MOE_EVERY_LAYER = (1, "MoE in every layer after the dense ones; other frequencies are not modelled")
NO_BIAS = (False, "biases in the MLP are not modelled")
MLA_FIXED = {"hidden_act": SILU, "tie_word_embeddings": UNTIED, "moe_layer_freq": MOE_EVERY_LAYER,
             "attention_bias": (False, "MLA projections with biases are not modelled"), "mlp_bias": NO_BIAS}

_DEEPSEEK_V3 = Architecture("deepseek_v3", MLA_FIELDS, ignored=MLA_IGNORED, fixed=MLA_FIXED,
                            defaults={"scoring_func": "softmax"})
_DEEPSEEK_V32 = Architecture("deepseek_v32", MLA_FIELDS + DSA_FIELDS, ignored=MLA_IGNORED | DSA_IGNORED,
                             fixed=MLA_FIXED, derive=_indexer_schedule,
                             derived_from=INDEXER_SCHEDULES)
ARCHITECTURES: dict[str, Architecture] = {
    "deepseek_v3": _DEEPSEEK_V3,
    "kimi_k2": _DEEPSEEK_V3,  # Kimi-K2 is DeepseekV3ForCausalLM; the model_type only selects Moonshot's parsers
    "deepseek_v32": _DEEPSEEK_V32,
    "glm_moe_dsa": Architecture(
        "deepseek_v32", MLA_FIELDS + DSA_FIELDS,
        ignored=MLA_IGNORED | DSA_IGNORED | {"index_share_for_mtp_iteration"},
        fixed=MLA_FIXED, derive=_glm_dsa, derived_from=GLM_SCHEDULES, defaults={"scoring_func": "sigmoid"}),
    "deepseek_v4": Architecture(
        "deepseek_v4", tuple(f for f in MLA_FIELDS if f not in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"))
        + DSA_FIELDS + V4_FIELDS, ignored=V4_IGNORED | {"indexer_rope_interleave"},
        fixed={"hidden_act": SILU, "tie_word_embeddings": UNTIED,
               "attention_bias": (False, "attention biases are not modelled")}, derive=_v4,
        derived_from=frozenset({"num_key_value_heads"})),
    "qwen3_moe": Architecture(
        "gqa_moe", GQA_FIELDS + ("intermediate_size",), renamed={"num_experts": "n_routed_experts"},
        ignored=frozenset({"sliding_window"}),  # the window of sliding-window layers, refused by use_sliding_window
        fixed={"hidden_act": SILU, "tie_word_embeddings": UNTIED, "decoder_sparse_step": MOE_EVERY_LAYER,
               "attention_bias": (False, "q/k/v biases are not modelled for qwen3_moe"),
               # Qwen3-Coder's config spells these out (qkv_bias, use_qk_norm, shared_expert_intermediate_size);
               # Qwen3MoeAttention always normalises q and k, and Qwen3-MoE has no shared expert
               "qkv_bias": (False, "q/k/v biases are not modelled for qwen3_moe"),
               "use_qk_norm": (True, "Qwen3MoeAttention always has q_norm and k_norm"),
               "shared_expert_intermediate_size": (0, "qwen3_moe has no shared expert (Qwen2-MoE's is not mapped)")},
        derive=_qwen3, derived_from=GQA_DERIVED | {"mlp_only_layers", "use_sliding_window"},
        defaults={"scoring_func": "softmax", "routed_scaling_factor": 1.0}),
    "glm4_moe": Architecture(
        "gqa_moe", GQA_FIELDS + ("intermediate_size", "first_k_dense_replace", "n_routed_experts",
                                 "n_shared_experts", "n_group", "topk_group", "routed_scaling_factor",
                                 "num_nextn_predict_layers"),
        # q/k/v biases (GLM-4.5: attention_bias true) are one vector add per projection output: ignored
        ignored=frozenset({"attention_bias"}),
        fixed={"hidden_act": SILU, "tie_word_embeddings": UNTIED, "moe_layer_freq": MOE_EVERY_LAYER},
        derive=_glm4, derived_from=GQA_DERIVED | {"use_qk_norm"}, defaults={"scoring_func": "sigmoid"}),
}


def map_config(config: dict, file: str) -> Mapped:
    """Our model fields from a config.json's mapping; one sentence naming the key for anything not modelled."""
    kind = config.get("model_type")
    if kind not in ARCHITECTURES:
        allowed = ", ".join(sorted(ARCHITECTURES))
        raise NpusimError(f"'{kind}' is not an architecture npusim maps; allowed: {allowed}", file=file,
                          field="model_type")
    arch = ARCHITECTURES[kind]
    fields: dict[str, Any] = {"model_type": arch.family}
    ignored, checked = [], []
    for key, value in config.items():
        if key == "model_type":
            continue
        if key in arch.fixed:
            expected, why = arch.fixed[key]
            if value != expected and not (value is None and expected is False):
                raise NpusimError(f"is {value!r}: {why}; allowed: {expected!r}", file=file, field=key)
            checked.append(key)
        elif key in arch.taken:
            fields[key] = value
        elif key in arch.renamed:
            fields[arch.renamed[key]] = value
        elif key in arch.derived_from or key in QUANT_KEYS:
            continue
        elif key in arch.ignored or key in COMMON_IGNORED:
            ignored.append(key)
        else:
            known = set(arch.taken) | set(arch.renamed) | set(arch.fixed) | arch.derived_from | arch.ignored
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.8)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise NpusimError(f"is not a field npusim maps for model_type '{kind}'{hint} and may change compute or "
                              f"memory: it is refused rather than ignored (see npusim.spec.hf)", file=file, field=key)
    for key, value in arch.defaults.items():
        fields.setdefault(key, value)
    fields = {k: v for k, v in fields.items() if v is not None}
    if arch.derive:
        arch.derive(config, fields, file)
    return Mapped(fields=fields, ignored=tuple(sorted(ignored)), checked=tuple(sorted(checked)),
                  source_model_type=kind)
