"""The W8A8 MIX quant matmul (catlass 12 / 52) and the GEMM mechanisms of issue 14: one core's HBM read rate, the
MIX start-up, the DMA row-stride limit."""

import numpy as np
import pytest

import npusim.kernels.gemm as G
from npusim import functional as F
from npusim.engine import simulate
from npusim.engine.result import is_mix
from npusim.errors import NpusimError
from npusim.functional import reference as R
from npusim.functional.numerics import quantize
from npusim.kernels import catalog
from npusim.spec.chip import load_chip

CHIP = load_chip("910b3")
CATLASS = dict(base_m=128, base_n=256, base_k=128, step_k=4, l0c_depth=1)  # 12_quant_matmul's L1/L0 tiles
SMALL = dict(base_m=32, base_n=64, base_k=64, step_k=2, epilogue_rows=16)
RNG = np.random.default_rng(11)


@pytest.mark.parametrize("m,n,k", [(96, 160, 1200), (130, 300, 2100), (20, 64, 5000)])
def test_streaming_and_split_k_match_the_reference_and_each_other(m, n, k):
    a, b = RNG.standard_normal((m, k)), RNG.standard_normal((k, n))
    ref = R.gemm(a, b)
    one, split = (F.quant_matmul(a, b, "fp32", **SMALL, k_split=ks) for ks in (1, -1))
    assert np.abs(one - ref).max() <= 3e-2 * np.abs(ref).max()  # per-token x per-channel int8 error
    assert np.array_equal(one, split)  # int32 partial sums add exactly


def test_blocks_wider_than_an_epilogue_tile_split_into_column_tiles():
    a, b = RNG.standard_normal((40, 600)), RNG.standard_normal((600, 700))
    kern = catalog.kernel("quant_matmul", dict(m=40, n=700, k=600, base_m=32, base_n=320, k_split=1))
    assert kern.trace(CHIP).tiling["epilogue_tile"] == (32, 256)
    out = F.quant_matmul(a, b, "fp32", base_m=32, base_n=320)
    assert np.abs(out - R.gemm(a, b)).max() <= 3e-2 * np.abs(R.gemm(a, b)).max()


def test_split_k_takes_catlass_factor():
    """GetSplitkFactor: AIC count // output blocks, at most the L1 K tiles."""
    one_block = catalog.kernel("quant_matmul", dict(m=128, n=256, k=16384, k_split=-1, **CATLASS)).trace(CHIP)
    assert one_block.tiling["k_split"] == 20
    few_tiles = catalog.kernel("quant_matmul", dict(m=128, n=256, k=2048, k_split=-1, **CATLASS)).trace(CHIP)
    assert few_tiles.tiling["k_split"] == 4


def test_quant_matmul_is_a_mix_kernel_and_pays_its_start():
    kern = catalog.kernel("quant_matmul", dict(m=128, n=256, k=1024, **CATLASS))
    trace, gemm = kern.trace(CHIP), catalog.kernel("gemm", dict(m=128, n=256, k=1024, dtype="int8")).trace(CHIP)
    assert is_mix(trace) and not is_mix(gemm)
    o = CHIP.overheads
    assert simulate(trace, CHIP, launch="device").launch == pytest.approx(o.task_dispatch + o.core_start + o.mix_start)
    assert simulate(gemm, CHIP, launch="device").launch == pytest.approx(o.task_dispatch + o.core_start)


def test_one_block_streams_k_at_one_cores_hbm_rate():
    """K110-K112: one 128 x 256 block on one AIC reads 384 bytes per unit of K from HBM; the time grows with K at
    the per-core HBM rate, not at the L2 rate (the shape the fit rests on)."""
    def t(k):
        return simulate(catalog.kernel("quant_matmul", dict(m=128, n=256, k=k, **CATLASS)).trace(CHIP), CHIP,
                        launch="none").time
    slope = (t(16384) - t(8192)) / 8192
    rate = CHIP.aic.pipes["mte2"].routes["hbm>l1"] * CHIP.clock
    assert slope == pytest.approx(384 / rate, rel=0.05)
    fast = load_chip("910b3", {"aic.pipes.mte2.routes.hbm>l1": "110"})
    assert simulate(catalog.kernel("quant_matmul", dict(m=128, n=256, k=16384, **CATLASS)).trace(fast), fast,
                    launch="none").time < t(16384) * 0.75


def test_workspace_slots_follow_the_option():
    for slots in (2, 3):
        trace = catalog.kernel("quant_matmul", dict(m=512, n=512, k=512, workspace=slots, **SMALL)).trace(CHIP)
        assert trace.groups[0].flags["ws.free0"] == slots


def test_bad_split_is_one_sentence():
    with pytest.raises(NpusimError, match="k_split"):
        catalog.kernel("quant_matmul", dict(m=128, n=256, k=1024, k_split=0)).trace(CHIP)


def _loads(trace):
    return [ins for _, ins, mult in trace.instructions() for _ in range(int(mult)) if ins.pipe == "mte2"
            and ins.op.startswith("load")]


def test_rows_past_the_stride_limit_are_copied_one_by_one():
    """BasicMatmul at K = 80000 (K104/basic): A's rows are 80000 elements apart, past the ND->NZ DMA's 16-bit
    stride, so every L1 tile of A is base_m one-row DMAs; B [k, n] with n = 4096 stays one DMA per tile."""
    shape = dict(m=128, n=256, k=G.STRIDE_LIMIT + 256, dtype="fp16", base_m=128, base_n=256, base_k=64, step_k=4,
                 l0c_depth=1)
    kn = catalog.kernel("gemm", dict(shape, layout_b="kn")).trace(CHIP)
    tiles = -(-shape["k"] // 256)
    assert sum(ins.op == "load_row" for ins in _loads(kn)) == 128 * tiles
    assert sum(ins.op == "load" for ins in _loads(kn)) == tiles
    nk = catalog.kernel("gemm", dict(shape, layout_b="nk")).trace(CHIP)  # B [n, k]: its rows too
    assert sum(ins.op == "load_row" for ins in _loads(nk)) == (128 + 256) * tiles
    nz = catalog.kernel("gemm", dict(shape, layout_a="nz", layout_b="nz")).trace(CHIP)
    assert not any(ins.op == "load_row" for ins in _loads(nz))
    assert simulate(kn, CHIP, launch="none").time > 3 * simulate(nz, CHIP, launch="none").time


def test_row_by_row_copies_compute_the_same(monkeypatch):
    monkeypatch.setattr(G, "STRIDE_LIMIT", 64)
    a, b = RNG.standard_normal((50, 300)), RNG.standard_normal((300, 90))
    whole = F.gemm(a, b, dtype="fp16", out_dtype="fp32", layout_a="nz", layout_b="nz", base_m=16, base_n=32)
    for layout in ("nk", "kn"):
        assert np.array_equal(F.gemm(a, b, dtype="fp16", out_dtype="fp32", layout_b=layout, base_m=16, base_n=32),
                              whole)


def test_bad_layout_is_one_sentence():
    with pytest.raises(NpusimError, match="layout_b 'km'"):
        catalog.kernel("gemm", dict(m=64, n=64, k=64, layout_b="km")).trace(CHIP)


def test_explicit_block_larger_than_the_dim_runs_at_its_size():
    """catlass computes a 20-row A with its 128-row tile as a 32-row block (the actual block shape)."""
    t = catalog.kernel("gemm", dict(m=20, n=512, k=512, dtype="fp16", base_m=128, base_n=256)).tiling(CHIP)
    assert (t.base_m, t.base_n) == (32, 256)


def test_int32_out_gemm_is_the_exact_integer_product_without_the_epilogue():
    """W8A8's gate-up before npu_dequant_swiglu_quant: the cube's GEMM writes the int32 accumulators of the int8
    operands (no scales, no AIV epilogue), and scaling them by the operands' scales gives the MIX kernel's
    dequantised product."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((40, 300)), rng.standard_normal((300, 96))
    (qa, sa), (qb, sb) = quantize(a, "int8", 1), quantize(b, "int8", 0)
    raw = F.gemm(a, b, dtype="int8", out_dtype="int32")
    assert np.array_equal(raw, qa @ qb)
    np.testing.assert_allclose(raw * sa * sb, F.quant_matmul(a, b, "fp32"), rtol=1e-6)
    chip = load_chip("910c-die")
    assert not is_mix(catalog.kernel("gemm", {"m": 64, "n": 64, "k": 64}, dtype="int8", out_dtype="int32")
                      .trace(chip))
