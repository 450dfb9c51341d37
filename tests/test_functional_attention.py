"""Attention kernels (SFA, dense flash attention, V4 shared-KV): traced execution against float64 references."""

import dataclasses

import numpy as np
import pytest

from npusim import functional as F
from npusim.functional import reference as R
from npusim.functional.executor import execute
from npusim.functional.numerics import rnd
from npusim.functional.verify import _selection
from npusim.kernels.attention import SparseFlashAttention
from npusim.kernels.trace import Loop, Program
from npusim.spec.chip import load_chip

RNG = np.random.default_rng(11)
TOL = 1e-2  # bf16 P and output: relative to max |reference|


def _close(out, ref, tol=TOL):
    return np.abs(out - ref).max() <= tol * np.abs(ref).max()


@pytest.mark.parametrize("t,s,h,k,block_m", [
    (3, 900, 128, 600, 256),  # Huawei block, ragged second key tile (600 = 512 + 88)
    (9, 9, 16, 16, 32),  # causal prefill: token t sees t + 1 < k keys, the rest -1
    (5, 1300, 16, 1100, 64),  # 3 key tiles, 5 tokens in blocks of 4 (ragged token tail)
])
def test_sparse_mla_attention_matches_reference(t, s, h, k, block_m):
    q, kv = RNG.standard_normal((t, h, 576)), RNG.standard_normal((s, 576))
    idx = _selection(RNG, t, s, k)
    out = F.sparse_mla_attention(q, kv, idx, 0.13523, block_m=block_m)
    assert _close(out, R.sparse_mla_attention(rnd(q, "bf16"), rnd(kv, "bf16"), idx, 0.13523))


def test_causal_ramp_units_compute_every_token():
    """Ramp blocks paired into units (1 + 2 key tiles of 256 here, the full block 3) each land on their own tokens."""
    t = s = 520
    q, kv = RNG.standard_normal((t, 8, 192)), RNG.standard_normal((s, 192))
    idx = np.where(np.arange(768)[None, :] <= np.arange(t)[:, None], np.arange(768)[None, :], -1)
    assert SparseFlashAttention(t, s, 8, 192, 128, 768, block_m=16, block_n=256).trace(load_chip("910b2")).tiling[
        "bands"] == 2  # one band of units, the full band
    out = F.sparse_mla_attention(q, kv, idx, 0.1, d_v=128, block_m=16, block_n=256)
    assert _close(out, R.sparse_mla_attention(rnd(q, "bf16"), rnd(kv, "bf16"), idx, 0.1, d_v=128))


def test_sparse_attention_causal_mask_drops_future_selections():
    """An index set that still names keys after the query (prefill rows with < k valid keys) is masked again."""
    t, s, h = 4, 4, 16
    q, kv = RNG.standard_normal((t, h, 576)), RNG.standard_normal((s, 576))
    idx = np.tile(np.arange(s), (t, 1))  # every row names all 4 keys
    out = F.sparse_mla_attention(q, kv, idx, 0.1, block_m=16)
    first = rnd(kv, "bf16")[0, :512]
    assert np.allclose(out[0], np.broadcast_to(first, (h, 512)), atol=1e-2)  # token 0 sees key 0 only
    assert _close(out, R.sparse_mla_attention(rnd(q, "bf16"), rnd(kv, "bf16"), idx, 0.1))


def _drop(body, op):
    return tuple(dataclasses.replace(n, body=_drop(n.body, op)) if isinstance(n, Loop)
                 else dataclasses.replace(n, action=None) if n.op == op else n for n in body)


def test_dropping_the_rescale_is_a_numerics_failure():
    t, s, h, k = 2, 1500, 16, 1500
    q, kv = RNG.standard_normal((t, h, 576)), RNG.standard_normal((s, 576))
    kv[1000:] *= 3  # later key tiles raise the running max, so the accumulator must be rescaled
    idx = np.tile(np.arange(k), (t, 1))
    kern = SparseFlashAttention(t, s, h, topk=k, block_m=16, scale=0.1, kv_splits=1)  # one range: tiles rescale
    tr = kern.trace(load_chip("910b2"))
    broken = dataclasses.replace(tr, groups=tuple(
        dataclasses.replace(g, aiv=tuple(Program("aiv", _drop(p.body, "rescale")) for p in g.aiv)) for g in tr.groups))
    tensors = {"q": rnd(q.reshape(t * h, 576), "bf16"), "kv": rnd(kv, "bf16"), "indices": idx,
               "out": np.zeros((t * h, 512))}
    ref = R.sparse_mla_attention(rnd(q, "bf16"), rnd(kv, "bf16"), idx, 0.1).reshape(t * h, 512)
    assert _close(execute(tr, tensors)["out"], ref)
    assert not _close(execute(broken, tensors)["out"], ref, 10 * TOL)


@pytest.mark.parametrize("t,s,h,kvh,d,dv", [(150, 300, 2, 2, 192, 128), (2, 600, 16, 1, 576, 512),
                                            (7, 7, 4, 4, 192, 128)])
def test_dense_attention_matches_reference(t, s, h, kvh, d, dv):
    q, k, v = RNG.standard_normal((t, h, d)), RNG.standard_normal((s, kvh, d)), RNG.standard_normal((s, kvh, dv))
    out = F.dense_attention(q, k, v, d ** -0.5, block_m=128 if kvh > 1 else 16)
    assert _close(out, R.dense_attention(*(rnd(x, "bf16") for x in (q, k, v)), d ** -0.5))


@pytest.mark.parametrize("ratio", [0, 128, 4])
def test_v4_attention_window_compressed_and_sink(ratio):
    t, s, h, d = 3, 700, 16, 512
    q, kv, sink = RNG.standard_normal((t, h, d)), RNG.standard_normal((s, d)), 2 * RNG.standard_normal(h)
    ckv = RNG.standard_normal((s // ratio, d)) if ratio else None
    cmp = None
    if ratio == 4:
        cmp = _selection(RNG, t, s // 4, 100)
        cmp = np.where(cmp < ((s - t + np.arange(t) + 1) // 4)[:, None], cmp, -1)
    out = F.v4_attention(q, kv, sink, d ** -0.5, 128, ratio, ckv, cmp, block_m=32)
    ref = R.v4_attention(rnd(q, "bf16"), rnd(kv, "bf16"), sink, d ** -0.5, 128, ratio,
                         rnd(ckv, "bf16") if ratio else None, cmp)
    assert _close(out, ref)
    no_sink = R.v4_attention(rnd(q, "bf16"), rnd(kv, "bf16"), np.full(h, -np.inf), d ** -0.5, 128, ratio,
                             rnd(ckv, "bf16") if ratio else None, cmp)
    assert not _close(out, no_sink)  # the sink matters


def test_v4_early_tokens_see_a_partial_window():
    """Positions below the window: only keys 0..p, the rest of the window slots are -1."""
    t, s, h, d = 5, 5, 16, 512
    q, kv, sink = RNG.standard_normal((t, h, d)), RNG.standard_normal((s, d)), RNG.standard_normal(h)
    out = F.v4_attention(q, kv, sink, 0.05, 128, block_m=16)
    assert _close(out, R.v4_attention(rnd(q, "bf16"), rnd(kv, "bf16"), sink, 0.05, 128))


@pytest.mark.parametrize("splits", [2, 3])
def test_split_kv_partials_and_combine_match_reference(splits):
    """Decode shape: each core takes a key range, the vector cores merge the partial (lse, out) after a barrier."""
    t, s, h, k = 2, 2000, 16, 1500
    q, kv = RNG.standard_normal((t, h, 576)), RNG.standard_normal((s, 576))
    kv[1200:] *= 3  # ranges have very different maxima: the merge weights matter
    idx = _selection(RNG, t, s, k)
    out = F.sparse_mla_attention(q, kv, idx, 0.1, block_m=16, kv_splits=splits, chip="910c-die")
    assert _close(out, R.sparse_mla_attention(rnd(q, "bf16"), rnd(kv, "bf16"), idx, 0.1))


def test_split_kv_with_sink_and_dense_keys():
    t, s, h, d = 2, 900, 16, 512
    q, kv, sink = RNG.standard_normal((t, h, d)), RNG.standard_normal((s, d)), 2 * RNG.standard_normal(h)
    ckv = RNG.standard_normal((s // 128, d))
    out = F.v4_attention(q, kv, sink, d ** -0.5, 128, 128, ckv, block_m=16, block_n=256, kv_splits=2,
                         chip="910c-die")
    assert _close(out, R.v4_attention(rnd(q, "bf16"), rnd(kv, "bf16"), sink, d ** -0.5, 128, 128, rnd(ckv, "bf16")))
    qq, kk, vv = RNG.standard_normal((2, 16, 576)), RNG.standard_normal((1300, 1, 576)), RNG.standard_normal((1300, 1, 512))
    out = F.dense_attention(qq, kk, vv, 0.05, block_m=16, kv_splits=3, chip="910c-die")
    assert _close(out, R.dense_attention(*(rnd(x, "bf16") for x in (qq, kk, vv)), 0.05))


def test_dropping_the_merge_weights_is_a_numerics_failure():
    t, s, h = 2, 1100, 16
    q, kv = RNG.standard_normal((t, h, 576)), RNG.standard_normal((s, 576))
    kv[600:] *= 3
    idx = np.tile(np.arange(s), (t, 1))
    tr = SparseFlashAttention(t, s, h, topk=s, block_m=16, scale=0.1, kv_splits=3).trace(load_chip("910c-die"))
    assert tr.tiling["kv_splits"] == 3
    broken = dataclasses.replace(tr, groups=tuple(
        dataclasses.replace(g, aiv=tuple(Program("aiv", _drop(p.body, "merge_weights")) for p in g.aiv))
        for g in tr.groups))
    tensors = {"q": rnd(q.reshape(t * h, 576), "bf16"), "kv": rnd(kv, "bf16"), "indices": idx,
               "out": np.zeros((t * h, 512))}
    ref = R.sparse_mla_attention(rnd(q, "bf16"), rnd(kv, "bf16"), idx, 0.1).reshape(t * h, 512)
    assert _close(execute(tr, tensors)["out"], ref)
    with pytest.raises(Exception):  # the weights are never written: the merge reads nothing
        execute(broken, tensors)


@pytest.mark.parametrize("causal", [0, 1])
def test_dense_attention_head_major_blocks_match_reference(causal):
    """BNSD: a block is block_m tokens of one head (rows clipped at the head's last token, not the next head's)."""
    t, s, h, kvh, d, dv = 40, 90, 6, 2, 64, 128
    q, k, v = RNG.standard_normal((t, h, d)), RNG.standard_normal((s, kvh, d)), RNG.standard_normal((s, kvh, dv))
    out = F.dense_attention(q, k, v, d ** -0.5, causal=bool(causal), layout="BNSD", block_m=16)
    assert _close(out, R.dense_attention(*(rnd(x, "bf16") for x in (q, k, v)), d ** -0.5, causal=bool(causal)))
