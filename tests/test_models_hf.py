"""Hugging Face config.json files mapped by architecture (npusim.spec.hf): the shipped configs' parameters against
the published totals, cache bytes per token, predictions that run, and refusals that name the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import npusim
from npusim.errors import NpusimError
from npusim.graph.accounting import cache_footprint, parameters
from npusim.parallel.shard import shard
from npusim.spec.hf import COMMON_IGNORED
from npusim.spec.model import load_model
from npusim.spec.plan import load_plan
from npusim.spec.quant import get_quant

HF = Path(__file__).resolve().parents[1] / "workloads" / "models" / "hf"


def config(name: str) -> str:
    return str(HF / name / "config.json")


@pytest.fixture(scope="module")
def models():
    return {p.parent.name: load_model(str(p)) for p in sorted(HF.glob("*/config.json"))}


def test_every_shipped_config_is_listed_with_its_source(models):
    sources = (HF / "SOURCES.md").read_text()
    assert len(models) == 9
    for name in models:
        assert f"| {name} |" in sources


@pytest.mark.parametrize("name, family", [
    ("DeepSeek-R1", "deepseek_v3"), ("Kimi-K2-Instruct", "deepseek_v3"), ("DeepSeek-V3.2", "deepseek_v32"),
    ("GLM-5", "deepseek_v32"), ("DeepSeek-V4-Flash", "deepseek_v4"), ("Qwen3-235B-A22B", "gqa_moe"),
    ("GLM-4.5", "gqa_moe"), ("Qwen3-30B-A3B", "gqa_moe"), ("Qwen3-Coder-480B-A35B", "gqa_moe"),
])
def test_architecture_decides_the_family(models, name, family):
    assert models[name].model_type == family
    assert models[name].name == name


# Published totals (SOURCES.md), counted as each publisher counts, with the place value of the figure's last printed
# digit. Tolerance: 1 %, or half that place value when coarser (a "37B" cannot be checked closer than +-0.5B; Kimi's
# card says "1T": read as 1.0T, our count from its config is 1.026T).
@pytest.mark.parametrize("name, total, with_mtp, activated, convention", [
    ("DeepSeek-R1", (671e9, 1e9), False, (37e9, 1e9), "with_head"),
    ("DeepSeek-V3.2", (685e9, 1e9), True, (37e9, 1e9), "with_head"),
    ("Kimi-K2-Instruct", (1.0e12, 1e11), False, (32e9, 1e9), "with_head"),
    ("GLM-5", (744e9, 1e9), False, (40e9, 1e9), "layers"),
    ("Qwen3-235B-A22B", (235e9, 1e9), False, (22e9, 1e9), "with_embedding"),
    ("GLM-4.5", (355e9, 1e9), False, (32e9, 1e9), "layers"),
    ("Qwen3-30B-A3B", (30.5e9, 0.1e9), False, (3.3e9, 0.11e9), "with_embedding"),  # 3.35B read as the card's 3.3B
    ("Qwen3-Coder-480B-A35B", (480e9, 1e9), False, (35e9, 1e9), "with_embedding"),
])
def test_parameters_match_the_published_totals(models, name, total, with_mtp, activated, convention):
    p = parameters(models[name])
    counted = p.total + (p.mtp if with_mtp else 0.0)
    active = {"with_head": p.activated, "layers": p.activated - p.by_class["lm_head"],
              "with_embedding": p.activated + p.by_class["embedding"]}[convention]
    for ours, (figure, place) in ((counted, total), (active, activated)):
        assert ours == pytest.approx(figure, rel=max(0.01, 0.5 * place / figure))


def test_kimi_routed_experts_dominate_as_the_config_says(models):
    """Kimi-K2: 384 experts x 3 x 7168 x 2048 in 60 MoE layers (first_k_dense_replace 1)."""
    p = parameters(models["Kimi-K2-Instruct"])
    assert p.by_class["routed_experts"] == 60 * 384 * 3 * 7168 * 2048
    assert p.by_class["dense_ffn"] == 3 * 7168 * 18432
    assert p.mtp == 0.0


@pytest.mark.parametrize("name, per_token", [
    ("DeepSeek-R1", 61 * 1152),  # latent 512 + rope 64, BF16
    ("Kimi-K2-Instruct", 61 * 1152),
    ("DeepSeek-V3.2", 61 * (1152 + 256)),  # + the indexer key, 128 BF16
    ("GLM-5", 78 * (1152 + 256)),  # same latent row, 78 layers
    ("Qwen3-235B-A22B", 94 * 2 * 4 * 128 * 2),  # K and V of 4 KV heads of 128
    ("GLM-4.5", 92 * 2 * 8 * 128 * 2),
    ("Qwen3-30B-A3B", 48 * 2 * 4 * 128 * 2),
    ("Qwen3-Coder-480B-A35B", 62 * 2 * 8 * 128 * 2),
])
def test_kv_bytes_per_token(models, name, per_token):
    assert cache_footprint(models[name], get_quant("bf16")).bytes_per_token == per_token


def test_gqa_cache_is_int8_under_c8(models):
    c8 = cache_footprint(models["Qwen3-235B-A22B"], get_quant("w8a8c8"))
    assert c8.bytes_per_token == pytest.approx(94 * 2 * 4 * 128 * 1, rel=0.05)  # + per-tile scales
    assert c8.bytes_per_token > 94 * 2 * 4 * 128


def test_qwen3_moe_runs_dense_gqa_attention(models):
    """A qwen3_moe step: flash attention with 64 query heads over 4 KV heads, grouped GEMM experts."""
    m = models["Qwen3-235B-A22B"]
    step = shard(m, load_plan("v32-a3-pd-a17"), "decode", batch=64, length=4096, quant=get_quant("bf16"))
    ops = {op.name: op for layer in step.layers for op in layer.ops}
    assert ops["attention"].kind == "flash_attention"
    assert (ops["attention"].shape["heads"], ops["attention"].shape["kv_heads"], ops["attention"].shape["d_qk"]) == \
        (64, 4, 128)
    assert ops["experts_gate_up"].kind == "grouped_gemm"
    assert "lightning_indexer" not in ops and "q_a_proj" not in ops
    r = npusim.predict(hw="cloudmatrix384", model=config("Qwen3-235B-A22B"), plan="v32-a3-pd-a17", input=4096,
                       output=64, batch=64)
    assert r.tpot > 0 and r.ttft > 0


def test_kimi_k2_predicts_from_its_config_alone():
    r = npusim.predict(hw="cloudmatrix384", model=config("Kimi-K2-Instruct"), plan="v32-a3-pd-a17", input=4096,
                       output=64, batch=64)
    ds = npusim.predict(hw="cloudmatrix384", model=config("DeepSeek-R1"), plan="v32-a3-pd-a17", input=4096,
                        output=64, batch=64)
    assert r.tpot > 0
    # 384 experts on EP64 (6 per rank) against R1's 256 (4 per rank): more expert weights per decode step
    assert r.memory["decode"].weights > ds.memory["decode"].weights


# ------------------------------------------------------------------------------------------ refusals


def _variant(tmp_path, name: str, **changes) -> str:
    data = json.loads((HF / name / "config.json").read_text())
    data.update(changes)
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(data))
    return str(folder / "config.json")


@pytest.mark.parametrize("name, changes, words", [
    ("GLM-5", {"indexer_types": ["shared", "full"] * 39}, ["indexer_types", "first layer must be 'full'"]),
    ("GLM-5", {"indexer_types": ["full", "shared"] * 38}, ["indexer_types", "each of the 78 layers"]),
    ("GLM-5", {"index_topk_freq": 0}, ["index_topk_freq", ">= 1"]),
    ("GLM-5", {"mlp_layer_types": ["sparse"] * 78}, ["mlp_layer_types", "first_k_dense_replace"]),
    ("DeepSeek-R1", {"hidden_act": "gelu"}, ["hidden_act", "silu"]),
    ("DeepSeek-R1", {"tie_word_embeddings": True}, ["tie_word_embeddings"]),
    ("DeepSeek-R1", {"moe_layer_freq": 2}, ["moe_layer_freq"]),
    ("DeepSeek-R1", {"new_sparse_thing": 3}, ["new_sparse_thing", "refused rather than ignored"]),
    ("DeepSeek-R1", {"model_type": "minimax_m2"}, ["model_type", "minimax_m2", "glm_moe_dsa"]),
    ("DeepSeek-R1", {"quantization_config": {"quant_method": "compressed-tensors"}}, ["quantization_config",
                                                                                       "--quant"]),
    ("Qwen3-235B-A22B", {"mlp_only_layers": [0, 1]}, ["mlp_only_layers"]),
    ("Qwen3-235B-A22B", {"use_sliding_window": True}, ["use_sliding_window"]),
    ("Qwen3-235B-A22B", {"num_key_value_heads": 5}, ["num_key_value_heads", "does not divide"]),
    ("DeepSeek-V4-Flash", {"num_key_value_heads": 2}, ["num_key_value_heads", "allowed: 1"]),
])
def test_what_is_not_modelled_is_refused_by_name(tmp_path, name, changes, words):
    with pytest.raises(NpusimError) as err:
        load_model(_variant(tmp_path, name, **changes))
    for w in words:
        assert w in str(err.value)
    assert "config.json" in str(err.value)


def test_ignored_keys_are_listed_and_do_not_change_cost(tmp_path, models):
    glm = models["GLM-5"]
    assert {"rope_parameters", "indexer_rope_interleave", "rms_norm_eps", "eos_token_id"} <= set(glm.ignored)
    assert {"hidden_act", "tie_word_embeddings"} <= set(glm.checked)
    assert not {"index_n_heads", "v_head_dim", "hidden_size"} & (set(glm.ignored) | COMMON_IGNORED)
    changed = load_model(_variant(tmp_path, "GLM-5", rms_norm_eps=1e-6, rope_parameters={"rope_theta": 1}))
    assert parameters(changed).total == parameters(glm).total
    assert cache_footprint(changed, get_quant("bf16")) == cache_footprint(glm, get_quant("bf16"))


def test_cli_shows_glm5_and_lists_what_it_ignores():
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-m", "npusim.cli.main", "model", "show", config("GLM-5"), "--verbose",
                          "--format", "json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert "glm_moe_dsa (npusim family deepseek_v32)" in out["config model_type"]
    assert "rope_parameters" in out["ignored config keys (no effect on cost)"]
    assert {r["layer"] for r in out["rows"]} >= {"dsa-dense x3", "dsa-moe x75"}
    bad = subprocess.run([sys.executable, "-m", "npusim.cli.main", "model", "show", config("GLM-5"), "--set",
                          "index_topk=0"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "index_topk" in bad.stderr and "Traceback" not in bad.stderr


def test_gqa_kv_heads_split_over_attention_tp_and_mla_latent_does_not(models):
    """Per die, DP128 and DP32 x TP4 hold the same GQA cache (4 KV heads split over TP4), while MLA's latent row is
    replicated over the TP group: 4x the sequences, 4x the cache."""
    from npusim.parallel.memory import kv_bytes

    def per_die(model, dp, tp):
        plan = load_plan("v32-a3-pd-a17", {"decode.attention.dp": str(dp), "decode.attention.tp": str(tp)})
        step = shard(model, plan, "decode", batch=256, length=4096, quant=get_quant("bf16"))
        return kv_bytes(model, plan, step, get_quant("bf16"), 4096)

    qwen, r1 = models["Qwen3-235B-A22B"], models["DeepSeek-R1"]
    assert per_die(qwen, 32, 4) == pytest.approx(per_die(qwen, 128, 1))
    assert per_die(r1, 32, 4) == pytest.approx(4 * per_die(r1, 128, 1))
    step = shard(qwen, load_plan("v32-a3-pd-a17", {"decode.attention.dp": "32", "decode.attention.tp": "4"}),
                 "decode", batch=256, length=4096, quant=get_quant("bf16"))
    write = next(o for layer in step.layers for o in layer.ops if o.name == "kv_cache_update")
    assert write.bytes_written == pytest.approx(2 * 4 * 128 * 2 * 8 / 4)  # 8 sequences per group, a quarter each


def test_predict_verbose_lists_the_ignored_keys():
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-m", "npusim.cli.main", "predict", "--model", config("Kimi-K2-Instruct"),
                          "--input", "4096", "--output", "64", "--batch", "64", "--verbose"], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "kimi_k2 (npusim family deepseek_v3)" in run.stdout and "rope_scaling" in run.stdout


@pytest.mark.parametrize("name, ours", [
    ("DeepSeek-V3.2", "deepseek-v3.2-exp"), ("DeepSeek-R1", "deepseek-v3.1"), ("DeepSeek-V4-Flash", "deepseek-v4-flash"),
])
def test_deepseek_configs_map_onto_the_catalog_models(models, name, ours):
    """The released checkpoints' config.json and npusim's own files (written from models.md) are the same network:
    every field a family uses agrees (V3.1's file keeps V3.2's indexer sizes with index_topk 0: no indexer)."""
    hf, yaml_model = models[name], load_model(ours)
    skip = {"name", "description", "provenance", "source_model_type", "ignored", "checked", "compress_ratios"}
    if not yaml_model.has_indexer:
        skip |= {"index_n_heads", "index_head_dim"}
    for f in yaml_model.__dataclass_fields__:
        if f not in skip:
            assert getattr(hf, f) == getattr(yaml_model, f), f
    assert parameters(hf).total == parameters(yaml_model).total
