"""One trace, two executors: each kernel's traced execution against its float64 reference."""

import dataclasses

import numpy as np
import pytest

from npusim import functional as F
from npusim.errors import NpusimError
from npusim.functional import reference as R
from npusim.functional.executor import execute
from npusim.functional.numerics import rnd
from npusim.functional.verify import indexer_inputs, indexer_tolerance, topk_agrees
from npusim.kernels.gemm import Gemm
from npusim.kernels.trace import Loop, Program
from npusim.spec.chip import load_chip

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("m,n,k", [(64, 64, 64), (200, 300, 700), (17, 129, 33)])
@pytest.mark.parametrize("scheme,tol", [("bf16", 1e-2), ("fp16", 2e-3), ("int8", 3e-2)])
def test_gemm_matches_reference(m, n, k, scheme, tol):
    a, b = RNG.standard_normal((m, k)), RNG.standard_normal((k, n))
    ref = R.gemm(a, b)
    out = F.gemm(a, b, dtype=scheme, out_dtype="fp32")
    assert np.abs(out - ref).max() <= tol * np.abs(ref).max()


def test_gemm_small_tiles_and_batch():
    a, b = RNG.standard_normal((3, 50, 90)), RNG.standard_normal((3, 90, 40))
    out = F.gemm(a, b, out_dtype="fp32", base_m=16, base_n=16, base_k=32, step_k=1)
    assert np.allclose(out, R.gemm(a, b), atol=0.05 * np.abs(a @ b).max())


@pytest.mark.parametrize("k", [768, 1100])  # whole slices; a short last slice
def test_single_core_split_k_adds_slice_partials_into_the_workspace(k):
    """catlass 34's split-K (k_slice): each block's fp32 partial of one K slice added into C's workspace in GM (the
    first slice writes it), then cast by the AIVs after the SyncAll: the product, rounded once to fp16."""
    a, b = rnd(RNG.standard_normal((1, 100, k)), "fp16"), rnd(RNG.standard_normal((1, k, 96)), "fp16")
    kern = Gemm(100, 96, k, dtype="fp16", out_dtype="fp16", base_m=64, base_n=64, base_k=64, step_k=4, k_slice=256)
    t = kern.trace(load_chip("910b2"))
    assert any(i.op == "sync_all" for _, i, _ in t.instructions())
    out = execute(t, {"a": a, "b": b, "c": np.zeros((1, 100, 96))})["c"]
    assert np.allclose(out, rnd(a @ b, "fp16"), rtol=2e-3, atol=1e-2)
    with pytest.raises(NpusimError, match="k_slice"):
        dataclasses.replace(kern, k_slice=512).trace(load_chip("910b2"))


@pytest.mark.parametrize("t,s,h,k,causal,dtype,chip,tiles", [
    (8, 512, 64, 512, False, "bf16", "910b2", {}),
    (20, 700, 64, 64, True, "bf16", "910b2", {}),
    (9, 9, 64, 16, True, "bf16", "910b2", {}),
    (16, 1100, 32, 100, True, "bf16", "910b2", {}),
    (3, 2000, 64, 2048, True, "bf16", "910b2", {}),
    (1, 5000, 64, 300, False, "bf16", "910b2", {}),  # decode: SplitCore runs cut the keys, merged after SyncAll
    (4, 3000, 64, 200, True, "int8", "910b2", {}),  # MTP decode, INT8 Q8 K8 with the scales folded into W~
    (20, 700, 64, 64, True, "fp8", "950pr", {}),
    (100, 100, 64, 32, True, "bf16", "910b2", {"block_m": 128, "block_n": 32}),  # causal pairs (qb, nq-1-qb)
    (101, 230, 64, 48, True, "int8", "910b2", {"block_m": 128, "block_n": 64}),  # pairs, odd middle, prefix
])
def test_lightning_indexer_topk_equals_reference(t, s, h, k, causal, dtype, chip, tiles):
    """The Mat-Duce head reduction rounds ReLU scores and weights to fp16: selections equal the exact top-k but
    for near-ties within that rounding, and scores agree within it."""
    q, kk, w = RNG.standard_normal((t, h, 128)), RNG.standard_normal((s, 128)), RNG.standard_normal((t, h))
    sc, idx = F.lightning_indexer(q, kk, w, k, causal=causal, dtype=dtype, chip=chip, **tiles)
    qd, kd = indexer_inputs(q, kk, dtype)
    ref = R.indexer_scores(qd, kd, w, causal)
    tol = indexer_tolerance(qd, kd, w)
    assert topk_agrees(idx, ref, k, tol)
    rs, ri = R.topk(ref, k)
    assert ((idx < 0) == (ri < 0)).all()  # positions below top-k: same number of visible keys
    fin = np.isfinite(rs)
    assert (np.abs(sc[fin] - rs[fin]) <= np.broadcast_to(tol[:, None], rs.shape)[fin]).all()


def test_indexer_paired_units_cover_the_triangle():
    """The paired causal trace is really paired at the test shape above (else it tests nothing new), and the
    SplitCore runs of (20, 700) cut its query blocks over cores, merged after the SyncAll."""
    from npusim.kernels.indexer import LightningIndexer

    chip = load_chip("910b2")
    assert LightningIndexer(100, 100, 64, 128, 32, block_m=128, block_n=32).plan(chip).paired
    li = LightningIndexer(20, 700, 64, 128, 64)
    assert any(not x.whole for run in li.split_core(li.plan(chip), chip.aic.count) for x in run)


def test_broken_flag_protocol_is_caught_as_deadlock():
    chip = load_chip("910b2")
    tr = Gemm(64, 64, 64).trace(chip)
    g = tr.groups[0]
    broken = dataclasses.replace(tr, groups=(dataclasses.replace(g, flags={**g.flags, "l0c.free": 0}),))
    with pytest.raises(NpusimError, match="deadlock"):
        execute(broken, {"a": np.zeros((1, 64, 64)), "b": np.zeros((1, 64, 64)), "c": np.zeros((1, 64, 64))})


def _without(body, op):
    """The body with the functional action of every `op` instruction removed (flags and costs kept)."""
    out = []
    for n in body:
        if isinstance(n, Loop):
            out.append(dataclasses.replace(n, body=_without(n.body, op)))
        else:
            out.append(dataclasses.replace(n, action=None) if n.op == op else n)
    return tuple(out)


def test_broken_tiling_is_a_numerics_failure():
    """A tiling bug is caught by executing it: a GEMM that never resets L0C reads an unwritten accumulator."""
    tr = Gemm(768, 32, 64, base_m=16).trace(load_chip("910b2"))
    assert max(n.count for g in tr.groups for n in g.aic.body) == 2
    bad = dataclasses.replace(tr, groups=tuple(dataclasses.replace(g, aic=Program("aic", _without(g.aic.body, "init")))
                                               for g in tr.groups))
    a, b = rnd(RNG.standard_normal((1, 768, 64)), "bf16"), rnd(RNG.standard_normal((1, 64, 32)), "bf16")
    t = {"a": a, "b": b, "c": np.zeros((1, 768, 32))}
    assert np.allclose(execute(tr, t)["c"], a @ b, rtol=1e-2, atol=0.1)
    with pytest.raises(NpusimError, match="reads 'l0c' before anything wrote it"):
        execute(bad, t)


@pytest.mark.parametrize("rows,dim", [(5, 64), (100, 512), (301, 7168)])
def test_norms_match_reference_within_bf16(rows, dim):
    x, w, b = RNG.standard_normal((rows, dim)), RNG.standard_normal(dim), RNG.standard_normal(dim)
    xq = rnd(x, "bf16")
    for out, ref in ((F.rmsnorm(x, w), R.rmsnorm(xq, w)), (F.layernorm(x, w, b), R.layernorm(xq, w, b))):
        assert np.abs(out - ref).max() <= 2 ** -7 * np.abs(ref).max()


@pytest.mark.parametrize("counts", [[0, 37, 200, 5, 130], [64, 64]])
def test_grouped_gemm_rows_use_their_expert(counts):
    a, b = RNG.standard_normal((sum(counts), 200)), RNG.standard_normal((len(counts), 200, 96))
    ref = np.einsum("rk,rkn->rn", a, b[np.repeat(np.arange(len(counts)), counts)])
    for scheme, tol in (("bf16", 1e-2), ("int8", 3e-2)):
        assert np.abs(F.grouped_gemm(a, b, counts, scheme, "fp32") - ref).max() <= tol * np.abs(ref).max()


@pytest.mark.parametrize("m,n,k", [(96, 160, 300), (17, 129, 33)])
def test_fp8_block_scales_stay_aligned_with_l0_steps(m, n, k):
    """base_k must not straddle two 128-element scale blocks (it used to pick 192 and mis-scale half a step). The
    ue8m0 activation scales of 'fp8' are up to twice amax / 448 (one bit of the codes less than 'fp8amax')."""
    a, b = RNG.standard_normal((m, k)), RNG.standard_normal((k, n))
    ref = R.gemm(a, b)
    for scheme, tol in (("fp8amax", 6e-2), ("fp8", 1e-1)):
        assert np.abs(F.gemm(a, b, scheme, "fp32", chip="950pr") - ref).max() <= tol * np.abs(ref).max()
