"""Traced execution vs float64 reference for each kernel and dtype scheme: max abs / rel error on random inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from npusim import functional as F
from npusim.functional import reference as R
from npusim.functional.numerics import rnd


@dataclass(frozen=True)
class Error:
    scheme: str
    max_abs: float
    max_rel: float  # max abs error / max |reference|
    exact: bool | None = None  # index outputs: equal sets


def _err(scheme: str, out: np.ndarray, ref: np.ndarray, exact: bool | None = None) -> Error:
    ok = np.isfinite(ref)
    diff = float(np.abs(out[ok] - ref[ok]).max()) if ok.any() else 0.0
    return Error(scheme, diff, diff / max(float(np.abs(ref[ok]).max()) if ok.any() else 1.0, 1e-30), exact)


def verify_gemm(shape: dict, rng: np.random.Generator, schemes=("bf16", "fp16", "int8")) -> list[Error]:
    m, n, k = shape.get("m", 96), shape.get("n", 160), shape.get("k", 300)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    ref = R.gemm(a, b)
    return [_err(s, F.gemm(a, b, dtype=s, out_dtype="fp32"), ref) for s in schemes]


def verify_grouped_gemm(shape: dict, rng: np.random.Generator) -> list[Error]:
    e, k, n = shape.get("experts", 4), shape.get("k", 300), shape.get("n", 160)
    counts = rng.integers(0, 2 * shape.get("rows", 240) // e, e)
    counts[0] = 0  # an expert no token chose
    a, b = rng.standard_normal((int(counts.sum()), k)), rng.standard_normal((e, k, n))
    ref = np.einsum("rk,rkn->rn", a, b[np.repeat(np.arange(e), counts)])
    return [_err(s, F.grouped_gemm(a, b, counts, dtype=s, out_dtype="fp32"), ref) for s in ("bf16", "fp16", "int8")]


def verify_lightning_indexer(shape: dict, rng: np.random.Generator) -> list[Error]:
    t, s, h, d, k = (shape.get(x, v) for x, v in (("tokens", 24), ("keys", 700), ("heads", 64), ("dim", 128),
                                                  ("topk", 64)))
    q, kk, w = rng.standard_normal((t, h, d)), rng.standard_normal((s, d)), rng.standard_normal((t, h))
    sc, idx = F.lightning_indexer(q, kk, w, k)
    rs, ri = R.lightning_indexer(rnd(q, "bf16"), rnd(kk, "bf16"), w, k)
    same = all(set(a[a >= 0]) == set(b[b >= 0]) for a, b in zip(idx, ri))
    return [_err("bf16", sc, rs, same)]


def verify_rowwise(shape: dict, rng: np.random.Generator) -> list[Error]:
    rows, dim = shape.get("rows", 77), shape.get("dim", 1024)
    x, w, b = rng.standard_normal((rows, dim)), rng.standard_normal(dim), rng.standard_normal(dim)
    xq = rnd(x, "bf16")
    return [_err("rmsnorm bf16", F.rmsnorm(x, w), R.rmsnorm(xq, w)),
            _err("layernorm bf16", F.layernorm(x, w, b), R.layernorm(xq, w, b))]


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
    idx, scale = _selection(rng, t, s, k), d ** -0.5
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
