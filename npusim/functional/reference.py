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


def indexer_scores(q, k, weights, causal: bool = True) -> np.ndarray:
    """models.md §1.3: I[t,s] = sum_j w[t,j] ReLU(q[t,j] . k[s]); q [T,H,D], k [S,D], weights [T,H] -> [T,S],
    -inf where causal hides the key."""
    q, k, w = (np.asarray(x, np.float64) for x in (q, k, weights))
    scores = np.einsum("th,ths->ts", w, np.maximum(np.einsum("thd,sd->ths", q, k), 0.0))
    return np.where(causal_mask(q.shape[0], k.shape[0]), scores, -np.inf) if causal else scores


def lightning_indexer(q, k, weights, topk_: int, causal: bool = True):
    """The exact top-k of `indexer_scores`: (values, indices) [T, topk]."""
    return topk(indexer_scores(q, k, weights, causal), topk_)


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


# ------------------------------------------------------------------ mHC, RoPE, quantisation, SwiGLU, MoE, Compressor
def sinkhorn(logits, iters: int = 20, eps: float = 1e-6):
    """models.md §2.5: A = softmax_k(logits) + eps; A /= colsum + eps; iters - 1 times: rows, then columns."""
    z = np.asarray(logits, np.float64)
    a = np.exp(z - z.max(-1, keepdims=True))
    a = a / a.sum(-1, keepdims=True) + eps
    a = a / (a.sum(-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        a = a / (a.sum(-1, keepdims=True) + eps)
        a = a / (a.sum(-2, keepdims=True) + eps)
    return a


def mhc_pre(x, fn, scale, base, iters: int = 20, eps: float = 1e-6, norm_eps: float = 1e-6):
    """models.md §2.5 (V4 hc_pre + hc_split_sinkhorn): x [T, n, d], fn [mix, n*d] -> (y = sum_j pre_j X_j [T, d],
    post [T, n], res [T, n, n]); norm_eps in the RMS, eps (hc_eps) in pre and the Sinkhorn."""
    x = np.asarray(x, np.float64)
    T, n, d = x.shape
    v = x.reshape(T, n * d)
    m = (v @ np.asarray(fn, np.float64).T) / np.sqrt((v * v).mean(-1, keepdims=True) + norm_eps)
    a0, a1, a2 = scale
    sig = lambda z: 1.0 / (1.0 + np.exp(-z))  # noqa: E731
    pre = sig(m[:, :n] * a0 + base[:n]) + eps
    post, res = np.zeros((T, n)), np.zeros((T, n, n))
    if fn.shape[0] > n:
        post = 2.0 * sig(m[:, n:2 * n] * a1 + base[n:2 * n])
        res = sinkhorn((m[:, 2 * n:] * a2 + base[2 * n:]).reshape(T, n, n), iters, eps)
    return np.einsum("tj,tjd->td", pre, x), post, res


def mhc_post(x, f, post, res):
    """X'_k = post_k F + sum_j res[j, k] X_j: x [T, n, d], f [T, d], post [T, n], res [T, n, n]."""
    return post[:, :, None] * np.asarray(f, np.float64)[:, None] + np.einsum("tjk,tjd->tkd", res, x)


def rope(x, positions, theta: float = 10000.0, interleaved: bool = True, freqs=None):
    """x [T, H, D] rotated by angle p_t * f_i per pair i (f_i = theta^(-2i/D) unless `freqs` [D/2] are given)."""
    x = np.asarray(x, np.float64)
    D = x.shape[-1]
    f = theta ** (-np.arange(0, D, 2) / D) if freqs is None else np.asarray(freqs, np.float64)
    ang = np.asarray(positions, float)[:, None, None] * f
    c, s = np.cos(ang), np.sin(ang)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
        return out
    a, b = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([a * c - b * s, a * s + b * c], -1)


def swiglu(x, clamp: float = 0.0):
    x = np.asarray(x, np.float64)
    g, u = np.split(x, 2, -1)
    if clamp:
        g, u = np.minimum(g, clamp), np.clip(u, -clamp, clamp)
    return g / (1.0 + np.exp(-g)) * u


def moe_combine(y, index, weights, shared):
    return np.einsum("tk,tkd->td", weights, np.asarray(y, np.float64)[index]) + shared


def moe_gate(x, w, bias, topk: int, groups: int = 1, limit: int = 0, score: str = "sigmoid",
             route_scale: float = 1.0, hash_idx=None):
    """models.md §1.2.1 / §2.6, DeepSeek's Gate: s = score(x w); b = s + bias; with groups, each group ranks by the
    sum of its two largest b (a bias given) or by its largest s (bias None), experts outside the best `limit`
    groups drop out; idx = the topk largest b (or the hash table's row); weights = s[idx] / sum * route_scale."""
    logits = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    s = 1.0 / (1.0 + np.exp(-logits)) if score == "sigmoid" else np.sqrt(np.log1p(np.exp(logits)))
    b = s + (0.0 if bias is None else np.asarray(bias, np.float64))
    T, E = b.shape
    if hash_idx is not None:
        idx = np.asarray(hash_idx, np.int64)
    else:
        if groups > 1:
            keep_groups = limit or max(1, groups // 2)
            per = E // groups
            rank = []
            for g in range(groups):
                cols = b[:, g * per:(g + 1) * per]
                rank.append(np.sort(cols, 1)[:, -2:].sum(1) if bias is not None else cols.max(1))
            rank = np.stack(rank, 1)
            for t in range(T):
                best = sorted(range(groups), key=lambda g: (-rank[t, g], g))[:keep_groups]
                for g in set(range(groups)) - set(best):
                    b[t, g * per:(g + 1) * per] = -np.inf
        idx = np.stack([sorted(range(E), key=lambda e: (-row[e], e))[:topk] for row in b])
    wts = np.take_along_axis(s, idx, -1)
    return wts / wts.sum(-1, keepdims=True) * route_scale, idx


def compressor(x, w, ape, norm, ratio: int, overlap: int, cos, sin, eps: float = 1e-6):
    """models.md §2.3 for positions 0 .. T-1: [C | Z] = x @ w; entry i pools (overlap 2) the a-half of block i-1
    and the b-half of block i (block -1: C = 0, Z = -inf), softmax(Z + ape) weights C per channel; RMSNorm with
    `norm`; RoPE (interleaved) of the last 2 * cos.shape[1] dims at the entry's angles cos / sin [E, rope/2]."""
    cz = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    T = cz.shape[0]
    d = cz.shape[1] // (2 * overlap)
    E = T // ratio
    C, Z = cz[:, :overlap * d], cz[:, overlap * d:] + np.tile(ape, (T // ratio + 1, 1))[:T]
    out = np.zeros((E, d))
    for i in range(E):
        blk = slice(i * ratio, (i + 1) * ratio)
        if overlap == 2:
            prev = slice((i - 1) * ratio, i * ratio)
            cp, zp = (C[prev, :d], Z[prev, :d]) if i else (np.zeros((ratio, d)), np.full((ratio, d), -np.inf))
            c, z = np.concatenate([cp, C[blk, d:]]), np.concatenate([zp, Z[blk, d:]])
        else:
            c, z = C[blk], Z[blk]
        p = np.exp(z - z.max(0))
        out[i] = (p / p.sum(0) * c).sum(0)
    y = out / np.sqrt((out * out).mean(-1, keepdims=True) + eps) * norm
    r = 2 * cos.shape[1]
    a, b = y[:, -r:][:, 0::2].copy(), y[:, -r:][:, 1::2].copy()
    y[:, -r:][:, 0::2], y[:, -r:][:, 1::2] = a * cos - b * sin, a * sin + b * cos
    return y
