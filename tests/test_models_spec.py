"""Model configs, quantisation presets and the accounting users check first, against models.md."""

from __future__ import annotations

import json

import pytest

from npusim.errors import NpusimError
from npusim.graph.accounting import cache_footprint, parameters
from npusim.spec.hf import COMMON_IGNORED
from npusim.spec.model import load_model, model_names
from npusim.spec.quant import PRESETS, get_quant

MODELS = ("deepseek-v3.2-exp", "deepseek-v3.1", "deepseek-v4-flash", "deepseek-v4-pro")


@pytest.fixture(scope="module")
def models():
    return {name: load_model(name) for name in MODELS}


def test_catalog_lists_the_four_models():
    assert set(MODELS) <= set(model_names())


def test_v31_is_v32_without_the_indexer(models):
    v31, v32 = models["deepseek-v3.1"], models["deepseek-v3.2-exp"]
    assert not v31.has_indexer and v32.has_indexer
    assert (v31.hidden_size, v31.n_routed_experts, v31.kv_lora_rank) == (v32.hidden_size, v32.n_routed_experts, 512)


def test_v4_layer_kinds_match_the_configs(models):
    """models.md §2.1: Flash 2 SWA-only, 21 CSA, 20 HCA; Pro 30 CSA, 31 HCA; the MTP layer is SWA-only."""
    for name, expected in (("deepseek-v4-flash", {0: 2, 4: 21, 128: 20}), ("deepseek-v4-pro", {4: 30, 128: 31})):
        m = models[name]
        ratios = [m.compress_ratio(i) for i in range(m.num_hidden_layers)]
        assert {r: ratios.count(r) for r in set(ratios)} == expected
        assert m.compress_ratio(m.num_hidden_layers) == 0


# ------------------------------------------------------------------------------------------ parameters
# Tolerances: a few % against the rounded published headline figures; the indexer (pure arithmetic) 0.5 %.


@pytest.mark.parametrize("name, total, activated, rel", [
    ("deepseek-v3.2-exp", 671e9, 37e9, 0.03),
    ("deepseek-v4-flash", 284e9, 13e9, 0.03),
    ("deepseek-v4-pro", 1.6e12, 49e9, 0.03),
])
def test_total_and_activated_parameters(models, name, total, activated, rel):
    p = parameters(models[name])
    assert p.total == pytest.approx(total, rel=rel)
    assert p.activated == pytest.approx(activated, rel=rel)


def test_indexer_parameters_v32(models):
    """models.md §1.5: 13.96 M per layer x 61 = 0.852 B."""
    m = models["deepseek-v3.2-exp"]
    p = parameters(m)
    assert p.indexer / m.num_hidden_layers == pytest.approx(13.96e6, rel=0.005)
    assert p.indexer == pytest.approx(0.852e9, rel=0.005)
    assert parameters(models["deepseek-v3.1"]).total == pytest.approx(p.total - p.indexer, rel=1e-9)


def test_v4_routed_experts_activated(models):
    """CRI: activated routed-expert parameters per token 6 G (Flash) / 22.5 G (Pro) — binary G (GiB)."""
    for name, routed in (("deepseek-v4-flash", 6 * 2**30), ("deepseek-v4-pro", 22.5 * 2**30)):
        m = models[name]
        per_expert = 3 * m.hidden_size * m.moe_intermediate_size
        assert m.num_hidden_layers * m.num_experts_per_tok * per_expert == pytest.approx(routed, rel=0.01)


def test_weight_bytes_per_preset(models):
    p = parameters(models["deepseek-v3.2-exp"])
    bf16 = p.weight_bytes(get_quant("bf16"))
    assert bf16 == pytest.approx(2 * p.total, rel=1e-12)
    # FP8: one byte per parameter (+4 B per 128x128 block), but embedding and LM head stay BF16 (2 x 0.93 B)
    assert p.weight_bytes(get_quant("fp8")) == pytest.approx(p.total + 2 * 129280 * 7168, rel=5e-4)
    # routed experts are 58 x 256 x 44 M = 654 B of 672 B: INT4 halves nearly everything
    w8, w4 = p.weight_bytes(get_quant("w8a8")), p.weight_bytes(get_quant("w4a8"))
    assert 0.50 < w4 / w8 < 0.54
    assert p.weight_bytes(get_quant("w8a8c8")) == w8  # C8 changes caches only
    # msModelSlim's W8A8 quantises q_a / kv_a (1 B instead of 2) and keeps the indexer's wq_b BF16 (2 B instead of 1)
    ms = get_quant("w8a8-modelslim")
    assert (ms.mla_a.dtype, ms.indexer.dtype, ms.indexer_k.dtype, ms.kv_b.dtype) == ("int8", "bf16", "bf16", "bf16")
    assert w8 - p.weight_bytes(ms) == pytest.approx(p.by_class["mla_a"] - p.by_class["indexer"], rel=1e-12)
    flash = parameters(models["deepseek-v4-flash"])
    # MXFP4 experts (0.53 B/weight incl. e8m0 scales) vs FP8: V4-Flash ~ 156 GB vs ~ 285 GB
    assert flash.weight_bytes(get_quant("mxfp8-mxfp4")) == pytest.approx(156e9, rel=0.02)


def test_unknown_quant_suggests():
    with pytest.raises(NpusimError, match="did you mean 'w8a8c8'"):
        get_quant("w8a8c")
    assert set(PRESETS) >= {"bf16", "w8a8", "w8a8c8", "w4a8", "fp8", "mxfp8-mxfp4"}


# ------------------------------------------------------------------------------------------ caches


def test_v32_cache_rows_per_format(models):
    """models.md §1.5: latent 1152 B BF16 / 656 B FlashMLA FP8; indexer key 256 B BF16, 132 B FP8, 130 B C8."""
    m = models["deepseek-v3.2-exp"]
    assert cache_footprint(m, get_quant("bf16")).per_layer_bytes == {"kv": 1152, "indexer": 256}
    fp8 = cache_footprint(m, get_quant("fp8"))
    assert fp8.per_layer_bytes == {"kv": 656, "indexer": 132}
    assert fp8.bytes_per_token == 48_068  # 61 x (656 + 132)
    assert cache_footprint(m, get_quant("w8a8c8")).per_layer_bytes["indexer"] == 130
    assert cache_footprint(models["deepseek-v3.1"], get_quant("bf16")).per_layer_bytes == {"kv": 1152}


def test_v4_compressed_caches_are_7_to_12_percent_of_v32(models):
    """models.md §2.4: elements per token 3,440 (Flash) / 4,924 (Pro) vs 42,944 (V3.2): 8.0 % / 11.5 %."""
    v32 = cache_footprint(models["deepseek-v3.2-exp"], get_quant("bf16")).elements_per_token
    assert v32 == 42_944
    for name, elements in (("deepseek-v4-flash", 3_440), ("deepseek-v4-pro", 4_924)):
        c = cache_footprint(models[name], get_quant("bf16"))
        assert c.elements_per_token == elements
        assert 0.07 <= elements / v32 <= 0.12
    flash = cache_footprint(models["deepseek-v4-flash"], get_quant("bf16"))
    assert flash.fixed_bytes_per_sequence == pytest.approx(5.6e6, rel=0.01)  # 43 x 128 x 512 x 2 B


# ------------------------------------------------------------------------------------------ HF config.json

V4_FLASH_HF = {
    "architectures": ["DeepseekV4ForCausalLM"], "attention_bias": False, "bos_token_id": 0, "eos_token_id": 1,
    "expert_dtype": "fp4", "hc_eps": 1e-6, "hc_mult": 4, "hc_sinkhorn_iters": 20, "head_dim": 512,
    "hidden_act": "silu", "hidden_size": 4096, "index_head_dim": 128, "index_n_heads": 64, "index_topk": 512,
    "max_position_embeddings": 1048576, "model_type": "deepseek_v4", "moe_intermediate_size": 2048,
    "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 64,
    "num_experts_per_tok": 6, "num_hidden_layers": 43, "num_hash_layers": 3, "num_key_value_heads": 1,
    "num_nextn_predict_layers": 1, "o_groups": 8, "o_lora_rank": 1024, "q_lora_rank": 1024, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-6, "rope_scaling": {"factor": 16, "type": "yarn"}, "rope_theta": 10000,
    "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "sliding_window": 128, "swiglu_limit": 10.0,
    "tie_word_embeddings": False, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "compress_rope_theta": 160000,
    "vocab_size": 129280, "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0, 0, 0],
}


def _write(tmp_path, config: dict):
    folder = tmp_path / "DeepSeek-V4-Flash"
    folder.mkdir(exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_hf_config_json_maps_onto_the_same_model(tmp_path, models):
    hf = load_model(_write(tmp_path, V4_FLASH_HF))
    ours = models["deepseek-v4-flash"]
    assert hf.name == "DeepSeek-V4-Flash" and hf.default_quant == "mxfp8-mxfp4"
    skip = {"name", "description", "provenance", "compress_ratios", "source_model_type", "ignored", "checked"}
    for f in ours.__dataclass_fields__:
        if f not in skip:
            assert getattr(hf, f) == getattr(ours, f), f
    # the HF file pads compress_ratios to 46 entries: layers and the MTP layer agree
    assert [hf.compress_ratio(i) for i in range(44)] == [ours.compress_ratio(i) for i in range(44)]
    assert parameters(hf).total == parameters(ours).total


def test_hf_config_unknown_key_is_an_error_with_a_suggestion(tmp_path):
    with pytest.raises(NpusimError, match=r"hiden_size.*did you mean 'hidden_size'"):
        load_model(_write(tmp_path, V4_FLASH_HF | {"hiden_size": 1}))
    assert "hidden_size" not in COMMON_IGNORED


def test_yaml_typo_is_not_ignored(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("inherits: deepseek-v3.2-exp\nmodel_typ: deepseek_v3\n")
    with pytest.raises(NpusimError, match=r"typo.yaml.*model_typ.*did you mean 'model_type'"):
        load_model(str(path))


@pytest.mark.parametrize("override, message", [
    ({"o_groups": "7"}, "o_groups.*does not divide num_attention_heads"),
    ({"n_group": "7"}, "n_group.*does not divide n_routed_experts"),
    ({"index_topk": "0"}, "index_topk.*must be > 0"),
    ({"compress_ratios": "[0, 8]"}, "compress_ratios"),
])
def test_inconsistent_configs_name_the_field(override, message):
    name = "deepseek-v3.2-exp" if "n_group" in override or "index_topk" in override else "deepseek-v4-flash"
    with pytest.raises(NpusimError, match=message):
        load_model(name, override)


def test_unknown_model_suggests():
    with pytest.raises(NpusimError, match="did you mean 'deepseek-v4-pro'"):
        load_model("deepseek-v4-pr")
