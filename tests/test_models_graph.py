"""Op graphs against the per-token MAC figures of models.md §1.5, §2.6 and the MTP table of §3.3."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from npusim.errors import NpusimError
from npusim.graph import build_graph
from npusim.graph.accounting import parameters
from npusim.graph.positions import Queries, prefix_floor, prefix_min
from npusim.parallel.optime import kernel_name
from npusim.spec.model import load_model
from npusim.spec.plan import ModelCode
from npusim.spec.quant import BF16, get_quant

K128 = 131072


@pytest.fixture(scope="module")
def m():
    return {n: load_model(n) for n in ("deepseek-v3.2-exp", "deepseek-v3.1", "deepseek-v4-flash", "deepseek-v4-pro")}


def macs(graph, layer: str, op: str) -> float:
    """MACs per token of one op of one layer type."""
    return graph.layer(layer).op(op).flops / 2 / graph.scenario["tokens"]


# ------------------------------------------------------------------------------------------ closed-form sums


@pytest.mark.parametrize("n, cap", [(0, 5), (1, 5), (7, 5), (100, 7), (100, None), (2048, 2048), (5000, 2048)])
def test_prefix_min_matches_a_loop(n, cap):
    assert prefix_min(n, cap) == sum(min(x, cap) if cap else x for x in range(1, n + 1))


@pytest.mark.parametrize("n, ratio, cap", [(3, 4, None), (4, 4, None), (1001, 4, None), (1001, 128, None),
                                           (4000, 4, 512), (2047, 4, 512), (2048, 4, 512), (9, 4, 1)])
def test_prefix_floor_matches_a_loop(n, ratio, cap):
    assert prefix_floor(n, ratio, cap) == sum(min(x // ratio, cap) if cap else x // ratio for x in range(1, n + 1))


def test_queries_cover_prefill_and_decode():
    pre = Queries(batch=2, first=1, per_seq=3000)
    x = np.arange(1, 3001)
    assert pre.pairs(2048) == 2 * int(np.minimum(x, 2048).sum())
    assert pre.pairs() == 2 * 3000 * 3001 // 2
    assert pre.new_entries(128) == 2 * 23
    dec = Queries(batch=4, first=65536, per_seq=2)
    assert dec.pairs() == 4 * (65536 + 65537) and dec.pairs(2048) == 4 * 2 * 2048
    assert dec.compressed_pairs(4, 512) == 4 * 2 * 512


# ------------------------------------------------------------------------------------------ DeepSeek-V3.2 / V3.1


def test_v32_decode_macs_per_token(m):
    """models.md §1.5 per token per layer MACs at 128K context."""
    g = build_graph(m["deepseek-v3.2-exp"], "decode", 1, K128, quant="bf16")
    layer = "dsa-moe"
    for op, expected in (("q_a_proj", 11.0e6), ("q_b_proj", 37.7e6), ("kv_a_proj", 4.1e6), ("o_proj", 117.4e6),
                         ("q_absorb", 8.4e6), ("o_absorb", 8.4e6), ("idx_q_b_proj", 12.6e6),
                         ("idx_k_proj", 0.92e6), ("idx_weights_proj", 0.46e6),  # §1.5 rounds: 0.9M, 0.5M
                         ("lightning_indexer", 1.07e9), ("attention", 285e6)):
        assert macs(g, layer, op) == pytest.approx(expected, rel=0.015), op
    moe = sum(macs(g, layer, op) for op in ("experts_gate_up", "experts_down", "shared_gate_up", "shared_down"))
    dense = sum(macs(g, "dsa-dense", op) for op in ("gate_up_proj", "down_proj"))
    assert moe == pytest.approx(396e6, rel=0.002) and dense == pytest.approx(396e6, rel=0.002)
    assert g.layer(layer).op("lightning_indexer").shape["topk"] == 2048
    assert g.layer(layer).op("experts_gate_up").shape["experts"] == 8  # one token touches its 8 experts
    assert [lg.repeat for lg in g.layers if lg.layers] == [3, 58]


def test_indexer_grows_with_context_sparse_attention_does_not(m):
    model = m["deepseek-v3.2-exp"]
    at = {c: build_graph(model, "decode", 1, c).layer("dsa-moe") for c in (1024, 4096, 65536, K128)}
    li = {c: lg.op("lightning_indexer").flops for c, lg in at.items()}
    sfa = {c: lg.op("attention").flops for c, lg in at.items()}
    assert li[K128] == pytest.approx(2 * li[65536]) and li[K128] == pytest.approx(32 * li[4096])
    assert sfa[4096] == sfa[K128] == 2 * sfa[1024]  # 1024 keys below top-k, then flat at 2048


def test_prefill_is_causal_indexer_quadratic_sparse_linear(m):
    model = m["deepseek-v3.2-exp"]
    g1, g2 = (build_graph(model, "prefill", 1, s).layer("dsa-moe") for s in (32768, 65536))
    s = 65536
    assert g2.op("lightning_indexer").shape["pairs"] == s * (s + 1) // 2
    assert g2.op("attention").shape["pairs"] == 2048 * 2049 // 2 + (s - 2048) * 2048
    li = g2.op("lightning_indexer").flops / g1.op("lightning_indexer").flops
    sfa = g2.op("attention").flops / g1.op("attention").flops
    assert li == pytest.approx(4.0, rel=1e-3) and sfa == pytest.approx(2.0, rel=0.04)
    # the LM head only needs the last position's logits
    assert build_graph(model, "prefill", 3, 100).layer("lm_head").op("lm_head").shape["m"] == 3


def test_mtp_table_of_models_md(m):
    """§3.3, 4 x 64K decode, C8: Cube QK^T MACs dense MLA 19.33 / 38.65 G, SFA 0.60 / 1.21 G, LI 2.15 / 4.29 G;
    LI reads the same keys with MTP1 (32 / 32 MB of 128 B keys), SFA gathers twice as many rows (4.5 / 9 MB)."""
    def attn(name, layer, mtp):
        return build_graph(m[name], "decode", 4, 65536, mtp_tokens=mtp, quant="w8a8c8").layer(layer)

    for mtp, scale in ((0, 1), (1, 2)):
        v31, v32 = attn("deepseek-v3.1", "mla-moe", mtp), attn("deepseek-v3.2-exp", "dsa-moe", mtp)
        qk = 128 * 576  # MACs of Q.K^T per query-key pair
        assert v31.op("attention").shape["pairs"] * qk == pytest.approx(19.33e9 * scale, rel=0.002)
        assert v32.op("attention").shape["pairs"] * qk == pytest.approx(0.604e9 * scale, rel=0.002)
        assert v32.op("lightning_indexer").flops / 2 == pytest.approx(2.147e9 * scale, rel=0.002)
    li0, li1 = (attn("deepseek-v3.2-exp", "dsa-moe", k).op("lightning_indexer").bytes_read for k in (0, 1))
    assert li1 == pytest.approx(li0, rel=0.01) and li0 == pytest.approx(4 * 65536 * 130, rel=0.02)
    sfa0, sfa1 = (attn("deepseek-v3.2-exp", "dsa-moe", k).op("attention").bytes_read for k in (0, 1))
    assert sfa1 == pytest.approx(2 * sfa0, rel=0.01)


def test_v31_has_no_indexer_and_prefills_in_mha_mode(m):
    v31 = m["deepseek-v3.1"]
    dec = build_graph(v31, "decode", 1, K128).layer("mla-moe")
    assert not any(op.name.startswith("idx_") or op.kind == "lightning_indexer" for op in dec.ops)
    assert dec.op("attention").kind == "flash_attention"
    assert dec.op("attention").flops / 2 == pytest.approx(128 * K128 * (576 + 512))
    pre = build_graph(v31, "prefill", 1, 4096)
    assert macs(pre, "mla-moe", "kv_b_proj") == pytest.approx(16.8e6, rel=0.002)  # naive prefill instead of absorb
    assert pre.layer("mla-moe").op("attention").shape["d_qk"] == 192


def test_weights_in_the_graph_match_the_parameter_count(m):
    """A prefill big enough to touch every expert reads each weight once: graph weight bytes = 2 x parameters."""
    for name in ("deepseek-v3.2-exp", "deepseek-v4-flash"):
        model = m[name]
        g = build_graph(model, "prefill", 16, 4096, quant="bf16")
        p = parameters(model)
        embedding = g.layer("embedding").weight_bytes
        expected = 2 * (p.total - p.by_class["embedding"])
        assert g.weight_bytes - embedding == pytest.approx(expected, rel=0.002), name


def test_quant_sets_the_op_dtypes_and_bytes(m):
    model = m["deepseek-v3.2-exp"]
    bf16, w4 = (build_graph(model, "decode", 1, K128, quant=q).layer("dsa-moe") for q in ("bf16", "w4a8c8"))
    assert w4.op("experts_down").dtypes == {"a": "int8", "b": "int4", "out": "bf16"}
    assert w4.op("o_proj").dtypes["b"] == "int8" and w4.op("idx_weights_proj").dtypes["b"] == BF16.dtype
    assert w4.op("experts_down").weight_bytes == pytest.approx(bf16.op("experts_down").weight_bytes / 4, rel=0.02)
    assert w4.op("kv_cache_update").kind == "quant" and bf16.op("kv_cache_update").kind == "cache_update"


def test_ascend_int8_keeps_kv_b_in_bf16_and_quantises_bf16_inputs_in_prefill(m):
    """cann-recipes' INT8 checkpoints leave kv_b_proj BF16; a W8A8 prefill quantises each BF16-fed linear's input
    first (q_a and kv_a separately), the experts' and down projections' inputs arrive quantised; decode adds none."""
    v31 = m["deepseek-v3.1"]
    pre = build_graph(v31, "prefill", 2, 4096, quant="w8a8").layer("mla-moe")
    dec = build_graph(v31, "decode", 8, 4096, quant="w8a8").layer("mla-moe")
    assert pre.op("kv_b_proj").dtypes["b"] == "bf16" and dec.op("q_absorb").dtypes["b"] == "bf16"
    assert pre.op("q_b_proj").dtypes["b"] == "int8"
    names = [op.name for op in pre.ops]
    quants = [n for n in names if n.endswith("_proj_quant") or n.endswith("_up_quant")]
    assert quants == ["q_a_proj_quant", "q_b_proj_quant", "kv_a_proj_quant", "o_proj_quant", "shared_gate_up_quant"]
    for q in quants:
        assert names.index(q) + 1 == names.index(q.removesuffix("_quant"))  # right before its linear
    q_a = pre.op("q_a_proj_quant")
    assert q_a.kind == "quant" and q_a.shape == {"rows": 8192, "elements": v31.hidden_size}
    assert not any(op.name.endswith("_quant") for op in dec.ops)
    bf16 = build_graph(v31, "prefill", 2, 4096, quant="bf16").layer("mla-moe")
    assert not any(op.name.endswith("_quant") for op in bf16.ops)
    fp8 = build_graph(v31, "prefill", 2, 4096, quant="fp8").layer("mla-moe")
    assert fp8.op("kv_b_proj").dtypes["b"] == "fp8"  # the DeepSeek checkpoint's own format


def test_v32_int8_keeps_q_a_kv_a_and_indexer_wk_in_bf16_r1_quantises_them(m):
    """V3.2-Exp's INT8 conversion ignores q_a_proj, kv_a_proj_with_mqa and the indexer's wk (convert_model.py
    :174-178); R1's quantises them. A BF16 linear gets no DynamicQuant before it, and its weights count at 2 B."""
    v32, v31 = m["deepseek-v3.2-exp"], m["deepseek-v3.1"]
    for quant in ("w8a8", "w8a8c8", "w4a8", "w4a8c8"):
        pre = build_graph(v32, "prefill", 1, 4096, quant=quant).layer("dsa-moe")
        dec = build_graph(v32, "decode", 8, 4096, quant=quant).layer("dsa-moe")
        for g in (pre, dec):
            assert {g.op(n).dtypes["b"] for n in ("q_a_proj", "kv_a_proj", "idx_k_proj")} == {"bf16"}
            assert g.op("q_a_proj").dtypes["a"] == "bf16"
            assert g.op("q_b_proj").dtypes["b"] == "int8" and g.op("idx_q_b_proj").dtypes["b"] == "int8"
        quants = [op.name for op in pre.ops if op.name.endswith(("_proj_quant", "_up_quant"))]
        assert quants == ["q_b_proj_quant", "o_proj_quant", "shared_gate_up_quant"]
    r1 = build_graph(v31, "prefill", 1, 4096, quant="w8a8").layer("mla-moe")
    assert r1.op("q_a_proj").dtypes["b"] == "int8" and r1.op("kv_a_proj").dtypes["b"] == "int8"
    p = parameters(v32)
    h, ql, kv_a, idim = v32.hidden_size, v32.q_lora_rank, v32.kv_lora_rank + v32.qk_rope_head_dim, v32.index_head_dim
    assert p.by_class["mla_a"] == v32.num_hidden_layers * h * (ql + kv_a)
    assert p.by_class["indexer_k"] == v32.num_hidden_layers * h * idim
    assert "mla_a" not in parameters(v31).by_class
    w8 = get_quant("w8a8")
    assert p.weight_bytes(w8) - p.weight_bytes(replace(w8, mla_a=w8.attention, indexer_k=w8.indexer)) == \
        pytest.approx(p.by_class["mla_a"] + p.by_class["indexer_k"])  # 2 B instead of 1 B each


def test_w8a8_experts_gate_up_leaves_int32_for_the_fused_dequant_swiglu_quant(m):
    """cann-recipes' W8A8 experts: the grouped matmul outputs int32 and npu_dequant_swiglu_quant turns it into the
    down projection's int8 rows (4 B per gate-up output read, 1 B + a row scale written); W4A8 and BF16 keep the
    BF16 SwiGLU."""
    v31 = m["deepseek-v3.1"]
    for phase, batch in (("prefill", 2), ("decode", 8)):
        g = build_graph(v31, phase, batch, 4096, quant="w8a8").layer("mla-moe")
        up, act = g.op("experts_gate_up"), g.op("experts_swiglu")
        rows, w = act.shape["rows"], v31.moe_intermediate_size
        assert up.dtypes["out"] == "int32" and up.bytes_written == 4 * rows * 2 * w
        assert act.kind == "dequant_swiglu_quant" and act.dtypes == {"x": "int32", "out": "int8"}
        assert act.bytes_read == rows * (8 * w + 4) and act.bytes_written == pytest.approx(rows * (w + 4 * w / 128))
    for quant in ("w4a8", "bf16"):
        g = build_graph(v31, "prefill", 2, 4096, quant=quant).layer("mla-moe")
        assert g.op("experts_gate_up").dtypes["out"] == "bf16" and g.op("experts_swiglu").kind == "swiglu"


def test_w8a8_shared_expert_and_dense_mlp_take_the_int32_path_too(m):
    """cann-recipes' DeepseekV3SharedExpert / DeepseekV3DenseMLP.forward_w8a8int8: the gate-up linear outputs int32
    and npu_dequant_swiglu_quant writes the down projection's int8 input; BF16 keeps the BF16 linear and SwiGLU."""
    v31 = m["deepseek-v3.1"]
    g = build_graph(v31, "prefill", 2, 4096, quant="w8a8")
    for layer, (up, mid, down), w in (("mla-moe", ("shared_gate_up", "shared_swiglu", "shared_down"),
                                       v31.moe_intermediate_size * v31.n_shared_experts),
                                      ("mla-dense", ("gate_up_proj", "swiglu", "down_proj"), v31.intermediate_size)):
        lg = g.layer(layer)
        assert lg.op(up).dtypes["out"] == "int32" and lg.op(up).bytes_written == 4 * 8192 * 2 * w
        assert lg.op(mid).kind == "dequant_swiglu_quant" and lg.op(mid).shape == {"rows": 8192, "width": w}
        assert lg.op(down).dtypes == {"a": "int8", "b": "int8", "out": "bf16"}
        assert kernel_name(lg.op(up)) == "gemm" and kernel_name(lg.op(down)) == "quant_matmul"
    bf16 = build_graph(v31, "prefill", 2, 4096, quant="bf16").layer("mla-moe")
    assert bf16.op("shared_gate_up").dtypes["out"] == "bf16" and bf16.op("shared_swiglu").kind == "swiglu"


def test_an_fp32_router_casts_the_hidden_states_and_runs_the_gate_in_fp32(m):
    """The plan's model_code.router_dtype fp32 (cann-recipes' R1 gate): a bf16 -> fp32 copy of the hidden states right
    before the gate, whose GEMM reads fp32 activations and an fp32 weight; by default neither."""
    v31 = m["deepseek-v3.1"]
    h, e = v31.hidden_size, v31.n_routed_experts
    for phase, batch in (("prefill", 2), ("decode", 8)):
        g = build_graph(v31, phase, batch, 4096, quant="w8a8", code=ModelCode(router_dtype="fp32")).layer("mla-moe")
        names = [o.name for o in g.ops]
        cast, gate = g.op("moe_gate_cast"), g.op("moe_gate")
        t = gate.shape["m"]
        assert names.index("moe_gate_cast") + 1 == names.index("moe_gate")
        assert cast.kind == "copy" and cast.dtypes == {"x": "bf16", "out": "fp32"}
        assert cast.bytes_read == 2 * t * h and cast.bytes_written == 4 * t * h
        assert gate.dtypes["a"] == gate.dtypes["b"] == "fp32" and gate.weight_bytes == 4 * h * e
        plain = build_graph(v31, phase, batch, 4096, quant="w8a8").layer("mla-moe")
        assert "moe_gate_cast" not in [o.name for o in plain.ops] and plain.op("moe_gate").dtypes["a"] == "bf16"


def test_ntd_copies_make_q_contiguous_and_repeat_k_rope_over_the_heads(m):
    """model_code.ntd_copies (cann-recipes' R1 prefill): q_pe copied contiguous before RoPE, q_nope before attention,
    k_rope repeated once per head for every key; an absorbed-MLA decode and the default MHA prefill have none."""
    v31 = m["deepseek-v3.1"]
    nh, t = v31.num_attention_heads, 8192
    g = build_graph(v31, "prefill", 2, 4096, quant="w8a8", code=ModelCode(ntd_copies=True)).layer("mla-moe")
    names = [o.name for o in g.ops]
    assert names.index("q_pe_copy") + 1 == names.index("rope")
    assert names.index("kv_b_proj") < names.index("k_rope_repeat") < names.index("q_nope_copy") == \
        names.index("attention") - 1
    assert g.op("q_pe_copy").bytes_read == g.op("q_pe_copy").bytes_written == 2 * t * nh * v31.qk_rope_head_dim
    assert g.op("q_nope_copy").shape == {"rows": t, "cols": nh * v31.qk_nope_head_dim}
    rep = g.op("k_rope_repeat")
    assert rep.shape == {"rows": t, "cols": v31.qk_rope_head_dim, "repeat": nh} and rep.bytes_written == nh * rep.bytes_read
    for g in (build_graph(v31, "decode", 8, 4096, quant="w8a8", code=ModelCode(ntd_copies=True)),
              build_graph(v31, "prefill", 2, 4096, quant="w8a8")):
        assert not {"q_pe_copy", "q_nope_copy", "k_rope_repeat"} & {o.name for o in g.layer("mla-moe").ops}


def test_deepseek_v3_norms_add_the_residual(m):
    """npu_add_rms_norm for both norms of a V3 / V3.2 decoder layer: the residual rows read and the sum written
    beside the normed rows (twice the bytes); V4 (mHC) and the GQA models keep the plain norm."""
    for name, layer in (("deepseek-v3.1", "mla-moe"), ("deepseek-v3.2-exp", "dsa-moe")):
        g = build_graph(m[name], "prefill", 1, 4096, quant="bf16").layer(layer)
        for n in ("attn_norm", "ffn_norm"):
            op, h = g.op(n), m[name].hidden_size
            assert op.shape["residual"] == 1 and op.bytes_written == 2 * 2 * 4096 * h
            assert op.bytes_read == 2 * 2 * 4096 * h + op.weight_bytes
        assert "residual" not in g.op("q_norm").shape
    v4 = build_graph(m["deepseek-v4-flash"], "decode", 1, 4096, quant="bf16").layer("csa-moe")
    assert not any("residual" in v4.op(n).shape for n in ("attn_norm", "ffn_norm"))


# ------------------------------------------------------------------------------------------ DeepSeek-V4


def test_v4_flash_decode_macs_per_token(m):
    """models.md §2.6 (Flash) at a context where CSA selects its full 128 + 512 keys."""
    g = build_graph(m["deepseek-v4-flash"], "decode", 1, K128, quant="bf16")
    for layer, op, expected in (("csa-moe", "q_a_proj", 4.2e6), ("csa-moe", "q_b_proj", 33.6e6),
                                ("csa-moe", "kv_proj", 2.1e6), ("csa-moe", "o_a_proj", 33.6e6),
                                ("csa-moe", "o_b_proj", 33.6e6), ("csa-moe", "kv_compressor", 8.4e6),
                                ("csa-moe", "idx_compressor", 2.1e6), ("csa-moe", "idx_q_b_proj", 8.4e6),
                                ("hca-moe", "kv_compressor", 4.2e6), ("csa-moe", "attention", 42e6)):
        assert macs(g, layer, op) == pytest.approx(expected, rel=0.02), (layer, op)
    csa = g.layer("csa-moe")
    assert csa.op("attention").shape["pairs"] == 128 + 512
    assert csa.op("o_a_proj").shape["batch"] == 8
    moe = sum(macs(g, "csa-moe", op) for op in ("experts_gate_up", "experts_down", "shared_gate_up", "shared_down"))
    assert moe == pytest.approx(176e6, rel=0.003)
    mhc = sum(csa.op(op).shape["mix"] * 4 * 4096 for op in ("mhc_pre_attn", "mhc_pre_ffn"))
    assert mhc == pytest.approx(0.8e6, rel=0.02)  # two 24 x 16384 GEMVs per layer
    assert csa.op("experts_swiglu").shape["clamp"] == 10
    assert g.layer("swa-hash-moe").op("moe_gate").shape["hash"] == 1 and csa.op("moe_gate").shape["hash"] == 0
    assert [lg.repeat for lg in g.layers if lg.layers] == [2, 1, 20, 20]


def test_v4_at_one_million_tokens(m):
    """§2.6: HCA attends 128 + 8,192 entries at 1M (545 M MAC); the indexer scores 262,144 entries (2.1 G MAC)."""
    g = build_graph(m["deepseek-v4-flash"], "decode", 1, 1048576)
    assert g.layer("hca-moe").op("attention").shape["pairs"] == 8320
    assert macs(g, "hca-moe", "attention") == pytest.approx(545e6, rel=0.01)
    assert macs(g, "csa-moe", "lightning_indexer") == pytest.approx(2.1e9, rel=0.03)


def test_v4_pro_decode_macs_per_token(m):
    g = build_graph(m["deepseek-v4-pro"], "decode", 1, K128)
    for op, expected in (("q_b_proj", 100.7e6), ("o_a_proj", 67.1e6), ("o_b_proj", 117.4e6), ("attention", 151e6)):
        assert macs(g, "csa-moe", op) == pytest.approx(expected, rel=0.01), op
    moe = sum(macs(g, "csa-moe", op) for op in ("experts_gate_up", "experts_down", "shared_gate_up", "shared_down"))
    assert moe == pytest.approx(462e6, rel=0.003)


def test_v4_prefill_emits_compressed_entries(m):
    g = build_graph(m["deepseek-v4-flash"], "prefill", 2, 1000)
    assert g.layer("hca-moe").op("kv_compressor").shape["entries"] == 2 * (1000 // 128)
    assert g.layer("csa-moe").op("idx_compressor").shape["entries"] == 2 * 250
    assert g.layer("swa-hash-moe").op("attention").shape["pairs"] == 2 * (128 * 129 // 2 + (1000 - 128) * 128)


def test_mtp_layer_runs_once_per_draft_token(m):
    g = build_graph(m["deepseek-v4-flash"], "decode", 8, 8192, mtp_tokens=3)
    mtp = g.layer("mtp")
    assert mtp.repeat == 3 and mtp.op("attention").shape["ratio"] == 0  # V4's MTP block is SWA-only
    assert g.scenario["tokens"] == 32 and g.layer("lm_head").op("lm_head").shape["m"] == 32


@pytest.mark.parametrize("kwargs, field", [
    ({"phase": "decode", "batch": 1, "length": -5}, "--context"),
    ({"phase": "prefill", "batch": 0, "length": 10}, "--batch"),
    ({"phase": "decode", "batch": 1, "length": 10, "mtp_tokens": -1}, "--mtp"),
    ({"phase": "decode", "batch": 1, "length": 200000}, "--context"),
    ({"phase": "train", "batch": 1, "length": 10}, "--phase"),
])
def test_bad_scenarios_name_the_option(m, kwargs, field):
    with pytest.raises(NpusimError) as err:
        build_graph(m["deepseek-v3.2-exp"], **kwargs)
    assert err.value.field == field
