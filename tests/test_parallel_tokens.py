"""Where a DP-attention group's tokens go: attention on the whole group's tokens, the MoE path on each die's share.

These tests only shard (no kernel is simulated), so they are fast enough to sweep with hypothesis.
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim.errors import NpusimError
from npusim.parallel.shard import shard
from npusim.spec.model import load_model
from npusim.spec.plan import load_plan
from npusim.spec.quant import get_quant

R1 = load_model("deepseek-v3.1")
W8A8 = get_quant("w8a8")


def _prefill_plan(ranks: int, dp: int, tp: int, **extra: str):
    """SGLang `--tp ranks --dp dp --enable-dp-attention` with the DeepEP all-to-all MoE over every rank."""
    over = {"prefill.ranks": str(ranks), "prefill.attention.dp": str(dp), "prefill.attention.tp": str(tp),
            "prefill.moe.ep": str(ranks), "prefill.microbatches": "1", "streams.two_microbatch": "false", **extra}
    return load_plan("r1-a3-prefill-a15", over)


def _moe_layer(plan, batch: int, length: int):
    step = shard(R1, plan, "prefill", batch=batch, length=length, quant=W8A8)
    return next(layer for layer in step.layers if layer.name == "mla-moe")


def _op(layer, name):
    return next(o for o in layer.ops if o.name == name)


def _comm(layer, name):
    return next(c.collective for c in layer.comms if c.name == name)


def test_expert_rows_are_the_dies_share():
    """SGLang `--tp 16 --dp 2 --enable-dp-attention`: each group of 8 dies gets 4 x 3,500-token prompts; after
    attention its 14,000 tokens (112,000 top-8 rows) are split over the 8 dies, 14,000 rows each."""
    layer = _moe_layer(_prefill_plan(16, 2, 8), batch=8, length=3500)
    assert _op(layer, "experts_gate_up").shape["rows"] == 14000
    assert _op(layer, "moe_gate").shape["m"] == 1750
    assert _op(layer, "shared_gate_up").shape["m"] == 1750
    dispatch = _comm(layer, "moe_dispatch")
    assert dispatch.bytes == pytest.approx(1750 * 8 * 7168 * W8A8.activation.bytes_per_element())  # its INT8 rows
    # attention runs on the whole group: the latent down-projections are replicated, o_proj is row-parallel
    assert _op(layer, "q_a_proj").shape["m"] == 14000
    o_proj = _op(layer, "o_proj")
    assert (o_proj.shape["m"], o_proj.shape["k"]) == (14000, 128 * 128 // 8)
    assert _comm(layer, "o_proj_reduce_scatter").bytes == pytest.approx(14000 * 7168 * 2)
    assert _comm(layer, "attn_tp_all_gather").bytes == pytest.approx(14000 * 7168 * 2)


def test_vllm_sequence_parallel_moe_all_reduces_then_chunks():
    layer = _moe_layer(_prefill_plan(16, 2, 8, **{"prefill.attention.tp_reduce": "all_reduce"}), batch=8, length=3500)
    assert "o_proj_reduce_scatter" not in [c.name for c in layer.comms]
    assert _comm(layer, "o_proj_all_reduce").kind == "all_reduce"
    assert _op(layer, "experts_gate_up").shape["rows"] == 14000


def _expert_rows(dp: int, tp: int, batch: int, length: int) -> int:
    return _op(_moe_layer(_prefill_plan(dp * tp, dp, tp), batch, length), "experts_gate_up").shape["rows"]


@settings(max_examples=25, deadline=None)
@given(dp=st.sampled_from([1, 2, 4]), tp=st.sampled_from([1, 2, 4, 8]), per_group=st.integers(1, 4),
       length=st.integers(64, 4096))
def test_attention_tp_never_multiplies_expert_work(dp, tp, per_group, length):
    """Over the whole instance the experts compute every token's top-k rows once, whatever the attention TP; so
    doubling attention TP inside a fixed DP group (twice the dies) never grows a die's expert rows, and at a fixed
    instance size (half the DP groups, each twice as wide) leaves them as they were."""
    batch, k = dp * per_group, R1.num_experts_per_tok
    rows = _expert_rows(dp, tp, batch, length)
    assert rows == math.ceil(per_group * length * k / tp)  # the instance's rows, dealt out once over dp x tp dies
    assert _expert_rows(dp, 2 * tp, batch, length) <= rows
    if dp > 1:
        assert _expert_rows(dp // 2, 2 * tp, batch, length) == rows


def test_o_proj_group_must_hold_whole_attention_tp_groups():
    with pytest.raises(NpusimError, match="multiple of attention.tp"):
        _prefill_plan(16, 2, 8, **{"prefill.o_proj_tp": "4"})


def test_dsa_indexer_is_replicated_over_attention_tp():
    """SGLang's and vLLM's DSA Indexer has no tensor parallelism: every die of a TP4 group scores the group's
    queries, while the MLA heads (and their absorbed attention) are split four ways."""
    plan = load_plan("v32-a3-sglang-pd-tp4")
    step = shard(load_model("deepseek-v3.2-exp"), plan, "decode", batch=16, length=65536, quant=get_quant("w8a8"))
    layer = next(lay for lay in step.layers if lay.name == "dsa-moe")
    group = 2 * (1 + plan.mtp.depth)  # 2 sequences per DP group, 1 + 3 MTP tokens each
    assert _op(layer, "lightning_indexer").shape["tokens"] == group
    assert _op(layer, "idx_q_b_proj").shape["m"] == group
    assert _op(layer, "attention").shape["tokens"] == group // 4
    assert _op(layer, "experts_gate_up").shape["rows"] == group // 4 * 8


def test_decode_attention_ops_carry_their_sequences():
    """A decode attention-type op knows how many sequences its queries belong to (the kernel reads each one's keys
    apart): on an attention-DP rank its share of the batch, cut like its tokens under attention TP; the indexer,
    replicated over the TP group, keeps the group's. A prefill op has none (its causal pairs carry the batch)."""
    v32, q = load_model("deepseek-v3.2-exp"), get_quant("w8a8c8")
    step = shard(v32, load_plan("v32-a3-decode-w8a8c8-mtp3"), "decode", batch=512, length=65536, quant=q)
    layer = next(lay for lay in step.layers if lay.name == "dsa-moe")
    assert _op(layer, "attention").shape["sequences"] == _op(layer, "lightning_indexer").shape["sequences"] == 4
    assert _op(layer, "attention").shape["tokens"] == 4 * (1 + 3)
    tp4 = shard(v32, load_plan("v32-a3-sglang-pd-tp4"), "decode", batch=16, length=65536, quant=get_quant("w8a8"))
    layer = next(lay for lay in tp4.layers if lay.name == "dsa-moe")
    assert _op(layer, "lightning_indexer").shape["sequences"] == 2 and _op(layer, "attention").shape["sequences"] == 1
    prefill = _moe_layer(_prefill_plan(16, 2, 8), batch=8, length=3500)
    assert "sequences" not in _op(prefill, "attention").shape


def test_a_dense_mla_decode_kernel_runs_per_sequence_and_full_quant_over_an_int8_cache():
    """optime gives the kernel the op's sequences as its batch and each its tokens; the absorbed MLA over an INT8
    latent (C8) runs INT8 on the cube (R1's npu_fused_infer_attention_score_v2 query_quant_mode 3), over a BF16 cache
    BF16; DSA's sparse attention dequantises its INT8 cache and stays BF16."""
    from npusim.parallel.optime import kernel_for
    from npusim.spec.chip import load_chip
    chip = load_chip("910c-die")
    plan = load_plan("r1-a3-decode-a16")
    for quant, dtype in (("w8a8c8", "int8"), ("w8a8", "bf16")):
        step = shard(R1, plan, "decode", batch=6144, length=4096, quant=get_quant(quant))
        attn = _op(next(lay for lay in step.layers if lay.name == "mla-moe"), "attention")
        k = kernel_for(attn, chip)
        assert (k.batch, k.tokens, k.dtype) == (48, 2, dtype)
    v32 = shard(load_model("deepseek-v3.2-exp"), load_plan("v32-a3-decode-w8a8c8-mtp3"), "decode", batch=256,
                length=65536, quant=get_quant("w8a8c8"))
    sfa = kernel_for(_op(next(lay for lay in v32.layers if lay.name == "dsa-moe"), "attention"), chip)
    assert (sfa.batch, sfa.tokens, sfa.dtype) == (2, 4, "bf16")
