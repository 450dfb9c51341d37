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
