"""The ops around attention and the experts executed by their traces against float64 references."""

import dataclasses

import numpy as np
import pytest

from npusim import functional as F
from npusim.functional import reference as R
from npusim.functional import verify
from npusim.functional.executor import execute
from npusim.functional.numerics import rnd
from npusim.kernels.projection import MhcPre
from npusim.kernels.trace import Loop, Program
from npusim.kernels.vector import DequantSwigluQuant
from npusim.spec.chip import load_chip

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("name", ["mhc_pre", "mhc_post", "moe_gate", "compressor", "rope", "swiglu", "dequant_swiglu_quant",
                                  "copy", "moe_combine",
                                  "moe_permute", "embedding", "cache_update"])
def test_traced_execution_matches_float64(name):
    for e in verify.VERIFY[name]({}, RNG):
        assert e.exact in (None, True) and e.passed, e  # within its result format's tolerance (bf16: 2^-7)


@pytest.mark.parametrize("t,h,d", [(7, 4, 64), (1, 5, 64), (100, 3, 32)])
def test_cann_rope_cut_gives_the_same_arrays(t, h, d):
    """A copy per head (strided rows, tail steps clipped) computes exactly what the fused cut does."""
    rng = np.random.default_rng(t)  # its own draws: the module's RNG feeds the tests below
    x, pos = rng.standard_normal((t, h, d)), rng.integers(0, 100000, t)
    for il in (True, False):
        assert np.array_equal(F.rope(x, pos, interleaved=il, head_loop=1), F.rope(x, pos, interleaved=il))


def test_scalar_conversion_gives_the_arrays_of_a_vector_cast():
    """fp8 / fp4 on dav-c220 converts on the scalar pipe; the arrays equal the 950's vector path bit for bit."""
    x = 3 * np.random.default_rng(3).standard_normal((37, 512))
    for dtype in ("fp8", "mxfp4"):
        for a, b in zip(F.quantise(x, dtype, chip="910b2"), F.quantise(x, dtype, chip="950pr")):
            assert np.array_equal(a, b)


def test_quantisation_round_trip_is_the_formats_own_error():
    errs = {e.scheme: e.max_rel for e in verify.verify_quantise({}, RNG)}
    assert errs["int8"] < 0.01 and errs["fp8"] < 0.05 and errs["mxfp8"] < 0.05 and errs["mxfp4"] < 0.2


@pytest.mark.parametrize("tiles,chip", [({}, "910b2"), ({"block_rows": 16, "k_split": 1}, "910b2"),
                                        ({"block_rows": 16, "k_split": 3}, "910b2"),
                                        ({"block_rows": 16, "k_split": 1}, "950pr")])
def test_mhc_pre_streaming_and_split_k_forms(tiles, chip):
    """The A2/A3 form (every block, SyncAll, epilogue; K split or not) and the 950's streaming blocks."""
    t, n, d = 37, 4, 256
    x, fn = RNG.standard_normal((t, n, d)), 0.05 * RNG.standard_normal((24, n * d))
    scale, base = np.array([0.8, 1.1, 0.9]), 0.3 * RNG.standard_normal(24)
    kern = MhcPre(t, n, d, 24, 20, **tiles)
    tensors = {"x": rnd(x.reshape(t, n * d), "bf16"), "w": fn.T, "hc": np.concatenate([scale, base])[None],
               "y": np.zeros((t, d)), "post": np.zeros((t, n)), "res": np.zeros((t, n * n))}
    out = execute(kern.trace(load_chip(chip)), tensors)
    y, post, res = R.mhc_pre(rnd(x, "bf16"), fn, scale, base)
    assert np.abs(out["y"] - y).max() < 1e-2 * np.abs(y).max()
    assert np.allclose(out["post"], post, atol=1e-6) and np.allclose(out["res"].reshape(t, n, n), res, atol=1e-6)


def test_sinkhorn_is_doubly_stochastic_and_dropping_its_loop_is_caught():
    a = F.sinkhorn(RNG.standard_normal((5, 4, 4)))  # 20 iterations: near doubly stochastic, columns exact
    assert np.allclose(a.sum(-1), 1, atol=1e-2) and np.allclose(a.sum(-2), 1, atol=1e-5)
    t, n, d = 4, 4, 128
    x, fn = RNG.standard_normal((t, n, d)), 0.3 * RNG.standard_normal((24, n * d))
    scale, base = np.array([1.0, 1.0, 3.0]), RNG.standard_normal(24)
    tr = MhcPre(t, n, d).trace(load_chip("910b2"))

    def drop(body):
        return tuple(n_ for n_ in (dataclasses.replace(b, body=drop(b.body)) if isinstance(b, Loop) else b
                                   for b in body) if not (isinstance(n_, Loop) and n_.count == 19))

    broken = dataclasses.replace(tr, groups=tuple(dataclasses.replace(
        g, aiv=tuple(Program("aiv", drop(p.body)) for p in g.aiv)) for g in tr.groups))
    tensors = {"x": rnd(x.reshape(t, n * d), "bf16"), "w": fn.T, "hc": np.concatenate([scale, base])[None],
               "y": np.zeros((t, d)), "post": np.zeros((t, n)), "res": np.zeros((t, n * n))}
    ref = R.mhc_pre(rnd(x, "bf16"), fn, scale, base)[2]
    assert np.allclose(execute(tr, dict(tensors))["res"].reshape(t, n, n), ref, atol=1e-6)
    assert not np.allclose(execute(broken, dict(tensors))["res"].reshape(t, n, n), ref, atol=1e-3)


def test_moe_gate_group_limit_and_hash_routing():
    t, k, e = 6, 128, 64
    x, w, bias = RNG.standard_normal((t, k)), 0.2 * RNG.standard_normal((k, e)), np.zeros(e)
    _, idx = F.moe_gate(x, w, bias, 8, groups=8, limit=2)
    assert all(len(set(row // 8)) <= 2 for row in idx)  # experts from at most 2 of the 8 groups
    table = RNG.integers(0, e, (t, 6))
    wts, hidx = F.moe_gate(x, w, bias, 6, score="sqrtsoftplus", hash_idx=table)
    assert (hidx == table).all() and np.allclose(wts.sum(1), 1.0)


def test_moe_gate_ranks_groups_by_top2_with_a_bias_and_by_max_without():
    """DeepSeek's Gate: the sum of a group's two best biased scores when the gate has a bias, its best score when it
    has none. On random tokens the two rules pick different groups for some tokens, and each matches the float64
    re-derivation (indices exactly, weights to fp32)."""
    rng = np.random.default_rng(11)
    t, k, e = 40, 256, 64
    x, w = rng.standard_normal((t, k)), 0.2 * rng.standard_normal((k, e))
    _, top2 = F.moe_gate(x, w, np.zeros(e), 4, groups=8, limit=2)
    wmax, vmax = F.moe_gate(x, w, None, 4, groups=8, limit=2)
    assert (top2 != vmax).any(axis=1).sum() > 0  # the rules differ on these tokens
    rw, ri = R.moe_gate(rnd(x, "bf16"), rnd(w, "bf16"), None, 4, 8, 2)
    assert np.array_equal(vmax, ri) and np.allclose(wmax, rw, rtol=1e-6)


def test_moe_gate_fp32_gemm_keeps_fp32_operands():
    """dtype fp32 (linear(x.float(), weight.float())): matches the fp32 re-derivation to 1e-6, which the bf16 GEMM
    does not; the trace moves fp32 x and weights at the cube's fp32 rate."""
    rng = np.random.default_rng(12)
    x, w, bias = rng.standard_normal((9, 512)), 0.1 * rng.standard_normal((512, 64)), 0.1 * rng.standard_normal(64)
    ref_w, ref_i = R.moe_gate(rnd(x, "fp32"), rnd(w, "fp32"), bias, 8, 8)
    w32, i32 = F.moe_gate(x, w, bias, 8, 8, dtype="fp32")
    w16, _ = F.moe_gate(x, w, bias, 8, 8)
    assert np.array_equal(i32, ref_i) and np.abs(w32 - ref_w).max() < 1e-6 < np.abs(w16 - ref_w).max()
    from npusim.kernels.projection import MoeGate
    chip = load_chip("910b2")
    bf, fp = MoeGate(9, 512, 64, 8, 0, 8).trace(chip), MoeGate(9, 512, 64, 8, 0, 8, dtype="fp32").trace(chip)
    assert fp.hbm_bytes > bf.hbm_bytes


def test_dequant_swiglu_quant_cuts_a_row_wider_than_ub_and_quantises_it_as_a_whole():
    """A row that does not fit UB (the dense MLP's 18432 columns) goes in two passes over column chunks through the
    workspace: the int8 rows and scales equal the whole-row kernel's (a UB four times the size), and one scale per
    row is the amax of the whole row."""
    rng = np.random.default_rng(11)
    rows, w = 5, 6000
    x, xs = rng.integers(-40000, 40000, (rows, 2 * w)), rng.random(rows) * 5e-4
    chip = load_chip("910b2")
    big = dataclasses.replace(chip, aiv=dataclasses.replace(chip.aiv, buffers=dataclasses.replace(
        chip.aiv.buffers, ub=4 * chip.aiv.buffers.ub)))
    assert DequantSwigluQuant(rows, w).trace(chip).tiling["chunks"] == 2
    assert "chunks" not in DequantSwigluQuant(rows, w).trace(big).tiling
    cut, whole = F.dequant_swiglu_quant(x, xs, chip=chip), F.dequant_swiglu_quant(x, xs, chip=big)
    assert np.array_equal(cut[0], whole[0]) and np.array_equal(cut[1], whole[1])
    ref = R.swiglu(x * rnd(xs, "fp32")[:, None])
    np.testing.assert_allclose(cut[1], np.abs(ref).max(axis=1) / 127, rtol=1e-6)


def test_add_rmsnorm_writes_the_sum_and_normalises_it():
    """AddRmsNorm (npu_add_rms_norm): the sum of x and the residual comes back exactly as bf16 rounds it, and y is the
    RMSNorm of that sum within bf16."""
    for e in verify.VERIFY["rowwise"]({"rows": 50, "dim": 7168}, RNG):
        assert e.exact in (None, True) and e.passed, e
