"""Traced execution vs float64 reference for each kernel and dtype scheme: max abs / rel error on random inputs,
against the tolerance of the result's format (TOLERANCE), index outputs exact; `npusim kernel verify` prints them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from npusim import functional as F
from npusim.functional import reference as R
from npusim.functional.numerics import INDEX_QUANT, quantize, rnd
from npusim.functional.rotary import DEEPSEEK_V32, mla_softmax_scale


# Tolerance of a check by the format of its result (max abs error / max |reference|): about one unit in the last
# place of the format's mantissa (bf16 8 bits -> 2^-7, as a sum of products rounds once more), the quantised formats
# one step of their element (fp8 e4m3 2^-3, fp4 e2m1 2^-1, int8 2^-5), fp32 results 2^-20.
TOLERANCE = {"fp32": 2.0 ** -20, "fp16": 2.0 ** -9, "bf16": 2.0 ** -7, "int8": 2.0 ** -5, "fp8": 2.0 ** -3,
             "fp8amax": 2.0 ** -3, "mxfp8": 2.0 ** -3, "mxfp4": 2.0 ** -1}


def tolerance_of(scheme: str) -> float:
    """The tolerance of the first format named in a check's scheme label ('sigmoid top2 bf16' -> bf16)."""
    fmt = next((w for w in scheme.split() if w in TOLERANCE), None)
    if fmt is None:
        raise ValueError(f"check '{scheme}' names no result format of {', '.join(TOLERANCE)}")
    return TOLERANCE[fmt]


@dataclass(frozen=True)
class Error:
    scheme: str
    max_abs: float
    max_rel: float  # max abs error / max |reference|
    exact: bool | None = None  # index outputs (top-k sets, routed experts, scales): equal; None where there are none
    tolerance: float = 0.0

    @property
    def passed(self) -> bool:
        return self.max_rel <= self.tolerance and self.exact is not False


def _err(scheme: str, out: np.ndarray, ref: np.ndarray, exact: bool | None = None,
         tolerance: float | None = None) -> Error:
    ok = np.isfinite(ref)
    diff = float(np.abs(out[ok] - ref[ok]).max()) if ok.any() else 0.0
    return Error(scheme, diff, diff / max(float(np.abs(ref[ok]).max()) if ok.any() else 1.0, 1e-30), exact,
                 tolerance_of(scheme) if tolerance is None else tolerance)


class Used(dict):
    """A shape dict that records every key a check reads with the value it used (its default when not given), so
    the report shows the shape that ran."""

    def __init__(self, given: dict):
        super().__init__(given)
        self.used: dict = {}

    def get(self, key, default=None):
        val = super().get(key, default)
        self.used[key] = val
        return val


def verify_gemm(shape: dict, rng: np.random.Generator, schemes=("bf16", "fp16", "int8")) -> list[Error]:
    m, n, k = shape.get("m", 96), shape.get("n", 160), shape.get("k", 300)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    ref = R.gemm(a, b)
    return [_err(s, F.gemm(a, b, dtype=s, out_dtype="fp32"), ref) for s in schemes]


def verify_quant_matmul(shape: dict, rng: np.random.Generator) -> list[Error]:
    """The W8A8 MIX kernel, streaming (one block per AIC, the dequant on the AIVs) and split-K (catlass 52's
    factor, partials summed on the AIVs), against the float64 product of the unquantised operands."""
    m, n, k = shape.get("m", 96), shape.get("n", 160), shape.get("k", 1200)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    ref = R.gemm(a, b)
    tiles = {"base_m": 32, "base_n": 64, "base_k": 64, "step_k": 2, "epilogue_rows": 16}
    return [_err(f"int8 k_split {ks}", F.quant_matmul(a, b, "fp32", **tiles, k_split=ks), ref) for ks in (1, -1)]


def verify_grouped_gemm(shape: dict, rng: np.random.Generator) -> list[Error]:
    e, k, n = shape.get("experts", 4), shape.get("k", 300), shape.get("n", 160)
    counts = rng.integers(0, 2 * shape.get("rows", 240) // e, e)
    counts[0] = 0  # an expert no token chose
    a, b = rng.standard_normal((int(counts.sum()), k)), rng.standard_normal((e, k, n))
    ref = np.einsum("rk,rkn->rn", a, b[np.repeat(np.arange(e), counts)])
    return [_err(s, F.grouped_gemm(a, b, counts, dtype=s, out_dtype="fp32"), ref) for s in ("bf16", "fp16", "int8")]


def indexer_inputs(q: np.ndarray, k: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """q and k as the indexer kernel sees them: rounded to bf16, or int8 / fp8 quantised (per (token, head) and
    per key) and dequantised, the inputs the float64 reference is given."""
    if dtype not in ("int8", "fp8"):
        return rnd(q, dtype), rnd(k, dtype)
    elem, fmt = INDEX_QUANT[dtype]
    (q8, sq), (k8, sk) = quantize(rnd(q, "bf16"), elem, 2, 0, fmt), quantize(rnd(k, "bf16"), elem, 1, 0, fmt)
    return q8 * sq, k8 * sk


def indexer_tolerance(q: np.ndarray, k: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per token, how far two keys' kernel scores may move relative to each other: the head reduction runs on fp16
    ReLU scores and fp16 weights (2^-11 relative each), so a score moves by at most 2^-10 sum_h |w| ReLU(q.k), two
    by twice that (models.md §3.4)."""
    mag = np.einsum("th,ths->ts", np.abs(w), np.maximum(np.einsum("thd,sd->ths", q, k), 0.0))
    return 2.0 ** -9 * mag.max(1)


def topk_agrees(idx: np.ndarray, ref: np.ndarray, k: int, tol: np.ndarray) -> bool:
    """Each row's selected keys equal the exact top-k of the reference scores `ref` [T, S] (-inf = hidden) except
    for keys within `tol` of the k-th score (near-ties the fp16 head reduction may order either way), and the same
    number of keys is selected."""
    for row, sel, t in zip(ref, idx, tol):
        got = set(sel[sel >= 0].tolist())
        vis = np.isfinite(row)
        if len(got) != min(k, int(vis.sum())):
            return False
        want = set(R.topk(row[None], k)[1][0].tolist()) - {-1}
        if got != want:
            kth = np.sort(row[vis])[::-1][min(k, int(vis.sum())) - 1]
            if any(abs(row[i] - kth) > t for i in got ^ want):
                return False
    return True


def verify_lightning_indexer(shape: dict, rng: np.random.Generator) -> list[Error]:
    t, s, h, d, k = (shape.get(x, v) for x, v in (("tokens", 24), ("keys", 700), ("heads", 64), ("dim", 128),
                                                  ("topk", 64)))
    q, kk, w = rng.standard_normal((t, h, d)), rng.standard_normal((s, d)), rng.standard_normal((t, h))
    out = []
    for dtype, chip in (("bf16", "910b2"), ("int8", "910b2"), ("fp8", "950pr")):
        sc, idx = F.lightning_indexer(q, kk, w, k, dtype=dtype, chip=chip)
        qd, kd = indexer_inputs(q, kk, dtype)
        ref = R.indexer_scores(qd, kd, w)
        out.append(_err(dtype, sc, R.topk(ref, k)[0], topk_agrees(idx, ref, k, indexer_tolerance(qd, kd, w))))
    return out


def verify_rowwise(shape: dict, rng: np.random.Generator) -> list[Error]:
    rows, dim = shape.get("rows", 77), shape.get("dim", 1024)
    x, w, b = rng.standard_normal((rows, dim)), rng.standard_normal(dim), rng.standard_normal(dim)
    xq = rnd(x, "bf16")
    r = rng.standard_normal((rows, dim))
    y, s = F.add_rmsnorm(x, r, w)
    sq = rnd(xq + rnd(r, "bf16"), "bf16")
    return [_err("rmsnorm bf16", F.rmsnorm(x, w), R.rmsnorm(xq, w)),
            _err("layernorm bf16", F.layernorm(x, w, b), R.layernorm(xq, w, b)),
            _err("add_rmsnorm sum bf16", s, sq, bool(np.array_equal(s, sq))),
            _err("add_rmsnorm bf16", y, R.rmsnorm(sq, w))]


def _selection(rng: np.random.Generator, tokens: int, keys: int, k: int) -> np.ndarray:
    """Random top-k style index rows: distinct visible keys (causal, queries last), -1 where fewer than k."""
    rows = []
    for pos in range(keys - tokens, keys):
        sel = rng.permutation(pos + 1)[:k]
        rows.append(np.concatenate([sel, -np.ones(k - sel.size, np.int64)]))
    return np.stack(rows)


def verify_sparse_flash_attention(shape: dict, rng: np.random.Generator) -> list[Error]:
    t, s, h, k = (shape.get(x, v) for x, v in (("tokens", 4), ("keys", 900), ("heads", 128), ("topk", 600)))
    d, dv = shape.get("d_qk", 576), shape.get("d_v", 512)
    q, kv = rng.standard_normal((t, h, d)), rng.standard_normal((s, d))
    idx, scale = _selection(rng, t, s, k), mla_softmax_scale(DEEPSEEK_V32)  # 192^-0.5 mscale^2, not 576^-0.5
    out = F.sparse_mla_attention(q, kv, idx, scale, dv)
    return [_err("bf16", out, R.sparse_mla_attention(rnd(q, "bf16"), rnd(kv, "bf16"), idx, scale, dv))]


def verify_flash_attention(shape: dict, rng: np.random.Generator) -> list[Error]:
    t, s, h, kvh = (shape.get(x, v) for x, v in (("tokens", 130), ("keys", 700), ("heads", 4), ("kv_heads", 4)))
    d, dv = shape.get("d_qk", 192), shape.get("d_v", 128)
    q, kk, v = rng.standard_normal((t, h, d)), rng.standard_normal((s, kvh, d)), rng.standard_normal((s, kvh, dv))
    out = F.dense_attention(q, kk, v, d ** -0.5)
    return [_err("bf16", out, R.dense_attention(*(rnd(x, "bf16") for x in (q, kk, v)), d ** -0.5))]


def verify_v4_attention(shape: dict, rng: np.random.Generator) -> list[Error]:
    t, s, h, d = (shape.get(x, v) for x, v in (("tokens", 3), ("keys", 1100), ("heads", 64), ("head_dim", 512)))
    w, topk = shape.get("window", 128), shape.get("topk", 200)
    q, kv, sink = rng.standard_normal((t, h, d)), rng.standard_normal((s, d)), rng.standard_normal(h)
    out = []
    for ratio, sel in ((0, None), (128, None), (4, topk)):
        ckv = rng.standard_normal((s // ratio, d)) if ratio else None
        cmp = _selection(rng, t, s // 4, sel)[:, :sel] if sel else None
        if cmp is not None:  # only entries completed before each query: (p + 1) // 4 of them
            cmp = np.where(cmp < ((s - t + np.arange(t) + 1) // 4)[:, None], cmp, -1)
        got = F.v4_attention(q, kv, sink, d ** -0.5, w, ratio, ckv, cmp)
        ref = R.v4_attention(rnd(q, "bf16"), rnd(kv, "bf16"), sink, d ** -0.5, w, ratio,
                             rnd(ckv, "bf16") if ratio else None, cmp)
        out.append(_err({0: "SWA bf16", 128: "HCA bf16", 4: "CSA bf16"}[ratio], got, ref))
    return out


VERIFY: dict[str, Callable[[dict, np.random.Generator], list[Error]]] = {
    "gemm": verify_gemm,
    "grouped_gemm": verify_grouped_gemm,
    "lightning_indexer": verify_lightning_indexer,
    "rowwise": verify_rowwise,
    "sparse_flash_attention": verify_sparse_flash_attention,
    "flash_attention": verify_flash_attention,
    "v4_attention": verify_v4_attention,
}


# ------------------------------------------------------------------ the ops around attention and the experts
def verify_mhc_pre(shape: dict, rng: np.random.Generator) -> list[Error]:
    t, n, d = shape.get("tokens", 5), shape.get("streams", 4), shape.get("hidden", 512)
    mix, iters = shape.get("mix", (2 + n) * n), shape.get("sinkhorn_iters", 20)
    x, fn = rng.standard_normal((t, n, d)), 0.05 * rng.standard_normal((mix, n * d))
    scale, base = rng.uniform(0.5, 1.5, 3), 0.3 * rng.standard_normal(mix)
    got = F.mhc_pre(x, fn, scale, base, iters)
    ref = R.mhc_pre(rnd(x, "bf16"), rnd(fn, "fp32"), scale, base, iters)
    return [_err(name, g, r) for name, g, r in zip(("y bf16", "post fp32", "res fp32"), got, ref)]


def verify_mhc_post(shape: dict, rng: np.random.Generator) -> list[Error]:
    t, n, d = shape.get("tokens", 6), shape.get("streams", 4), shape.get("hidden", 1024)
    x, f = rng.standard_normal((t, n, d)), rng.standard_normal((t, d))
    post, res = rng.random((t, n)), R.sinkhorn(rng.standard_normal((t, n, n)))
    return [_err("bf16", F.mhc_post(x, f, post, res), R.mhc_post(rnd(x, "bf16"), rnd(f, "bf16"), post, res))]


def verify_moe_gate(shape: dict, rng: np.random.Generator) -> list[Error]:
    """V3 (sigmoid, 8 groups ranked by their top-2 with the bias; by their max without one, fp32 GEMM as DeepSeek's
    Gate) and V4 (sqrt-softplus, no groups): indices equal, weights within the fp32 vector math."""
    m, k, n, topk = (shape.get(x, v) for x, v in (("m", 9), ("k", 512), ("n", 64), ("topk", 8)))
    x, w, bias = rng.standard_normal((m, k)), 0.1 * rng.standard_normal((k, n)), 0.1 * rng.standard_normal(n)
    groups = shape.get("groups", 8)
    out = []
    for score, g, b, dt in (("sigmoid", groups, bias, "bf16"), ("sigmoid", groups, None, "fp32"),
                            ("sqrtsoftplus", 1, bias, "bf16")):
        wt, idx = F.moe_gate(x, w, b, topk, g, score=score, route_scale=2.5, dtype=dt)
        rw, ri = R.moe_gate(rnd(x, dt), rnd(w, dt), b, topk, g, score=score, route_scale=2.5)
        name = f"{score} {'top2' if b is not None else 'max'} {dt}"
        out.append(_err(name, wt, rw, bool((idx == ri).all())))
    return out


def verify_compressor(shape: dict, rng: np.random.Generator) -> list[Error]:
    k, d = shape.get("k", 256), shape.get("d", 128)
    out = []
    for ratio, m in ((4, shape.get("m", 70)), (128, 2 * 128)):
        ov = 2 if ratio == 4 else 1
        x, w = rng.standard_normal((m, k)), 0.1 * rng.standard_normal((k, 2 * ov * d))
        ape, norm = 0.1 * rng.standard_normal((ratio, ov * d)), 1 + 0.1 * rng.standard_normal(d)
        ang = rng.uniform(0, 3, (m // ratio, 32))
        got = F.compressor(x, w, ape, norm, ratio, np.cos(ang), np.sin(ang))
        ref = R.compressor(rnd(x, "bf16"), rnd(w, "bf16"), rnd(ape, "fp32"), norm, ratio, ov, np.cos(ang),
                           np.sin(ang))
        out.append(_err(f"ratio {ratio} bf16", got, ref))
        if ratio == 4:  # V4's fp8 simulation of the non-RoPE dims: the QAT's own error against the unquantised
            sim = F.compressor(x, w, ape, norm, ratio, np.cos(ang), np.sin(ang), quant="fp8")
            out.append(_err(f"ratio {ratio} fp8 nope", sim, ref))
    return out


def verify_rope(shape: dict, rng: np.random.Generator) -> list[Error]:
    """Plain theta and the V3.2 YaRN table (factor 40 over 4096, models.md §1.1), both layouts, against the float64
    rotation at float64 angles: positions up to 4096 (the fp32 angle table the reference builds adds ~p 2^-24 rad)."""
    from npusim.functional.rotary import Rotary

    t, h, d = shape.get("tokens", 7), shape.get("heads", 4), shape.get("dim", 64)
    x, pos = rng.standard_normal((t, h, d)), rng.integers(0, 4096, t)
    yarn = Rotary(10000.0, 40.0, 4096, 32, 1, 1.0, 163840)
    out = [_err(f"{'interleaved' if il else 'half'} bf16", F.rope(x, pos, interleaved=il),
                R.rope(rnd(x, "bf16"), pos, interleaved=il)) for il in (True, False)]
    return out + [_err("yarn interleaved bf16", F.rope(x, pos, rotary=yarn),
                       R.rope(rnd(x, "bf16"), pos, freqs=yarn.freqs(d)))]


def verify_quantise(shape: dict, rng: np.random.Generator) -> list[Error]:
    """Round trip x -> (q, scales) -> x against the bf16 input: the format's own error."""
    rows, n = shape.get("rows", 9), shape.get("elements", 512)
    x = rng.standard_normal((rows, n))
    out = []
    for dt in ("int8", "fp8", "fp8amax", "mxfp8", "mxfp4"):
        q, s = F.quantise(x, dt)
        out.append(_err(dt, F.dequantise(q, s, dt), rnd(x, "bf16")))
    return out


def verify_swiglu(shape: dict, rng: np.random.Generator) -> list[Error]:
    rows, w = shape.get("rows", 33), shape.get("width", 640)
    x = 4 * rng.standard_normal((rows, 2 * w))
    return [_err(f"clamp {c} bf16", F.swiglu(x, c), R.swiglu(rnd(x, "bf16"), c)) for c in (0, 10)]


def verify_dequant_swiglu_quant(shape: dict, rng: np.random.Generator) -> list[Error]:
    """int32 accumulators and per-row scales -> int8 rows: dequantised again, against SwiGLU of the float64 product
    (the format's own error: int8 per row)."""
    rows, w = shape.get("rows", 33), shape.get("width", 640)
    x, xs = rng.integers(-40000, 40000, (rows, 2 * w)), rng.random(rows) * 5e-4  # |x xs| up to 20: the clamp bites
    out = []
    for c in (0, 10):
        q, s = F.dequant_swiglu_quant(x, xs, c)
        out.append(_err(f"clamp {c} int8", q * s[:, None], R.swiglu(x * rnd(xs, "fp32")[:, None], c),
                        bool((q == np.round(q)).all() and np.abs(q).max() <= 127)))
    return out


def verify_copy(shape: dict, rng: np.random.Generator) -> list[Error]:
    """Rows copied (bf16), cast to fp32 (exact) and back (bf16 rounding), and repeated as Tensor.repeat lays them."""
    rows, cols = shape.get("rows", 37), shape.get("cols", 640)
    x = 3 * rng.standard_normal((rows, cols))
    xb = rnd(x, "bf16")
    return [_err("bf16 copy", F.copy(x), xb, bool(np.array_equal(F.copy(x), xb))),
            _err("fp32 cast", F.copy(x, dtype="bf16", out_dtype="fp32"), xb),
            _err("bf16 cast of fp32", F.copy(x, dtype="fp32", out_dtype="bf16"), xb),
            _err("bf16 repeat", F.copy(x[:, :64], repeat=5), np.repeat(xb[:, :64], 5, 0))]


def verify_moe_combine(shape: dict, rng: np.random.Generator) -> list[Error]:
    t, k, d = shape.get("tokens", 6), shape.get("topk", 8), shape.get("hidden", 1024)
    y, idx = rng.standard_normal((t * k, d)), rng.permutation(t * k).reshape(t, k)
    w, sh = rng.random((t, k)), rng.standard_normal((t, d))
    return [_err("bf16", F.moe_combine(y, idx, w, sh), R.moe_combine(rnd(y, "bf16"), idx, w, rnd(sh, "bf16")))]


def verify_moe_permute(shape: dict, rng: np.random.Generator) -> list[Error]:
    """init_routing (top-k expansion in expert order, INT8 per row), re_routing (INT8 rows and scales reordered)
    and the un-sort (BF16 rows reordered) against x[index] of the same rounded rows."""
    t, k, d = shape.get("tokens", 7), shape.get("topk", 4), shape.get("hidden", 512)
    x, expand = rng.standard_normal((t, d)), np.repeat(np.arange(t), k)[rng.permutation(t * k)]
    q, s = F.moe_permute(x, expand, out_dtype="int8")
    q_ref, s_ref = F.quantise(rnd(x, "bf16")[expand], "int8", 0)
    order = rng.permutation(t * k)
    rq, rs = F.moe_permute(q, order, s)
    y = rng.standard_normal((t * k, d))
    return [_err("init_routing int8", q * s[:, None], q_ref * s_ref, bool((q == q_ref).all())),
            _err("re_routing int8", rq, q[order], bool((rs == s[order]).all())),
            _err("unsort bf16", F.moe_permute(y, order), rnd(y, "bf16")[order])]


def verify_embedding(shape: dict, rng: np.random.Generator) -> list[Error]:
    t, d, n = shape.get("tokens", 7), shape.get("hidden", 512), shape.get("streams", 4)
    table, ids = rng.standard_normal((100, d)), rng.integers(0, 100, t)
    ref = np.repeat(rnd(table, "bf16")[ids][:, None], n, 1)
    return [_err("bf16", F.embedding(ids, table, n), ref)]


VERIFY["quant_matmul"] = verify_quant_matmul
VERIFY |= {"mhc_pre": verify_mhc_pre, "mhc_post": verify_mhc_post, "moe_gate": verify_moe_gate,
           "compressor": verify_compressor, "rope": verify_rope, "quantise": verify_quantise,
           "dequantise": verify_quantise, "swiglu": verify_swiglu,
           "dequant_swiglu_quant": verify_dequant_swiglu_quant, "copy": verify_copy, "moe_combine": verify_moe_combine,
           "moe_permute": verify_moe_permute, "embedding": verify_embedding}


def verify_cache_update(shape: dict, rng: np.random.Generator) -> list[Error]:
    rows, n = shape.get("rows", 9), shape.get("elements", 576)
    cache, x = rng.standard_normal((4 * rows, n)), rng.standard_normal((rows, n))
    slots = rng.permutation(4 * rows)[:rows]
    slots[0] = -1  # a padded token: nothing written
    ref = rnd(cache, "bf16")
    ref[slots[1:]] = rnd(x, "bf16")[1:]
    return [_err("bf16", F.cache_update(cache, x, slots), ref)]


VERIFY["cache_update"] = verify_cache_update


def verify_sinkhorn(shape: dict, rng: np.random.Generator) -> list[Error]:
    t, n, iters = shape.get("rows", 9), shape.get("streams", 4), shape.get("iters", 20)
    z = 3 * rng.standard_normal((t, n, n))
    return [_err(f"fp32 eps {eps:g}", F.sinkhorn(z, iters, eps), R.sinkhorn(rnd(z, "fp32"), iters, eps))
            for eps in (1e-6, 1e-2)]


VERIFY["sinkhorn"] = verify_sinkhorn
