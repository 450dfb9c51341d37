"""Tilings of the ops around attention and the experts: mHC pre/post, MoE gate, Compressor, RoPE, quantisation,
SwiGLU, MoE combine, embedding — built from op-graph shape dicts, fitting the chip, never beating the roofline."""

import pytest

from npusim.engine import simulate
from npusim.errors import NpusimError
from npusim.kernels import catalog
from npusim.spec.chip import load_chip

OP_SHAPES = [  # the op graph's shape keys (npusim/graph/builder.py), prefill and decode sizes
    ("compressor", {"m": 4096, "k": 4096, "n": 2048, "ratio": 4, "overlap": 2, "entries": 1024}),
    ("compressor", {"m": 8, "k": 4096, "n": 1024, "ratio": 128, "overlap": 1, "entries": 1}),
    ("mhc_pre", {"tokens": 4096, "streams": 4, "hidden": 4096, "mix": 24, "sinkhorn_iters": 20}),
    ("mhc_pre", {"tokens": 8, "streams": 4, "hidden": 7168, "mix": 4, "sinkhorn_iters": 0}),
    ("mhc_post", {"tokens": 8, "streams": 4, "hidden": 4096}),
    ("moe_gate", {"m": 4096, "k": 7168, "n": 256, "topk": 8, "hash": 0, "groups": 8}),
    ("moe_gate", {"m": 16, "k": 4096, "n": 256, "topk": 6, "hash": 1, "groups": 1}),
    ("rope", {"tokens": 4096, "heads": 129, "dim": 64}),
    ("rope", {"tokens": 4096, "heads": 64, "dim": 128, "layout": "half", "head_loop": 1}),
    ("rope", {"tokens": 1, "heads": 32, "dim": 128, "head_loop": 1}),
    ("quantise", {"rows": 4096, "elements": 576}),
    ("dequantise", {"rows": 8, "elements": 7168, "dtype": "mxfp4"}),
    ("swiglu", {"rows": 4096, "width": 2048, "clamp": 10}),
    ("moe_combine", {"tokens": 16, "topk": 8, "hidden": 7168}),
    ("embedding", {"tokens": 4096, "hidden": 4096, "streams": 4}),
    ("cache_update", {"rows": 8, "elements": 576}),
]


@pytest.mark.parametrize("chip_name", ["910c-die", "950pr"])
@pytest.mark.parametrize("name,shape", OP_SHAPES)
def test_op_graph_shapes_build_fit_and_respect_the_roofline(chip_name, name, shape):
    chip = load_chip(chip_name)
    t = catalog.kernel(name, shape).trace(chip)
    r = simulate(t, chip, launch="none")
    assert r.time >= r.roofline > 0


@pytest.fixture(scope="module")
def chip():
    return load_chip("910c-die")


def test_mhc_pre_decode_splits_k_prefill_streams_blocks(chip):
    """Decode splits K; prefill does not. On the A3 the kernel's one template runs every GEMM block, a SyncAll, then
    the epilogue (hc_pre.cpp tiling key 0) at any size; the 950's prefill streams blocks, epilogue beside GEMM."""
    decode = catalog.kernel("mhc_pre", {"tokens": 16}).trace(chip)
    prefill = catalog.kernel("mhc_pre", {"tokens": 4096}).trace(chip)
    c310 = load_chip("950pr")
    streamed = catalog.kernel("mhc_pre", {"tokens": 4096}).trace(c310)
    assert decode.tiling["k_split"] > 1 and decode.cores["aic"] == chip.aic.count
    assert prefill.tiling["k_split"] == 1 == streamed.tiling["k_split"]
    assert any(i.op == "sync_all" for _, i, _ in decode.instructions())
    assert any(i.op == "sync_all" for _, i, _ in prefill.instructions())
    assert not any(i.op == "sync_all" for _, i, _ in streamed.instructions())


def test_mhc_pre_second_stage_walks_rows_in_barrier_chains(chip):
    """The A3 HcPre's second stage (hc_pre_m_k_split_core.h): one row per step at d = 4096 (UB), ~360 dependent
    vector instructions per row with 22 K partials, the Sinkhorn's 19 iterations of 11 each; its time grows with the
    rows per vector core and with the chain cost, and the 950 (a register-based kernel) does not count them."""
    pre = catalog.kernel("mhc_pre", {"tokens": 128})
    assert pre.row_factor(chip, 22) == 1 and pre.mix_chain(1, 22) == 4 * 22 + 43 + 16
    free = load_chip("910c-die", {"aiv.pipes.vector.issue_cycles": 0})
    t = {n: simulate(catalog.kernel("mhc_pre", {"tokens": n}).trace(chip), chip, launch="device").time
         for n in (16, 128)}
    assert t[128] - t[16] > 15e-6  # 3 rows per vector core against 1: ~10 us a row (A3 HcPre 32.8 -> 60 us)
    slack = simulate(pre.trace(free), free, launch="device").time
    assert t[128] > slack + 15e-6
    c310 = load_chip("950pr")
    assert all(i.issues == 1 for _, i, _ in pre.trace(c310).instructions() if i.pipe == "vector")


def test_rmsnorm_reduces_each_row_in_a_barrier_chain():
    """CANN's RMSNorm on dav-c220: per row x^2, the halving Adds to one repeat (1536: a tail Add and 4), WholeReduceSum,
    the scalar's read, scale, gamma, cast; one cast of the block in front."""
    rms = catalog.kernel("rowwise", {"rows": 515, "dim": 1536, "block_rows": 1})
    assert rms.chain(1) == 12 and rms.chain(4) == 1 + 4 * 11
    assert catalog.kernel("rowwise", {"rows": 8, "dim": 4096, "dtype": "fp32"}).chain(1) == 6 + 6
    assert catalog.kernel("rowwise", {"rows": 8, "dim": 1536, "op": "layernorm"}).chain(1) == 1


def test_int8_dynamic_quant_quantises_row_by_row(chip):
    """CANN's DynamicQuant: 9 barrier'd steps per row (5 to the scale, 4 to apply it), so its vector time grows with
    the rows per core at the chain cost; block formats keep one instruction over the tile."""
    q = catalog.kernel("quantise", {"rows": 1030, "elements": 2304})
    mx = catalog.kernel("quantise", {"rows": 8, "elements": 7168, "dtype": "mxfp8"})
    assert q.chains() == (5, 4) and mx.chains() == (0, 0)
    free = load_chip("910c-die", {"aiv.pipes.vector.issue_cycles": 0})
    with_chain = simulate(q.trace(chip), chip, launch="device").time
    assert with_chain > simulate(q.trace(free), free, launch="device").time + 4e-6  # ~21 rows x 8 x 32 ns


def test_compressor_uses_the_a3_base_blocks_and_splits_d_at_decode(chip):
    csa = catalog.kernel("compressor", {"m": 4096, "k": 4096, "n": 2048, "ratio": 4, "overlap": 2}).trace(chip)
    hca = catalog.kernel("compressor", {"m": 4096, "k": 4096, "n": 1024, "ratio": 128, "overlap": 1}).trace(chip)
    assert (csa.tiling["block_rows"], csa.tiling["base_n"]) == (128, 256)  # models.md §3.6
    assert (hca.tiling["block_rows"], hca.tiling["base_n"]) == (256, 128)
    dec = catalog.kernel("compressor", {"m": 8, "k": 4096, "n": 2048, "ratio": 4, "overlap": 2}).trace(chip)
    assert dec.tiling["n_split"] > 1


def test_vector_tiles_split_the_wide_axis_when_tokens_are_few(chip):
    t = catalog.kernel("mhc_post", {"tokens": 8}).trace(chip)
    assert t.tiling["tile_tokens"] == 1 and t.tiling["tiles"] >= chip.aiv.count
    assert t.tiling["tile_cols"] * 2 % 512 == 0  # 512 B aligned column tiles (HcPost tiling)


def test_cann_rope_pays_a_copy_per_head_not_per_byte(chip):
    """aclnnRotaryPositionEmbedding's cut: with cos broadcast over heads each head's rows are their own DMA, so the
    time follows the heads and stays flat over tokens (one line per core) and head size (kernels.md K188-K192)."""
    def t(**shape):
        return simulate(catalog.kernel("rope", {"layout": "half", "head_loop": 1, **shape}).trace(chip), chip,
                        launch="device").time
    flat = [t(tokens=n, heads=64, dim=128) for n in (4, 32)] + [t(tokens=4, heads=64, dim=512)]
    assert max(flat) / min(flat) < 1.05
    assert t(tokens=4, heads=64, dim=128) > 1.8 * t(tokens=4, heads=32, dim=128) - t(tokens=1, heads=1, dim=128)
    fused = simulate(catalog.kernel("rope", {"tokens": 4, "heads": 64, "dim": 128}).trace(chip), chip,
                     launch="device").time
    assert flat[0] > 2 * fused  # the fused cut moves a token's heads in one copy


def test_fp8_quantise_converts_on_the_scalar_pipe_where_the_vector_unit_cannot():
    """dav-c220 has no vector cast to fp8 / fp4 (kernels.md K196: 97.6 % scalar): the conversion runs element by
    element on the scalar pipe, between the vector step and the store; the 950 converts on its vector unit."""
    def run(chip_name, dtype):
        c = load_chip(chip_name)
        t = catalog.kernel("quantise", {"rows": 512, "elements": 128, "dtype": dtype, "block": 128}).trace(c)
        return t, simulate(t, c, launch="device")
    t, fp8 = run("910b2", "fp8")
    assert fp8.bound == "scalar" and any(i.op == "convert_q" for _, i, _ in t.instructions())
    assert fp8.time > 5 * run("910b2", "int8")[1].time
    t950, r950 = run("950pr", "fp8")
    assert not any(i.pipe == "scalar" and i.op.startswith("convert") for _, i, _ in t950.instructions())
    assert r950.bound != "scalar"


def test_bad_shapes_are_plain_errors(chip):
    with pytest.raises(NpusimError, match="mix"):
        catalog.kernel("mhc_pre", {"tokens": 4, "mix": 7}).trace(chip)
    with pytest.raises(NpusimError, match="layout"):
        catalog.kernel("rope", {"tokens": 4, "layout": "diagonal"}).trace(chip)
    with pytest.raises(NpusimError, match="head_loop"):
        catalog.kernel("rope", {"tokens": 4, "head_loop": 2}).trace(chip)
    with pytest.raises(NpusimError, match="quantisation"):
        catalog.kernel("quantise", {"rows": 4, "elements": 64, "dtype": "int3"}).trace(chip)
    with pytest.raises(NpusimError, match="groups"):
        catalog.kernel("moe_gate", {"m": 4, "k": 64, "n": 30, "groups": 8}).trace(chip)
