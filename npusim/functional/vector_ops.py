"""Functional meaning of the tile actions of the vector-tile and projection kernels (npusim.kernels.vector,
npusim.kernels.projection): mHC pre/post, Sinkhorn, RoPE, quantisation, SwiGLU, MoE gate and combine, the
Compressor's pooling. Registered into `npusim.functional.ops.OPS`; each gets its input tiles, `shape` (the output
tile) and the action's args, and returns the result before rounding.
"""

from __future__ import annotations

import numpy as np

from npusim.functional.numerics import QMAX, quantize, rnd
from npusim.functional.ops import op


def _tokens(x: np.ndarray, per: int) -> np.ndarray:
    return x.reshape(x.shape[0] // per, per, *x.shape[1:])


@op
def mhc_post(x, f, post, res, shape, streams, **_):
    """X'_k = post_k F + sum_j res[j, k] X_j, per token (x rows: token-major, `streams` per token)."""
    n = streams
    x3 = _tokens(x, n)
    r = res.reshape(-1, n, n)
    return (post[:, :, None] * f[:, None, :] + np.einsum("tjk,tjc->tkc", r, x3)).reshape(shape)


@op
def rope(x, cos, sin, shape, heads, interleaved, **_):
    """Rotate pairs (2i, 2i+1) (interleaved) or (i, i + d/2) (half) by the token's angles."""
    x3 = _tokens(x, heads)
    c, s = cos[:, None, :], sin[:, None, :]
    if interleaved:
        a, b = x3[..., 0::2], x3[..., 1::2]
        out = np.empty_like(x3)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    else:
        h = x3.shape[-1] // 2
        a, b = x3[..., :h], x3[..., h:]
        out = np.concatenate([a * c - b * s, a * s + b * c], -1)
    return out.reshape(shape)


@op
def rows_every(x, shape, first, step, **_):
    """Rows first, first + step, ... of x (a DMA with a source stride: one head's rows of token-major heads), zero
    rows past its end."""
    rows = x[first::step][:shape[0]]
    out = np.zeros((shape[0], x.shape[1]))
    out[:len(rows)] = rows
    return out


@op
def place_every(table, rows, shape, first, step, **_):
    """The table with rows placed at first, first + step, ... (a DMA with a destination stride); clipped at its end."""
    out = table.copy()
    n = min(len(range(first, out.shape[0], step)), rows.shape[0])
    out[first:first + n * step:step] = rows[:n]
    return out


@op
def quant_scale(x, shape, elem, block, scale_fmt, **_):
    return quantize(x, elem, 1, block, scale_fmt)[1]


@op
def quant_apply(x, s, shape, elem, block, scale_fmt="fp32", **_):
    """x / scale rounded to the element format (the scales of `quant_scale`); ue8m0 as DeepSeek's act_quant: the
    quotient in fp32, clamped to the format's range."""
    n = x.shape[1]
    per = np.repeat(s, block or n, 1)[:, :n]
    y = np.divide(x, per, out=np.zeros_like(x), where=per != 0)
    if scale_fmt == "ue8m0":
        y = np.clip(rnd(y, "fp32"), -QMAX[elem], QMAX[elem])
    return rnd(y, elem)


@op
def row_max(x, shape, **_):
    """The largest entry of each row (a row's scale from its chunks' scales)."""
    return x.max(axis=1, keepdims=True)


@op
def dequant(q, s, shape, block, **_):
    n = q.shape[1]
    return q * np.repeat(s, block or n, 1)[:, :n]


@op
def swiglu(gate, up, shape, clamp=0.0, **_):
    if clamp:
        gate, up = np.minimum(gate, clamp), np.clip(up, -clamp, clamp)
    return gate / (1.0 + np.exp(-gate)) * up


@op
def combine(y, w, shared, shape, topk, **_):
    return np.einsum("tk,tkc->tc", w, _tokens(y, topk)) + shared


@op
def repeat_rows(rows, shape, streams, **_):
    return np.repeat(rows, streams, 0)


# ------------------------------------------------------------------ projections (npusim.kernels.projection)
@op
def cast_ss(x, ss, shape, **_):
    """x in fp32, and beside it (last column) the running sum of squares per row."""
    return np.concatenate([x, ss + (x * x).sum(1, keepdims=True)], 1)


@op
def sum_parts(cp, shape, parts, **_):
    """The K ranges' partial results side by side [rows, parts * n] -> their sum [rows, n]."""
    return cp.reshape(cp.shape[0], parts, -1).sum(1)[:, :shape[1]]


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@op
def hc_mix(c, ss, hc, shape, streams, dim, eps=1e-6, norm_eps=1e-6, **_):
    """mHC mixes per row (models.md §2.5): m = c * rsqrt(ss/dim + norm_eps); pre = sigmoid(m a0 + b) + eps,
    post = 2 sigmoid(m a1 + b), H_res logits m a2 + b -> softmax over k + eps -> divided by column sums + eps
    (the first Sinkhorn iteration). Out [rows, 2n + n^2] = pre | post | res (zeros where mix = n)."""
    n = streams
    m = c * (1.0 / np.sqrt(ss / dim + norm_eps))
    a, b = hc[0, :3], hc[0, 3:]
    out = np.zeros((c.shape[0], 2 * n + n * n))
    out[:, :n] = _sigmoid(m[:, :n] * a[0] + b[:n]) + eps
    if c.shape[1] > n:
        out[:, n:2 * n] = 2.0 * _sigmoid(m[:, n:2 * n] * a[1] + b[n:2 * n])
        out[:, 2 * n:] = _sinkhorn_start(m[:, 2 * n:] * a[2] + b[2 * n:], n, eps)
    return out


def _sinkhorn_start(z: np.ndarray, n: int, eps: float) -> np.ndarray:
    """H_res logits [rows, n*n] -> softmax over each row + eps, divided by the column sums + eps (the first
    Sinkhorn iteration)."""
    z = z.reshape(-1, n, n)
    e = np.exp(z - z.max(-1, keepdims=True))
    r = e / e.sum(-1, keepdims=True) + eps
    return (r / (r.sum(-2, keepdims=True) + eps)).reshape(-1, n * n)


@op
def sinkhorn_start(m, shape, streams, eps=1e-6, **_):
    """The standalone Sinkhorn's first step on the mix layout (pre | post | H_res logits): H_res started as hc_mix
    starts it, pre and post passed through."""
    out = m.copy()
    out[:, 2 * streams:] = _sinkhorn_start(m[:, 2 * streams:], streams, eps)
    return out


@op
def sinkhorn(m, shape, streams, axis, eps=1e-6, **_):
    """One half-iteration of Sinkhorn-Knopp on the H_res part: divide by row sums (axis 'rows') or column sums."""
    n = streams
    out = m.copy()
    r = out[:, 2 * n:].reshape(-1, n, n)
    r = r / (r.sum(-1 if axis == "rows" else -2, keepdims=True) + eps)
    out[:, 2 * n:] = r.reshape(-1, n * n)
    return out


@op
def presum(y, x, m, shape, stream, **_):
    """y + pre_j X_j for stream j (a column chunk)."""
    return y + m[:, stream:stream + 1] * x


def _topk(v: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest per row, larger first, ties to the lower index."""
    idx = np.broadcast_to(np.arange(v.shape[-1]), v.shape)
    return np.lexsort((idx, -v), axis=-1)[..., :k]


def gate_scores(logits: np.ndarray, score: str) -> np.ndarray:
    if score == "sigmoid":
        return _sigmoid(logits)
    return np.sqrt(np.logaddexp(0.0, logits))  # sqrt(softplus)


def route(s: np.ndarray, bias: np.ndarray, topk: int, groups: int, limit: int,
          hash_idx: np.ndarray | None = None, group_score: str = "top2") -> np.ndarray:
    """Experts per row: the hash table's, or the top-k of s + bias within the best `limit` groups (group score:
    'top2' the sum of its two best, as DeepSeek's Gate with a correction bias; 'max' its best, the Gate without)."""
    if hash_idx is not None:
        return hash_idx.astype(np.int64)
    b = s + bias
    if groups > 1:
        g = b.reshape(b.shape[0], groups, -1)
        best = np.sort(g, -1)[..., ::-1][..., :2].sum(-1) if group_score == "top2" else g.max(-1)
        keep = np.zeros_like(best, bool)
        np.put_along_axis(keep, _topk(best, limit), True, -1)
        b = np.where(np.repeat(keep, g.shape[-1], -1), b, -np.inf)
    return _topk(b, topk)


@op
def gate(c, bias, *hash_idx, shape, topk, groups, limit, score, route_scale, group_score="top2", **_):
    """MoE routing of each row: weights (s[idx] / sum * route_scale) then indices, side by side."""
    s = gate_scores(c, score)
    idx = route(s, bias, topk, groups, limit, hash_idx[0] if hash_idx else None, group_score)
    w = np.take_along_axis(s, idx, -1)
    return np.concatenate([w / w.sum(-1, keepdims=True) * route_scale, idx], 1)


@op
def pool(*tiles, shape, entry, c0, d, **_):
    """One compressed entry's channels c0 .. c0+dc: softmax over its rows of Z + ape, weights on C. Tiles are
    (C, Z) of the b-half (HCA: the only half) and, overlapping, first the previous block's a-half (padded with
    C = 0, Z = -inf for entry 0)."""
    *halves, ape = tiles
    dc = shape[1]
    cs, zs = [], []
    pairs = list(zip(halves[0::2], halves[1::2]))
    for i, (c, z) in enumerate(pairs):
        col = (c0 if len(pairs) == 1 or i == 0 else d + c0)
        zz = z + ape[:, col:col + dc]
        if len(pairs) == 2 and i == 0 and entry == 0:
            c, zz = np.zeros_like(c), np.full_like(z, -np.inf)
        cs.append(c)
        zs.append(zz)
    c, z = np.concatenate(cs), np.concatenate(zs)
    p = np.exp(z - z.max(0, keepdims=True))
    return ((p / p.sum(0, keepdims=True)) * c).sum(0, keepdims=True)


@op
def norm_rope(e, w, cs, shape, rope, eps=1e-6, **_):
    """RMSNorm of the entry, then RoPE (interleaved pairs) of its last `rope` dims; cs = cos | sin."""
    y = e / np.sqrt((e * e).mean(-1, keepdims=True) + eps) * w
    h = rope // 2
    cos, sin = cs[:, :h], cs[:, h:]
    r = y[:, -rope:]
    a, b = r[:, 0::2].copy(), r[:, 1::2].copy()
    y[:, -rope:][:, 0::2], y[:, -rope:][:, 1::2] = a * cos - b * sin, a * sin + b * cos
    return y


@op
def scatter(table, idx, rows, shape, **_):
    """The table with rows placed at idx (a cache update); index -1 leaves the table as it was."""
    out = table.copy()
    i = idx[0].astype(np.int64)
    ok = i >= 0
    out[i[ok]] = rows[:i.size][ok]
    return out
