"""`npusim model` end to end: the issue's done-when command for each model, formats, and bad input (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from npusim.graph import build_graph
from npusim.spec.model import load_model


def npusim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npusim.cli.main", "model", *args], capture_output=True, text=True,
                          timeout=60)


def test_list_shows_the_four_models_with_their_size():
    out = npusim("list", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)["rows"]}
    assert rows["deepseek-v3.2-exp"]["params (B)"] == pytest.approx(671, rel=0.01)
    assert rows["deepseek-v4-flash"]["activated (B)"] == pytest.approx(13, rel=0.03)
    assert rows["deepseek-v3.2-exp"]["cache B/token"] == 48068  # FP8 checkpoint format


@pytest.mark.parametrize("name, layer, lightning_gmac", [
    ("deepseek-v3.2-exp", "dsa-moe x58", 1.074), ("deepseek-v3.1", "mla-moe x58", None),
    ("deepseek-v4-flash", "csa-moe x20", 0.268), ("deepseek-v4-pro", "csa-moe x29", 0.268),
])
def test_show_decode_128k_totals(name, layer, lightning_gmac):
    out = npusim("show", name, "--phase", "decode", "--context", "131072", "--batch", "1", "--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    graph = build_graph(load_model(name), "decode", 1, 131072)
    assert data["total GFLOP"] == pytest.approx(graph.flops / 1e9, abs=1e-3)
    rows = [r for r in data["rows"] if r["layer"] == layer]
    li = [r for r in rows if r["op"] == "lightning_indexer"]
    if lightning_gmac is None:
        assert not li
    else:  # 64 heads x 128 dims per visible (compressed) key: 131072 keys, or 32768 entries for V4 CSA
        assert li[0]["GFLOP"] / 2 == pytest.approx(lightning_gmac, rel=0.002)
    per_layer = next(r for r in rows if r["op"] == "= per layer")
    assert per_layer["GFLOP"] == pytest.approx(sum(r["GFLOP"] for r in rows if r["op"] != "= per layer"))


def test_show_table_and_csv():
    table = npusim("show", "deepseek-v4-flash", "--phase", "prefill", "--seq-len", "8192", "--quant", "bf16")
    assert table.returncode == 0, table.stderr
    assert "mhc_pre_attn" in table.stdout and "kv_compressor" in table.stdout and "total GFLOP" in table.stdout
    csv = npusim("show", "deepseek-v3.2-exp", "--mtp", "1", "--format", "csv")
    assert csv.returncode == 0 and csv.stdout.splitlines()[0].startswith("layer,op,kernel")
    assert any(line.startswith("mtp,") for line in csv.stdout.splitlines())


def test_show_accepts_a_hf_config_json(tmp_path):
    config = {"model_type": "deepseek_v3", "vocab_size": 1000, "hidden_size": 256, "num_hidden_layers": 2,
              "max_position_embeddings": 4096, "num_attention_heads": 4, "q_lora_rank": 64, "qk_rope_head_dim": 16,
              "kv_lora_rank": 32, "qk_nope_head_dim": 32, "v_head_dim": 32, "intermediate_size": 512,
              "first_k_dense_replace": 1, "moe_intermediate_size": 64, "n_routed_experts": 8, "n_shared_experts": 1,
              "num_experts_per_tok": 2, "scoring_func": "sigmoid", "routed_scaling_factor": 1.0,
              "torch_dtype": "bfloat16", "rope_scaling": None, "architectures": ["DeepseekV3ForCausalLM"]}
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    out = npusim("show", str(path), "--context", "100", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert {r["layer"] for r in json.loads(out.stdout)["rows"]} >= {"mla-dense", "mla-moe"}


@pytest.mark.parametrize("args, words", [
    (("show", "deepseek-v4-flsh"), ["unknown model", "deepseek-v4-flash"]),
    (("show", "deepseek-v3.2-exp", "--quant", "w8a9"), ["--quant", "w8a8"]),
    (("show", "deepseek-v3.2-exp", "--context", "-1"), ["--context", ">= 1"]),
    (("show", "deepseek-v4-pro", "--set", "o_groups=5"), ["o_groups", "does not divide"]),
    (("show", "deepseek-v3.2-exp", "--set", "hiden_size=1"), ["hiden_size", "hidden_size"]),
    (("show", "deepseek-v3.1", "--set", "n_group=3"), ["--set n_group", "does not divide"]),
    (("show", "missing/config.json"), ["missing/config.json", "no such"]),
])
def test_bad_input_is_one_sentence_and_exit_2(args, words):
    out = npusim(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    for w in words:
        assert w in out.stderr, (w, out.stderr)


def test_list_shows_the_shipped_hf_configs_beside_the_built_ins(tmp_path):
    """Issue 29 item 5: the configs of workloads/models/hf (GLM-5, Kimi-K2, Qwen3, ...) are listed with the built-ins,
    each under the name `--model` takes (from any directory), with its model_type and size; drafts are not listed."""
    out = subprocess.run([sys.executable, "-m", "npusim.cli.main", "model", "list", "--format", "json"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {r["name"].split("/hf/")[-1]: r for r in json.loads(out.stdout)["rows"]}
    assert rows["deepseek-v3.2-exp"]["kind"] == "built-in"
    glm5 = rows["GLM-5/config.json"]
    assert glm5["kind"] == "HF config" and "glm_moe_dsa" in glm5["description"] and glm5["layers"] == 78
    assert rows["Kimi-K2-Instruct/config.json"]["params (B)"] == pytest.approx(1026, rel=0.01)
    assert "Qwen3-235B-A22B/config.json" in rows and not any("drafts" in n for n in rows)
    name = next(r["name"] for r in json.loads(out.stdout)["rows"] if r["name"].endswith("GLM-5/config.json"))
    show = subprocess.run([sys.executable, "-m", "npusim.cli.main", "model", "show", name, "--format", "json"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert show.returncode == 0, show.stderr
