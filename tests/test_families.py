"""The non-DeepSeek families' own mechanisms (issue 34): how Qwen3-MoE, GLM-5 and Kimi-K2 deployments run their
step, each test written against a defect the families showed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npusim import api
from npusim.errors import NpusimError
from npusim.graph.accounting import cache_footprint, indexer_row_bytes, kv_row_bytes, parameters
from npusim.graph.builder import build_graph
from npusim.parallel.shard import shard
from npusim.spec.model import load_model
from npusim.spec.plan import load_plan
from npusim.spec.quant import get_quant

HF = Path(__file__).resolve().parents[1] / "workloads" / "models" / "hf"
TP16 = """description: Qwen3-235B TP16 without EP (SGLang --tp 16)
decode:
  ranks: 16
  attention: {dp: 1, tp: 16}
  moe: {ep: 1, tp: 16}
  dense_tp: 16
  lm_head_tp: 16
colocated: true
"""


@pytest.fixture(scope="module")
def qwen3():
    return load_model(str(HF / "Qwen3-235B-A22B" / "config.json"))


@pytest.fixture(scope="module")
def tp16(tmp_path_factory):
    path = tmp_path_factory.mktemp("plans") / "qwen3-tp16.yaml"
    path.write_text(TP16)
    return load_plan(str(path))


def _moe_layer(step):
    return next(layer for layer in step.layers if layer.name.endswith("-moe"))


@pytest.mark.parametrize("phase, length", [("prefill", 2048), ("decode", 2176)])
def test_moe_tp_without_ep_reduces_the_hidden_state_and_sends_no_rows(qwen3, tp16, phase, length):
    """MoE TP without EP: every die holds a slice of every expert, so no top-k row is dispatched; the group's hidden
    states are gathered before the gate and the experts' partial sums reduce-scattered after their finalize, each
    tokens x hidden x 2 bytes (an all-reduce), not tokens x top-8 x hidden rows in an all-to-all."""
    batch = 1 if phase == "prefill" else 16
    step = shard(qwen3, tp16, phase, batch=batch, length=length, quant=get_quant("w8a8"))
    layer = _moe_layer(step)
    kinds = {c.name: c.collective for c in layer.comms}
    assert not any(c.kind == "all_to_all" for c in kinds.values())
    tokens = 2048 if phase == "prefill" else 16
    row = tokens * qwen3.hidden_size * 2
    assert kinds["moe_tp_all_gather"].kind == "all_gather" and kinds["moe_tp_all_gather"].bytes == row
    assert kinds["moe_tp_reduce_scatter"].kind == "reduce_scatter" and kinds["moe_tp_reduce_scatter"].bytes == row
    ops = {o.name: o for o in layer.ops}
    # the experts see every token of the group with 1/16 of each expert's intermediate width
    assert ops["experts_gate_up"].shape["rows"] == tokens * qwen3.num_experts_per_tok
    assert ops["experts_gate_up"].shape["n"] == 2 * qwen3.moe_intermediate_size // 16
    assert "moe_re_routing" not in ops and "moe_unsort" not in ops
    # no dispatch kernel routes the rows: the rank's init_routing runs in decode too (vllm-ascend's all-gather path)
    assert ops["moe_init_routing"].shape["rows"] == tokens * qwen3.num_experts_per_tok


def test_gqa_attention_tp_gathers_its_tokens_again(qwen3, tp16):
    """The o_proj's reduce-scatter leaves each die 1/16 of the tokens; the fused qkv projection runs head-parallel
    on all of them, so they are all-gathered after the input norm, as MLA's latent path is."""
    step = shard(qwen3, tp16, "prefill", batch=1, length=2048, quant=get_quant("w8a8"))
    comms = {c.name: c for c in _moe_layer(step).comms}
    gather = comms["attn_tp_all_gather"]
    assert (gather.after, gather.before) == ("attn_norm", "qkv_proj")
    assert gather.collective.bytes == 2048 * qwen3.hidden_size * 2
    # head-parallel on the gathered tokens: 64 / 16 query heads, 4 KV heads over 16 dies = 1 each (replicated)
    ops = {o.name: o for o in _moe_layer(step).ops}
    assert (ops["qkv_proj"].shape["m"], ops["qkv_proj"].shape["n"]) == (2048, (4 + 2 * 1) * 128)
    assert ops["qkv_proj"].weight_bytes == qwen3.hidden_size * 768  # INT8, the die's columns only
    assert (ops["attention"].shape["heads"], ops["attention"].shape["kv_heads"]) == (4, 1)
    assert ops["attention"].shape["tokens"] == 2048


def test_qwen3_head_norm_runs_near_its_roofline(qwen3, tp16):
    """Qwen3's per-head q / k RMSNorm ([2048 tokens x (4 q + 1 k) heads, 128] per die at TP16) runs in the backends'
    fused split-norm-RoPE kernel, each step over a block of head rows: a chain per block, not 7 barrier'd
    instructions per 128-wide row (which put it at ~15x its roofline)."""
    from npusim.kernels.catalog import kernel
    from npusim.engine import simulate
    from npusim.spec.chip import load_chip

    step = shard(qwen3, tp16, "prefill", batch=1, length=2048, quant=get_quant("w8a8"))
    op = next(o for o in _moe_layer(step).ops if o.name == "qk_head_norm")
    assert op.kind == "head_rmsnorm" and (op.shape["tokens"], op.shape["heads"]) == (2048, 5)
    chip = load_chip("910c-die")
    norm = kernel("rowwise", {"rows": 2048 * 5, "dim": 128}, op="head_rmsnorm")
    per_row = kernel("rowwise", {"rows": 2048 * 5, "dim": 128})
    assert norm.merged_chain(61) == 1 + 11 + 2  # the cast in, the block's steps, two 64-lane chunks
    assert per_row.chain(61) == 1 + 61 * 7
    roofline = norm.work().hbm_bytes / chip.hbm.bandwidth
    fused = simulate(norm.trace(chip), chip, launch="none").time
    assert fused < 1.6 * roofline < simulate(per_row.trace(chip), chip, launch="none").time / 8


# ------------------------------------------------------------------------------------------ formats and schedules


def _variant(tmp_path, name: str, **changes) -> str:
    data = json.loads((HF / name / "config.json").read_text())
    data.update(changes)
    folder = tmp_path / f"{name}-variant"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(data))
    return str(folder / "config.json")


def test_w4a16_keeps_bf16_activations_beside_int4_group32_experts():
    """Kimi-K2-Thinking's checkpoint: INT4 routed experts in groups of 32 (a bf16 scale each), everything else BF16,
    activations unquantised: the experts' rows are dispatched in BF16 and the expert GEMM takes BF16 rows."""
    q = get_quant("w4a16")
    assert q.routed_experts.dtype == "int4" and q.routed_experts.bytes_per_element() == 0.5 + 2 / 32
    assert not any(getattr(q, c).quantised for c in ("attention", "shared_experts", "dense_ffn", "lm_head"))
    assert q.activation_for(q.routed_experts).dtype == "bf16"
    kimi = load_model(str(HF / "Kimi-K2-Instruct" / "config.json"))
    graph = build_graph(kimi, "decode", 8, 4096, quant=q)
    experts = next(o for lg in graph.layers for o in lg.ops if o.name == "experts_gate_up")
    assert experts.dtypes["a"] == "bf16" and experts.dtypes["b"] == "int4"
    assert parameters(kimi).weight_bytes(q) < parameters(kimi).weight_bytes(get_quant("bf16")) * 0.35


def test_compressed_tensors_int4_weight_only_reads_as_w4a16(tmp_path):
    group = {"targets": ["Linear"], "input_activations": None,
             "weights": {"num_bits": 4, "group_size": 32, "type": "int", "symmetric": True, "strategy": "group"}}
    path = _variant(tmp_path, "Kimi-K2-Instruct", quantization_config={
        "quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": group}})
    assert load_model(path).default_quant == "w4a16"
    group8 = dict(group, input_activations={"num_bits": 8, "type": "int"})
    path = _variant(tmp_path, "Kimi-K2-Instruct", quantization_config={
        "quant_method": "compressed-tensors", "config_groups": {"group_0": group8}})
    with pytest.raises(NpusimError, match="quantization_config"):
        load_model(path)


def test_indexer_cache_alone_in_int8():
    """C8 of the DSA indexer alone: 130 B a key (int8 + an fp16 scale) beside a BF16 latent row."""
    glm = load_model(str(HF / "GLM-5" / "config.json"))
    q = get_quant("w8a8-ic8")
    assert (q.kv_cache.dtype, q.indexer_cache.dtype) == ("bf16", "int8")
    assert indexer_row_bytes(glm, q) == 130 and kv_row_bytes(glm, q) == 2 * 576
    assert cache_footprint(glm, q).bytes_per_token == 78 * (1152 + 130)


def test_index_topk_freq_shares_the_indexer_over_k_layers(tmp_path):
    """GLM-5.x index_topk_freq k: a layer runs its indexer every k layers, the others reuse its top-k with no
    indexer, no indexer key cache and no indexer weights of their own; the MTP layer runs its own."""
    base = load_model(str(HF / "GLM-5" / "config.json"))
    glm = load_model(_variant(tmp_path, "GLM-5", index_topk_freq=4))
    assert glm.indexer_layers[:9] == (1, 0, 0, 0, 1, 0, 0, 0, 1) and glm.indexer_layer_count == 20
    assert glm.runs_indexer(glm.num_hidden_layers)
    graph = build_graph(glm, "decode", 8, 4096, quant=get_quant("bf16"))
    kinds = {lg.name: lg for lg in graph.layers}
    assert kinds["dsa_shared-moe"].repeat + kinds["dsa-moe"].repeat == 75
    shared_ops = {o.name for o in kinds["dsa_shared-moe"].ops}
    assert "lightning_indexer" not in shared_ops and "indexer_cache_update" not in shared_ops
    attn = next(o for o in kinds["dsa_shared-moe"].ops if o.name == "attention")
    assert attn.kind == "sparse_flash_attention" and attn.shape["topk"] == 2048
    q = get_quant("bf16")
    idx = indexer_row_bytes(glm, q)
    assert cache_footprint(base, q).bytes_per_token - cache_footprint(glm, q).bytes_per_token == 58 * idx
    assert parameters(glm).total < parameters(base).total
    same = load_model(_variant(tmp_path, "GLM-5", indexer_types=["full", "shared", "shared", "shared"] * 19
                               + ["full", "shared"]))
    assert same.indexer_layers == glm.indexer_layers


def test_predict_costs_a_system_given_as_a_file(tmp_path):
    """The cost step reloads the system: by the file it was given, not by the name inside it."""
    import shutil
    import subprocess
    import sys

    system = tmp_path / "my-cloudmatrix.yaml"
    shutil.copy(Path(__file__).resolve().parents[1] / "hardware" / "systems" / "cloudmatrix384.yaml", system)
    out = subprocess.run([sys.executable, "-m", "npusim.cli.main", "predict", "--hw", str(system), "--model",
                          "deepseek-v3.1", "--plan", "r1-a3-decode-a16", "--input", "4096", "--output", "1024",
                          "--batch", "64", "--format", "json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["cost"]["decode_usd_per_mtok"] > 0


def test_gqa_groups_of_twelve_heads_run_under_attention_tp(tmp_path):
    """Qwen3-Coder-480B (96 query / 8 KV heads) under attention TP4: 24 heads and 2 KV heads a rank, 12 a group. A
    128-row attention block holds 10 tokens' 12 heads (was refused: 128 is not a multiple of 12)."""
    from npusim import api

    path = tmp_path / "s10.yaml"
    path.write_text("""description: Qwen3-Coder-480B W8A8, 16 dies PD mixed, --tp 16 --dp 4 (S10 layout)
decode:
  ranks: 16
  attention: {dp: 4, tp: 4}
  moe: {ep: 16, fused_dispatch_tokens: 0}
  dense_tp: 16
  lm_head_tp: 4
colocated: true
""")
    p = api.predict("cloudmatrix384", str(HF / "Qwen3-Coder-480B-A35B" / "config.json"), str(path), input=3500,
                    output=1500, batch=80, quant="w8a8")
    assert 0.02 < p.tpot < 0.1
    from npusim.kernels.catalog import kernel
    from npusim.spec.chip import load_chip
    plan = kernel("flash_attention", {"tokens": 20, "keys": 4096, "heads": 24, "kv_heads": 2, "d_qk": 128,
                                      "d_v": 128, "causal": 0}).geometry(load_chip("910c-die"), 128)
    assert plan.rows == 120


def test_colocated_plan_sets_graph_mode_per_phase(tmp_path):
    """SGLang / vLLM-Ascend capture NPU graphs for decode only: a co-located plan's prefill can launch eagerly beside
    its graph-mode decode (`phases`), the other stream fields kept from the plan; eager launches cost TTFT."""
    from npusim import api

    text = TP16.replace("colocated: true", "streams: {graph_mode: true, comm_overlap: false}\ncolocated: true")
    both, split = tmp_path / "both.yaml", tmp_path / "split.yaml"
    both.write_text(text)
    split.write_text(text + "phases:\n  prefill: {streams: {graph_mode: false}}\n")
    plan = load_plan(str(split))
    assert not plan.streams_of("prefill").graph_mode and plan.streams_of("decode").graph_mode
    assert not plan.streams_of("prefill").comm_overlap
    model = str(HF / "Qwen3-235B-A22B" / "config.json")
    graph, eager = (api.predict("cloudmatrix384", model, str(p), input=2048, output=256, batch=16, quant="w8a8")
                    for p in (both, split))
    assert eager.ttft > graph.ttft and eager.tpot == graph.tpot
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + "phases:\n  mixed: {streams: {graph_mode: false}}\n")
    with pytest.raises(NpusimError, match="phases.mixed"):
        load_plan(str(bad))


def test_gqa_kv_projections_replicate_beyond_the_kv_heads(qwen3, tp16):
    """Qwen3-235B's 4 KV heads over 16 dies: each die stores one KV head's K and V projections (replicated 4x), not
    a sixteenth of the four; at attention TP4 it holds one as well, so TP4 and TP16 differ by the q / o shares."""
    from npusim.parallel.memory import weight_bytes

    q = get_quant("bf16")
    tp4 = load_plan(str(Path(tp16.provenance.file)), {"decode.attention.tp": "4", "decode.attention.dp": "4"})
    w4, w16 = weight_bytes(qwen3, tp4, "decode", q), weight_bytes(qwen3, tp16, "decode", q)
    q_o = 2 * qwen3.hidden_size * qwen3.num_attention_heads * qwen3.head_dim * 2 * 94  # q and o projections, BF16
    assert w4 - w16 == pytest.approx(q_o / 4 - q_o / 16, rel=1e-9)


def test_rope_wider_than_ub_runs_the_per_head_cut():
    """An EAGLE-3 draft's 64 query + 64 KV heads of 128 under DP attention (Kimi-K2's draft, published.md C03): one
    token's rope row is 32 KiB, double-buffered beside its fp32 result 193 KiB > a 910C die's 192 KiB UB. It was
    refused ('tiling.ub ... 1 KiB too many'); it runs CANN's per-head cut, at least as slow as its roofline."""
    from npusim.kernels.catalog import kernel
    from npusim.spec.chip import load_chip

    chip = load_chip("910c-die")
    wide = kernel("rope", {"tokens": 2048, "heads": 128, "dim": 128})
    assert not wide.row_fits(chip)
    assert wide.trace(chip).tiling["head_loop"] == 1
    narrow = kernel("rope", {"tokens": 2048, "heads": 104, "dim": 128})  # Qwen3-Coder's 96 + 8 heads fit
    assert narrow.row_fits(chip) and "head_loop" not in narrow.trace(chip).tiling


def test_gqa_decode_attention_reads_every_sequences_keys(qwen3, tp16):
    """A GQA decode step's attention launch holds its batch's sequences, each reading its own keys (as MLA's does):
    64 sequences of 4K keys read 64x the cache of one. It was timed as one sequence of 64 queries over 4K shared
    keys (S11's decode attention 44 us for 209 MB of KV a die, ~4.8 TB/s: above HBM)."""
    from npusim.parallel.optime import kernel_for
    from npusim.parallel.shard import shard
    from npusim.spec.chip import load_chip

    chip = load_chip("910c-die")
    times = {}
    for batch in (1, 64):
        step = shard(qwen3, tp16, "decode", batch=batch, length=4096, quant=get_quant("bf16"))
        op = next(o for lg in step.layers for o in lg.ops if o.name == "attention")
        assert op.shape["sequences"] == batch
        k = kernel_for(op, chip)
        assert k.batch == batch
        times[batch] = k.work().hbm_bytes
    assert times[64] == pytest.approx(64 * times[1], rel=0.05)


def test_every_family_row_loads_its_deployment():
    """experiments/family_validation.py: every §1b / §1c row's system, model, plan and preset load (none refused),
    the EAGLE-3 rows with their drafts."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import family_validation as fv

    assert {r.id for r in fv.RUNS} == {"S09", "S10", "S11", "S12", "C01", "C02", "C03", "C04", "C05", "C06"}
    for run in fv.RUNS:
        s = fv.setup(run)
        assert s.plan.ranks <= s.system.chips * 2  # dies of the run's cards
        if run.id in ("S12", "C03"):
            assert s.plan.mtp.draft


def test_an_uneven_pipeline_split_is_paced_by_its_longest_stage():
    """GLM-5's 78 layers over PP8 (published.md C02): SGLang's get_pp_indices gives six stages 10 layers and two 9,
    so the stage that paces the pipeline holds 10 of 78, and its weights are 10 of 78 of the model's; an even
    split is unchanged, and more stages than layers is refused."""
    from npusim.spec.plan import load_plan

    inst = load_plan("glm5-a3-sglang-pd-cp-c02").instance("prefill")
    assert inst.pp == 8
    assert inst.busiest_stage(78.0, 78) == 10.0 and inst.busiest_stage(80.0, 80) == 80.0 / 8
    p = api.predict("atlas-800-a3", "workloads/models/hf/GLM-5/config.json", "glm5-a3-sglang-pd-cp-c02",
                    quant="w4a8", input=8192, output=64, batch=32, overrides={"chips": "32"})
    assert p.prefill is not None and p.prefill.time > 0
    with pytest.raises(NpusimError, match="exceed the model's 78 layers"):
        api.predict("atlas-800-a3", "workloads/models/hf/GLM-5/config.json", "glm5-a3-sglang-pd-cp-c02",
                    quant="w4a8", input=8192, output=64, batch=32,
                    overrides={"chips": "200", "plan.prefill.pp": "79", "plan.prefill.ranks": "316"})
