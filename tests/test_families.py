"""The non-DeepSeek families' own mechanisms (issue 34): how Qwen3-MoE, GLM-5 and Kimi-K2 deployments run their
step, each test written against a defect the families showed."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    assert ("moe_init_routing" in ops) == (phase == "prefill")


def test_gqa_attention_tp_gathers_its_tokens_again(qwen3, tp16):
    """The o_proj's reduce-scatter leaves each die 1/16 of the tokens; the fused qkv projection runs head-parallel
    on all of them, so they are all-gathered after the input norm, as MLA's latent path is."""
    step = shard(qwen3, tp16, "prefill", batch=1, length=2048, quant=get_quant("w8a8"))
    comms = {c.name: c for c in _moe_layer(step).comms}
    gather = comms["attn_tp_all_gather"]
    assert (gather.after, gather.before) == ("attn_norm", "qkv_proj")
    assert gather.collective.bytes == 2048 * qwen3.hidden_size * 2


def test_qwen3_head_norm_runs_near_its_roofline(qwen3, tp16):
    """Qwen3's per-head q / k RMSNorm ([tokens x 68 heads, 128] per die at TP16) runs in the backends' fused
    split-norm-RoPE kernel, each step over a block of head rows: a chain per block, not 7 barrier'd instructions per
    128-wide row (which put it at ~15x its roofline)."""
    from npusim.kernels.catalog import kernel
    from npusim.engine import simulate
    from npusim.spec.chip import load_chip

    step = shard(qwen3, tp16, "prefill", batch=1, length=2048, quant=get_quant("w8a8"))
    op = next(o for o in _moe_layer(step).ops if o.name == "qk_head_norm")
    assert op.kind == "head_rmsnorm" and op.shape["tokens"] * op.shape["heads"] == 128 * 68
    chip = load_chip("910c-die")
    norm = kernel("rowwise", {"rows": 128 * 68, "dim": 128}, op="head_rmsnorm")
    per_row = kernel("rowwise", {"rows": 128 * 68, "dim": 128})
    assert norm.merged_chain(61) == 1 + 11 + 2  # the cast in, the block's steps, two 64-lane chunks
    assert per_row.chain(61) == 1 + 61 * 7
    roofline = norm.work().hbm_bytes / chip.hbm.bandwidth
    fused = simulate(norm.trace(chip), chip, launch="none").time
    assert fused < 1.6 * roofline < simulate(per_row.trace(chip), chip, launch="none").time / 8
