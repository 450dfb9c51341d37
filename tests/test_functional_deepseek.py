"""npusim.functional held against DeepSeek's reference inference code (V3.2-Exp inference/model.py + kernel.py after
the 2025-11-17 indexer fix, V4-Flash inference/): each check re-derives the reference's semantics from its formulas
(float64, or bit for bit in fp32 / fp8 where the reference is exact) on random inputs."""

import ml_dtypes
import numpy as np
import pytest

from npusim import functional as F
from npusim.functional.numerics import rnd
from npusim.functional.rotary import DEEPSEEK_V32 as V32_HF  # models.md §1.1 values

F8 = ml_dtypes.float8_e4m3fn


def act_quant_ue8m0(x: np.ndarray, block: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """kernel.py act_quant(x, block, scale_fmt="ue8m0") in fp32 bits: amax = max(max|x|, 1e-4) per 1 x block;
    s = 2^ceil(log2(amax * fp32(1/448))) from the fp32 exponent and mantissa bits (fast_round_scale);
    y = fp8_e4m3(clamp(x / s, -448, 448))."""
    x32 = x.astype(np.float32).reshape(x.shape[0], -1, block)
    amax = np.maximum(np.abs(x32).max(-1), np.float32(1e-4))
    prod = (amax * np.float32(1.0 / 448.0)).astype(np.float32)
    bits = prod.view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int64) - 127 + ((bits & 0x7FFFFF) != 0)
    s = ((exp + 127).astype(np.uint32) << 23).view(np.float32)
    y = np.clip(x32 / s[..., None], np.float32(-448), np.float32(448)).astype(F8)
    return y.reshape(x.shape).astype(np.float64), s.astype(np.float64)


def test_fp8_activation_quantisation_is_deepseeks_ue8m0_bit_for_bit():
    """F.quantise(x, 'fp8') (the Quantise trace) gives the reference's codes and power-of-two scales exactly,
    including an all-zero block (the 1e-4 floor); the plain amax / 448 scheme keeps its own name and equals the
    reference on only a fraction of the codes."""
    rng = np.random.default_rng(0)
    x = rnd(rng.standard_normal((33, 512)) * rng.uniform(1e-3, 30, (33, 1)), "bf16")
    x[3, 128:256] = 0.0
    q, s = F.quantise(x, "fp8")
    rq, rs = act_quant_ue8m0(x)
    assert np.array_equal(s, rs) and np.array_equal(q, rq)
    assert s[3, 1] == 2.0 ** -22  # 1e-4 / 448 = 2.2e-7 rounds up to 2^-22
    qa, sa = F.quantise(x, "fp8amax")
    assert (qa == rq).mean() < 0.5 and not np.array_equal(sa, rs)


def test_fp8_gemm_quantises_activations_as_act_quant_and_weights_in_fp32_blocks():
    """gemm dtype fp8 = DeepSeek's fp8 linear: activations 1x128 ue8m0 (act_quant), weights 128x128 blocks with an
    fp32 amax scale; the product equals the float64 product of the dequantised operands to fp32 accumulation."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((40, 384)), rng.standard_normal((384, 256))
    qa, sa = act_quant_ue8m0(rnd(a, "bf16"))
    bt = b.reshape(3, 128, 2, 128)
    sb = (np.abs(bt).max((1, 3)) / 448.0).astype(np.float32).astype(np.float64)  # fp32 scale per 128 x 128
    qb = (bt / sb[:, None, :, None]).astype(F8).astype(np.float64)
    ref = (qa * np.repeat(sa, 128, 1)) @ (qb * sb[:, None, :, None]).reshape(384, 256)
    got = F.gemm(rnd(a, "bf16"), b, dtype="fp8", out_dtype="fp32", chip="950pr")
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    amax = F.gemm(rnd(a, "bf16"), b, dtype="fp8amax", out_dtype="fp32", chip="950pr")
    assert np.abs(amax - ref).max() > 10 * np.abs(got - ref).max()


def test_fp8_lightning_indexer_quantises_q_and_k_as_act_quant():
    """F.lightning_indexer(dtype='fp8') scores equal the float64 indexer on the ue8m0-quantised q and k (per
    (token, head) and per key, 128 dims each) within the fp16 head reduction, and pick the same keys."""
    from npusim.functional import reference as R
    from npusim.functional.verify import indexer_tolerance, topk_agrees

    rng = np.random.default_rng(2)
    t, s, h, d, k = 6, 300, 8, 128, 32
    q, kk, w = rng.standard_normal((t, h, d)), rng.standard_normal((s, d)), rng.standard_normal((t, h))
    qq, qs = act_quant_ue8m0(rnd(q, "bf16").reshape(t * h, d))
    kq, ks = act_quant_ue8m0(rnd(kk, "bf16"))
    qd, kd = (qq * qs).reshape(t, h, d), kq * ks
    _, idx = F.lightning_indexer(q, kk, w, k, dtype="fp8", chip="950pr")
    ref = R.indexer_scores(qd, kd, w)
    assert topk_agrees(idx, ref, k, indexer_tolerance(qd, kd, w))




def yarn_freqs(dim: int, theta: float, factor: float, orig: int, beta_fast: float, beta_slow: float) -> np.ndarray:
    """precompute_freqs_cis in float64 from its formulas."""
    base = theta ** (-np.arange(0, dim, 2) / dim)
    corr = [dim * np.log(orig / (2 * np.pi * r)) / (2 * np.log(theta)) for r in (beta_fast, beta_slow)]
    low, high = max(int(np.floor(corr[0])), 0), min(int(np.ceil(corr[1])), dim - 1)
    keep = 1 - np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    return base / factor * (1 - keep) + base * keep


def test_rope_yarn_frequencies_from_the_model_config():
    """Rotary.from_config(HF config) gives precompute_freqs_cis's frequencies (V3.2: theta 1e4, factor 40 over 4096;
    V4 compressed layers: compress_rope_theta 160000, factor 16 over 65536); below the original context no YaRN."""
    from npusim.functional.rotary import Rotary

    v32 = Rotary.from_config(V32_HF)
    assert np.allclose(v32.freqs(64), yarn_freqs(64, 1e4, 40, 4096, 32, 1), rtol=2e-6, atol=0)
    v4 = Rotary.from_config({"compress_rope_theta": 160000, "max_position_embeddings": 1048576,
                             "rope_scaling": {"factor": 16, "original_max_position_embeddings": 65536,
                                              "beta_fast": 32, "beta_slow": 1}}, "compress_rope_theta")
    assert np.allclose(v4.freqs(64), yarn_freqs(64, 160000, 16, 65536, 32, 1), rtol=2e-6, atol=0)
    short = Rotary.from_config(V32_HF | {"max_position_embeddings": 4096})
    assert np.allclose(short.freqs(64), 1e4 ** (-np.arange(0, 64, 2) / 64), rtol=2e-6)
    assert not np.allclose(v32.freqs(64), short.freqs(64), rtol=1e-3)


def test_rope_layouts_and_tables_as_each_module_applies_them():
    """MLA / V4 / Compressor: interleaved pairs (2i, 2i+1); the V3.2 indexer after the fix: halves (i, i + 32) of
    its first 64 dims. Both at the model's YaRN angles, and with a given cos / sin table, within bf16 rounding of the
    float64 rotation written out pair by pair."""
    from npusim.functional.rotary import Rotary

    rng = np.random.default_rng(3)
    x, pos = rnd(rng.standard_normal((5, 3, 64)), "bf16"), rng.integers(0, 4096, 5)
    ang = pos[:, None] * yarn_freqs(64, 1e4, 40, 4096, 32, 1)[None]
    c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
    a, b = x[..., 0::2], x[..., 1::2]
    inter = np.stack([a * c - b * s, a * s + b * c], -1).reshape(x.shape)
    h, g = x[..., :32], x[..., 32:]
    half = np.concatenate([h * c - g * s, h * s + g * c], -1)
    tol = 2.0 ** -8 * np.abs(x).max()
    v32 = Rotary.from_config(V32_HF)
    assert np.abs(F.rope(x, pos, rotary=v32) - inter).max() <= tol
    assert np.abs(F.rope(x, pos, rotary=v32, interleaved=False) - half).max() <= tol
    assert np.abs(F.rope(x, pos, cos=np.cos(ang), sin=np.sin(ang)) - inter).max() <= tol
    assert np.abs(F.rope(x, pos) - inter).max() > 10 * tol  # theta alone is not the model's table


def test_absorbed_mla_softmax_scale_from_the_model_config():
    """MLA.__init__: 192^-0.5 * mscale^2, mscale = 0.1 ln(40) + 1 under YaRN (models.md §1.1: ~0.13523), not the
    576-dim query's 576^-0.5; without YaRN (context within 4096) plain 192^-0.5."""
    from npusim.functional.rotary import mla_softmax_scale

    assert mla_softmax_scale(V32_HF) == pytest.approx(192 ** -0.5 * (0.1 * np.log(40) + 1) ** 2, rel=1e-12)
    assert mla_softmax_scale(V32_HF) == pytest.approx(0.13523, abs=1e-5)
    assert mla_softmax_scale(V32_HF | {"max_position_embeddings": 4096}) == pytest.approx(192 ** -0.5)


def masked_attention(q, kv, keep, scale, d_v, sink=None):
    """MLA.forward's sparse path in float64: scores over every key, -inf outside the scatter mask `keep` [T, S],
    softmax (a per-head sink joins the denominator only, V4's sparse_attn), times V = kv[:, :d_v]."""
    x = np.einsum("thd,sd->ths", q, kv) * scale
    x = np.where(keep[:, None], x, -np.inf)
    m = x.max(-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink[None, :, None])
    p = np.exp(x - m)
    den = p.sum(-1, keepdims=True) + (np.exp(sink[None, :, None] - m) if sink is not None else 0)
    return np.einsum("ths,sd->thd", p / den, kv[:, :d_v])


def test_sparse_mla_index_rows_mean_a_set_with_minus_one_padding():
    """DeepSeek's index_mask = full(-inf).scatter_(indices, 0): a row is a set of keys, -1 pads (here spread through
    the row). The traced SFA equals the masked float64 softmax; a repeated key or one past the cache is refused with
    a sentence naming it."""
    from npusim.errors import NpusimError
    from npusim.functional.rotary import mla_softmax_scale

    rng = np.random.default_rng(4)
    t, s, h, k = 3, 200, 16, 64
    q, kv = rnd(rng.standard_normal((t, h, 576)), "bf16"), rnd(rng.standard_normal((s, 576)), "bf16")
    idx = np.stack([rng.permutation(s - t + i + 1)[:k] for i in range(t)])
    idx[:, ::5] = -1
    keep = np.zeros((t, s), bool)
    for i, row in enumerate(idx):
        keep[i, row[row >= 0]] = True
    scale = mla_softmax_scale(V32_HF)
    got = F.sparse_mla_attention(q, kv, idx, scale)
    ref = masked_attention(q, kv, keep, scale, 512)
    assert np.abs(got - ref).max() <= 2.0 ** -8 * np.abs(ref).max()
    dup = idx.copy()
    dup[0, 1] = dup[0, 2] = 7
    with pytest.raises(NpusimError, match="selects key 7 twice"):
        F.sparse_mla_attention(q, kv, dup, scale)
    with pytest.raises(NpusimError, match="outside the 200 rows"):
        F.sparse_mla_attention(q, kv, np.where(idx == idx.max(), s, idx), scale)


def window_idxs(window: int, seqlen: int, start_pos: int) -> np.ndarray:
    """get_window_topk_idxs: prefill, token p sees positions max(0, p - window + 1) .. p (min(seqlen, window)
    columns, -1 past p); decode, the ring slots of the last `window` positions, oldest first (-1 pads early)."""
    if start_pos == 0:
        w = min(seqlen, window)
        cols = np.maximum(np.arange(seqlen)[:, None] - window + 1, 0) + np.arange(w)[None]
        return np.where(cols > np.arange(seqlen)[:, None], -1, cols)
    if start_pos >= window - 1:
        s = start_pos % window
        return np.concatenate([np.arange(s + 1, window), np.arange(s + 1)])[None]
    return np.concatenate([np.arange(start_pos + 1), -np.ones(window - start_pos - 1, int)])[None]


def compressed_idxs(ratio: int, seqlen: int, start_pos: int, offset: int) -> np.ndarray:
    """get_compress_topk_idxs (HCA): every completed entry, + offset; prefill -1 for those not yet complete."""
    if start_pos:
        return (np.arange((start_pos + 1) // ratio) + offset)[None]
    m = np.arange(seqlen // ratio)[None].repeat(seqlen, 0)
    return np.where(m >= (np.arange(1, seqlen + 1) // ratio)[:, None], -1, m + offset)


@pytest.mark.parametrize("start_pos,seqlen,ratio", [(0, 200, 0), (0, 300, 128), (0, 90, 4), (700, 1, 128),
                                                    (700, 1, 4), (50, 1, 0)])
def test_v4_sparse_attn_with_the_reference_index_lists_and_sink(start_pos, seqlen, ratio):
    """Attention.forward's sparse_attn: kv = raw rows (prefill) or the window ring buffer (decode), then the
    compressed entries; topk_idxs = window columns ++ compressed columns (+ offset), -1 padded; a per-head sink in
    the denominator. F.v4_sparse_attn equals the float64 gather-softmax over those lists within bf16 rounding."""
    rng = np.random.default_rng(start_pos + seqlen + ratio)
    win, h, d = 128, 16, 512
    keys = start_pos + seqlen
    raw = rnd(rng.standard_normal((keys, d)), "bf16")
    ent = rnd(rng.standard_normal((keys // ratio if ratio else 0, d)), "bf16")
    if start_pos:
        ring = np.zeros((win, d))
        ring[np.arange(max(0, keys - win), keys) % win] = raw[max(0, keys - win):]
        kv, offset = np.concatenate([ring, ent]), win
    else:
        kv, offset = np.concatenate([raw, ent]), seqlen
    idx = window_idxs(win, seqlen, start_pos)
    if ratio == 128:
        idx = np.concatenate([idx, compressed_idxs(ratio, seqlen, start_pos, offset)], 1)
    elif ratio == 4:  # an indexer's top-k over the completed entries, -1 padded
        done = (start_pos + np.arange(seqlen) + 1) // 4
        k = 16
        top = np.stack([np.concatenate([rng.permutation(n)[:k], -np.ones(max(0, k - n), int)]) for n in done])
        idx = np.concatenate([idx, np.where(top >= 0, top + offset, -1)], 1)
    q, sink = rnd(rng.standard_normal((seqlen, h, d)), "bf16"), rng.standard_normal(h)
    keep = np.zeros((seqlen, kv.shape[0]), bool)
    for t, row in enumerate(idx):
        keep[t, row[row >= 0]] = True
    ref = masked_attention(q, kv, keep, d ** -0.5, d, sink)
    got = F.v4_sparse_attn(q, kv, sink, idx, d ** -0.5, start_pos, win, ratio)
    assert np.abs(got - ref).max() <= 2.0 ** -8 * np.abs(ref).max()


def test_v4_sparse_attn_refuses_lists_the_kernel_does_not_read():
    """A window column that is not one of the token's last `window` positions, or an HCA list missing an entry,
    is refused with a sentence (the kernel reads windows contiguously and HCA's entries all)."""
    from npusim.errors import NpusimError

    rng = np.random.default_rng(5)
    q, kv, sink = rng.standard_normal((4, 16, 512)), rng.standard_normal((4 + 0, 512)), rng.standard_normal(16)
    idx = window_idxs(128, 4, 0)
    bad = idx.copy()
    bad[3, 0] = -1  # token 3 drops position 0 from its window
    with pytest.raises(NpusimError, match="window columns"):
        F.v4_sparse_attn(q, kv, sink, bad, 0.04)
    q2, kv2 = rng.standard_normal((256, 16, 512)), rng.standard_normal((258, 512))
    hca = np.concatenate([window_idxs(128, 256, 0), compressed_idxs(128, 256, 0, 256)], 1)
    hca[-1, -1] = -1
    with pytest.raises(NpusimError, match="completed entries"):
        F.v4_sparse_attn(q2, kv2, sink, hca, 0.04, 0, 128, 128)


def test_hadamard_is_the_graphs_gemm_against_sylvester():
    """rotate_activation = hadamard_transform(x, scale=d^-0.5): H[i, j] = (-1)^popcount(i & j) / sqrt(d), bf16 out.
    F.hadamard runs the graph's idx_hadamard kernel (a bf16 GEMM rows x d x d) and is within bf16 rounding of the
    float64 transform; it is orthonormal (applied twice it returns x to bf16 rounding)."""
    from npusim.graph.ops import gemm as graph_gemm
    from npusim.parallel.optime import KERNEL_OF
    from npusim.spec.quant import BF16

    rng = np.random.default_rng(6)
    x = rnd(rng.standard_normal((40, 128)), "bf16")
    i = np.arange(128)
    h = (-1.0) ** np.vectorize(lambda v: bin(v).count("1"))(i[:, None] & i[None]) / np.sqrt(128)
    got = F.hadamard(x)
    assert np.abs(got - x @ h).max() <= 2.0 ** -8 * np.abs(x @ h).max()
    assert np.abs(F.hadamard(got) - x).max() <= 2.0 ** -7 * np.abs(x).max()
    op = graph_gemm("idx_hadamard", 40, 128, 128, BF16, BF16, kind="hadamard")  # as the graph builder makes it
    assert KERNEL_OF[op.kind] == "gemm" and (op.shape["m"], op.shape["n"], op.shape["k"]) == (40, 128, 128)


def test_fp32_gemm_scheme_as_the_references_fp32_linears():
    """weights_proj(x.float()) and the Gate's linear(x.float(), w.float()): dtype fp32 keeps fp32 operands and
    fp32 accumulation (1e-6 of the float64 product), which bf16 does not."""
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((33, 700)), rng.standard_normal((700, 64))
    ref = rnd(a, "fp32") @ rnd(b, "fp32")
    got, bf = F.gemm(a, b, "fp32", "fp32"), F.gemm(a, b, "bf16", "fp32")
    assert np.abs(got - ref).max() <= 1e-6 * np.abs(ref).max() < np.abs(bf - ref).max()


def sinkhorn64(z: np.ndarray, iters: int, eps: float) -> np.ndarray:
    """hc_split_sinkhorn's comb in float64: softmax over the last axis + eps, / (column sums + eps), then iters - 1
    times / (row sums + eps), / (column sums + eps)."""
    e = np.exp(z - z.max(-1, keepdims=True))
    a = e / e.sum(-1, keepdims=True) + eps
    a = a / (a.sum(-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        a = a / (a.sum(-1, keepdims=True) + eps)
        a = a / (a.sum(-2, keepdims=True) + eps)
    return a


def test_sinkhorn_runs_its_trace_and_honours_eps():
    """F.sinkhorn executes the Sinkhorn kernel's trace (the vector steps of HcPre) and equals the float64
    re-derivation to fp32, for the default and a large eps (and not the float64 result of fewer iterations)."""
    z = np.random.default_rng(9).standard_normal((9, 4, 4)) * 3
    for iters, eps in ((20, 1e-6), (6, 0.05)):
        got = F.sinkhorn(z, iters, eps)
        assert np.abs(got - sinkhorn64(rnd(z, "fp32"), iters, eps)).max() < 1e-6
        assert np.abs(got - sinkhorn64(rnd(z, "fp32"), iters - 1, eps)).max() > 1e-5


def test_mhc_pre_honours_hc_eps_and_norm_eps():
    """hc_pre: rsqrt(mean(x^2) + norm_eps) on the mixes, hc_split_sinkhorn with hc_eps: F.mhc_pre with eps 0.01
    equals the float64 re-derivation with that eps (and differs from eps 1e-6 beyond the fp32 error)."""
    from npusim.functional import reference as R

    rng = np.random.default_rng(10)
    t, n, d = 5, 4, 256
    x, fn = rnd(rng.standard_normal((t, n, d)), "bf16"), rnd(0.05 * rng.standard_normal((24, n * d)), "fp32")
    scale, base = rng.uniform(0.5, 1.5, 3), 0.3 * rng.standard_normal(24)
    v = x.reshape(t, n * d)
    m = v @ fn.T / np.sqrt((v * v).mean(-1, keepdims=True) + 1e-6)
    sig = 1 / (1 + np.exp(-(m[:, :n] * scale[0] + base[:n])))
    for eps in (1e-6, 0.01):
        y, post, res = F.mhc_pre(x, fn, scale, base, 20, eps)
        ref_res = sinkhorn64((m[:, 2 * n:] * scale[2] + base[2 * n:]).reshape(t, n, n), 20, eps)
        ref_y = np.einsum("tj,tjd->td", sig + eps, x)
        assert np.abs(res - ref_res).max() < 1e-5
        assert np.abs(y - ref_y).max() <= 2.0 ** -8 * np.abs(ref_y).max()
    assert np.abs(F.mhc_pre(x, fn, scale, base, 20, 0.01)[2] - F.mhc_pre(x, fn, scale, base)[2]).max() > 1e-3
    assert np.allclose(F.mhc_pre(x, fn, scale, base, norm_eps=10.0)[1], R.mhc_pre(x, fn, scale, base, norm_eps=10.0)[1],
                       atol=1e-6)


def test_kernel_verify_reports_shape_tolerance_error_and_verdict(monkeypatch, capsys):
    """`npusim kernel verify NAME` prints per check the shape that ran (given keys and defaults), the tolerance of
    its result format, the measured errors, the index outputs' exactness and PASS / FAIL; exit 1 when one fails."""
    import json

    from npusim.cli.main import main
    from npusim.functional import verify

    main(["kernel", "verify", "moe_gate", "--shape", "m=5", "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert [r["result"] for r in rows] == ["PASS"] * 3 and all(r["exact"] is True for r in rows)
    assert rows[0]["shape"].startswith("m=5,k=512,n=64") and rows[0]["tolerance"] == pytest.approx(2.0 ** -7, rel=1e-3)
    assert rows[1]["tolerance"] == pytest.approx(2.0 ** -20, rel=1e-3) and rows[0]["max_rel"] < rows[0]["tolerance"]
    monkeypatch.setitem(verify.TOLERANCE, "bf16", 1e-12)
    with pytest.raises(SystemExit) as stop:
        main(["kernel", "verify", "rope"])
    assert stop.value.code == 1 and "FAIL" in capsys.readouterr().out


def compressor64(x, w, ape, norm, ratio, cos, sin, qdq: bool) -> np.ndarray:
    """Compressor.forward (start_pos 0) in float64: [C | Z] = x w; entry i pools softmax(Z + ape) * C over its block
    (ratio 4: the previous block's a-half ++ this block's b-half, block -1 C = 0, Z = -inf); RMSNorm (eps 1e-6)
    times norm; interleaved RoPE of the last dims at the block's first position; qdq: act_quant(kv[..., :-rd], 64,
    ue8m0) quantised and dequantised (on the bf16 entry)."""
    cz = x @ w
    T, half = cz.shape[0], cz.shape[1] // 2
    ov = ratio == 4
    d = half // (2 if ov else 1)
    C, Z = cz[:, :half], cz[:, half:] + np.tile(ape, (T // ratio + 1, 1))[:T]
    out = []
    for i in range(T // ratio):
        b = slice(i * ratio, (i + 1) * ratio)
        if ov:
            pc = C[b.start - ratio:b.start, :d] if i else np.zeros((ratio, d))
            pz = Z[b.start - ratio:b.start, :d] if i else np.full((ratio, d), -np.inf)
            c, z = np.concatenate([pc, C[b, d:]]), np.concatenate([pz, Z[b, d:]])
        else:
            c, z = C[b], Z[b]
        p = np.exp(z - z.max(0))
        out.append((p / p.sum(0) * c).sum(0))
    y = np.array(out)
    y = y / np.sqrt((y * y).mean(-1, keepdims=True) + 1e-6) * norm
    r = 2 * cos.shape[1]
    a, bb = y[:, -r:][:, 0::2].copy(), y[:, -r:][:, 1::2].copy()
    y[:, -r:][:, 0::2], y[:, -r:][:, 1::2] = a * cos - bb * sin, a * sin + bb * cos
    if qdq:
        yb = rnd(y, "bf16")
        q, s = act_quant_ue8m0(yb[:, :-r], 64)
        y = yb.copy()
        y[:, :-r] = rnd(q * np.repeat(s, 64, 1), "bf16")
    return y


def _compressor_inputs(rng, m, ratio, k=256, d=128):
    ov = 2 if ratio == 4 else 1
    x, w = rnd(rng.standard_normal((m, k)), "bf16"), rnd(0.1 * rng.standard_normal((k, 2 * ov * d)), "bf16")
    ape, norm = rnd(0.1 * rng.standard_normal((ratio, ov * d)), "fp32"), rnd(1 + 0.1 * rng.standard_normal(d), "fp32")
    ang = rng.uniform(0, 3, (m // ratio, 32))
    return x, w, ape, norm, np.cos(ang), np.sin(ang)


@pytest.mark.parametrize("ratio,m", [(4, 40), (128, 256)])
def test_compressor_fp8_simulation_of_the_nope_dims(ratio, m):
    """V4's main KV compressor: act_quant(kv[..., :-64], 64, ue8m0, inplace) after norm and RoPE. F.compressor with
    quant='fp8' leaves the RoPE dims as the unquantised entry's, puts the other dims on ue8m0 fp8 codes (block 64)
    bit for bit of that entry, and stays within bf16 + one fp8 step of the float64 re-derivation."""
    x, w, ape, norm, cos, sin = _compressor_inputs(np.random.default_rng(ratio), m, ratio)
    plain = F.compressor(x, w, ape, norm, ratio, cos, sin)
    got = F.compressor(x, w, ape, norm, ratio, cos, sin, quant="fp8")
    assert np.array_equal(got[:, -64:], plain[:, -64:])
    q, s = act_quant_ue8m0(plain[:, :-64], 64)
    assert np.array_equal(got[:, :-64], rnd(q * np.repeat(s, 64, 1), "bf16"))
    ref0 = compressor64(x, w, ape, norm, ratio, cos, sin, False)
    assert np.abs(plain - ref0).max() <= 2.0 ** -7 * np.abs(ref0).max()
    ref = compressor64(x, w, ape, norm, ratio, cos, sin, True)
    assert np.abs(got - ref).max() <= 2.0 ** -3 * np.abs(ref).max()


@pytest.mark.parametrize("ratio,prefill,total", [(4, 0, 24), (4, 10, 24), (128, 100, 256)])
def test_compressor_decode_carries_the_pooling_state(ratio, prefill, total):
    """Compressor.forward token by token (start_pos > 0) after a prefill of `prefill` tokens: the carried
    kv_state / score_state give the entries the whole-sequence prefill gives (within bf16), at the blocks' ends."""
    x, w, ape, norm, cos, sin = _compressor_inputs(np.random.default_rng(ratio + prefill), total, ratio)
    full = F.compressor(x, w, ape, norm, ratio, cos, sin)
    st = F.compressor_state(x[:prefill], w, ape, ratio)
    got = list(F.compressor(x[:prefill], w, ape, norm, ratio, cos[:prefill // ratio], sin[:prefill // ratio])
               if prefill else [])
    for pos in range(prefill, total):
        e = (pos + 1) // ratio - 1
        entry, st = F.compressor_decode(x[pos], pos, st, w, ape, norm, cos[e:e + 1], sin[e:e + 1])
        assert (entry is not None) == ((pos + 1) % ratio == 0)
        if entry is not None:
            got.append(entry)
    assert np.abs(np.array(got) - full).max() <= 2.0 ** -7 * np.abs(full).max()
    ref = compressor64(x, w, ape, norm, ratio, cos, sin, False)
    assert np.abs(np.array(got) - ref).max() <= 2.0 ** -7 * np.abs(ref).max()


def test_v32_indexer_module_through_the_functional_ops():
    """Indexer.forward of V3.2-Exp after the fix, composed of npusim.functional ops (bf16 linears, LayerNorm,
    non-interleaved YaRN RoPE on the first 64 dims, the Hadamard GEMM, fp32 weights_proj, fp8 lightning indexer)
    against its float64 re-derivation with the reference's bf16 roundings and ue8m0 act_quant: the same top-k sets
    except near-ties within the fp16 head reduction."""
    from npusim.functional import reference as R
    from npusim.functional.rotary import Rotary
    from npusim.functional.verify import indexer_tolerance, topk_agrees

    rng = np.random.default_rng(13)
    t, dim, ql, h, d, topk = 24, 256, 192, 16, 128, 32
    x, qr = rnd(rng.standard_normal((t, dim)), "bf16"), rnd(rng.standard_normal((t, ql)), "bf16")
    wq = rnd(rng.standard_normal((ql, h * d)) / np.sqrt(ql), "bf16")
    wk = rnd(rng.standard_normal((dim, d)) / 16, "bf16")
    wp, g, b = rng.standard_normal((dim, h)) / 16, 1 + 0.1 * rng.standard_normal(d), 0.1 * rng.standard_normal(d)
    pos, rot = np.arange(t), Rotary.from_config(V32_HF)
    hd = np.array([[(-1.0) ** bin(i & j).count("1") for j in range(d)] for i in range(d)]) / np.sqrt(d)

    # npusim.functional
    q = F.gemm(qr, wq).reshape(t, h, d)
    q[..., :64] = F.rope(q[..., :64], pos, rotary=rot, interleaved=False)
    k = F.layernorm(F.gemm(x, wk), g, b)
    k[:, :64] = F.rope(k[:, None, :64], pos, rotary=rot, interleaved=False)[:, 0]
    q, k = F.hadamard(q.reshape(t * h, d)).reshape(t, h, d), F.hadamard(k)
    wts = F.gemm(x, wp, "fp32", "fp32") * h ** -0.5 * d ** -0.5
    _, idx = F.lightning_indexer(q, k, wts, topk, dtype="fp8", chip="950pr")

    # float64 re-derivation, rounding where the reference stores bf16
    f = yarn_freqs(64, 1e4, 40, 4096, 32, 1)
    c, s = np.cos(pos[:, None] * f[None]), np.sin(pos[:, None] * f[None])

    def half_rope(v):  # v [t, heads, 64]
        a, bb = v[..., :32], v[..., 32:]
        return rnd(np.concatenate([a * c[:, None] - bb * s[:, None], a * s[:, None] + bb * c[:, None]], -1), "bf16")

    rq = rnd(qr @ wq, "bf16").reshape(t, h, d)
    rq[..., :64] = half_rope(rq[..., :64])
    rk = rnd(R.layernorm(rnd(x @ wk, "bf16"), g, b), "bf16")
    rk[:, :64] = half_rope(rk[:, None, :64])[:, 0]
    rq, rk = rnd(rq @ hd, "bf16"), rnd(rk @ hd, "bf16")
    q8, qs = act_quant_ue8m0(rq.reshape(t * h, d))
    k8, ks = act_quant_ue8m0(rk)
    qd, kd = (q8 * qs).reshape(t, h, d), k8 * ks
    rw = rnd(x, "fp32") @ rnd(wp, "fp32") * h ** -0.5 * d ** -0.5
    ref = R.indexer_scores(qd, kd, rw)
    assert topk_agrees(idx, ref, topk, indexer_tolerance(qd, kd, rw))
    same = [set(a[a >= 0]) == set(bb[bb >= 0]) for a, bb in zip(idx, R.topk(ref, topk)[1])]
    assert np.mean(same) >= 0.9  # most rows identical outright; the rest differ only at near-ties
