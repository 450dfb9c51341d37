"""Float64 references of every op, written straight from the math of models.md §1-2 (no tiling, no rounding)."""

from __future__ import annotations

import numpy as np


def gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float64) @ np.asarray(b, np.float64)


def topk(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k per row: larger first, ties to the lower index; masked (-inf) entries get index -1."""
    idx = np.broadcast_to(np.arange(scores.shape[-1]), scores.shape)
    order = np.lexsort((idx, -scores), axis=-1)[..., :k]
    vals = np.take_along_axis(scores, order, -1)
    pad = k - vals.shape[-1]
    if pad > 0:
        vals = np.pad(vals, [(0, 0)] * (vals.ndim - 1) + [(0, pad)], constant_values=-np.inf)
        order = np.pad(order, [(0, 0)] * (order.ndim - 1) + [(0, pad)], constant_values=-1)
    return vals, np.where(np.isneginf(vals), -1, order)


def causal_mask(tokens: int, keys: int) -> np.ndarray:
    """True where key s is visible to query t (queries are the last `tokens` positions; s <= t)."""
    return np.arange(keys)[None, :] <= (keys - tokens + np.arange(tokens))[:, None]


def lightning_indexer(q, k, weights, topk_: int, causal: bool = True):
    """models.md §1.3: I[t,s] = sum_j w[t,j] ReLU(q[t,j] . k[s]); q [T,H,D], k [S,D], weights [T,H]."""
    q, k, w = (np.asarray(x, np.float64) for x in (q, k, weights))
    scores = np.einsum("th,ths->ts", w, np.maximum(np.einsum("thd,sd->ths", q, k), 0.0))
    if causal:
        scores = np.where(causal_mask(q.shape[0], k.shape[0]), scores, -np.inf)
    return topk(scores, topk_)


def rmsnorm(x, weight, eps: float = 1e-6):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def layernorm(x, weight, bias, eps: float = 1e-6):
    x = np.asarray(x, np.float64)
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * weight + bias


def attention(q, k, v, keep, scale: float, sink=None):
    """softmax over the kept keys of q [T, H, D] . k [T or 1, H or 1, S, D]^T, times v; keep [T, H or 1, S] bool;
    an optional per-head sink [H] joins the denominator only. Rows with no kept key give 0."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    x = np.where(keep, (q[:, :, None] @ np.swapaxes(k, -1, -2))[:, :, 0] * scale, -np.inf)
    m = x.max(-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, np.asarray(sink, np.float64)[None, :, None])
    m = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(x - m)
    den = p.sum(-1, keepdims=True) + (np.exp(np.asarray(sink)[None, :, None] - m) if sink is not None else 0.0)
    out = (p[:, :, None] @ v)[:, :, 0]
    return np.divide(out, den, out=np.zeros_like(out), where=den > 0)


def sparse_mla_attention(q, kv, indices, scale: float, d_v: int = 512, causal: bool = True):
    """models.md §1.4 absorbed MLA over the selected rows: q [T, H, 576], kv [S, 576] (K = kv, V = kv[:, :d_v]),
    indices [T, k] (-1 = none); queries are the last T positions; causal drops selected keys after the query."""
    kv, idx = np.asarray(kv, np.float64), np.asarray(indices)
    T, S = idx.shape[0], kv.shape[0]
    keep = idx >= 0
    if causal:
        keep &= idx <= (S - T + np.arange(T))[:, None]
    rows = kv[np.where(keep, idx, 0)]  # [T, k, D]
    return attention(q, rows[:, None], rows[:, None, :, :d_v], keep[:, None], scale)


def dense_attention(q, k, v, scale: float, causal: bool = True):
    """q [T, H, D], k [S, KVH, D], v [S, KVH, Dv] (H a multiple of KVH): softmax(q k^T scale) v, causal with the
    queries the last T positions."""
    T, H, _ = q.shape
    S, kvh = k.shape[:2]
    kk = np.repeat(np.moveaxis(np.asarray(k, np.float64), 1, 0), H // kvh, 0)[None]  # [1, H, S, D]
    vv = np.repeat(np.moveaxis(np.asarray(v, np.float64), 1, 0), H // kvh, 0)[None]
    keep = causal_mask(T, S)[:, None] if causal else np.ones((T, 1, S), bool)
    return attention(q, kk, vv, keep, scale)


def v4_attention(q, kv, sink, scale: float, window: int, ratio: int = 0, ckv=None, cmp_indices=None):
    """models.md §2.2/§2.4: query t (position p = S - T + t) attends to raw rows max(0, p-window+1)..p and to
    compressed entries i < (p+1)//ratio (HCA: all of them; CSA: those in cmp_indices [T, k], -1 = none), with the
    per-head sink [H] in the softmax denominator. K = V = the 512-dim rows."""
    kv = np.asarray(kv, np.float64)
    T, S = q.shape[0], kv.shape[0]
    pos = S - T + np.arange(T)
    rows = [kv[None].repeat(T, 0)]
    keep = [(np.arange(S)[None] <= pos[:, None]) & (np.arange(S)[None] > pos[:, None] - window)]
    if ratio:
        ckv = np.asarray(ckv, np.float64)
        done = np.arange(ckv.shape[0])[None] < ((pos + 1) // ratio)[:, None]
        if cmp_indices is not None:
            chosen = np.zeros_like(done)
            for t, sel in enumerate(np.asarray(cmp_indices)):
                chosen[t, sel[sel >= 0]] = True
            done &= chosen
        rows.append(ckv[None].repeat(T, 0))
        keep.append(done)
    rows, keep = np.concatenate(rows, 1), np.concatenate(keep, 1)
    return attention(q, rows[:, None], rows[:, None], keep[:, None], scale, sink)
