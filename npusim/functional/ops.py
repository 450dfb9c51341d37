"""What each tile action computes (the `op` of `npusim.kernels.tile.Act`), on padded tile arrays.

Every op gets its input tiles in `Act.ins` order, `shape` (the output tile size) and the action's args, and
returns the result before rounding. Rounding to the action's dtype is the executor's job.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

OPS: dict[str, Callable[..., np.ndarray]] = {}


def op(fn):
    OPS[fn.__name__.rstrip("_")] = fn
    return fn


@op
def load(x, shape, **_):
    return x


OPS["copy"] = OPS["store"] = load


@op
def zero(shape, **_):
    return np.zeros(shape)


@op
def fill(shape, value=0.0, **_):
    return np.full(shape, value)


@op
def mmad(*tiles, shape, qblock=0, transpose_b=False, accumulate=True, **_):
    """c (+)= a @ b on the cube (fp32/int32 accumulation); with block scales, each K block's partial sum is scaled.
    Inputs: (c, a, b[, sa, sb]) when accumulating into L0C, (a, b[, sa, sb]) for a fresh L0C."""
    c, a, b, *scales = tiles if accumulate else (0.0, *tiles)
    if transpose_b:  # a contiguous copy: OpenBLAS on a transposed view is ~100x slower on a busy machine
        b = np.ascontiguousarray(np.swapaxes(b, -1, -2))
    if qblock:
        sa, sb = scales
        acc = np.zeros(np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, b.shape[-1])))
        for j in range(sa.shape[-1]):
            ks = slice(j * qblock, (j + 1) * qblock)
            acc = acc + (a[..., ks] @ b[..., ks, :]) * sa[..., j:j + 1] * sb[..., j:j + 1, :]
        prod = acc
    else:
        prod = a @ b
    return c + prod if accumulate else prod


@op
def fixpipe(c, *deq, shape, relu=False, dequant=False, scale=1.0, add=False, **_):
    """L0C -> GM/L1 on the way out: optional per-row x per-column dequant or a constant scale (DEQF16), optional
    ReLU; `add`: a GM atomic add into the destination (its current contents the last input)."""
    if add:
        *deq, old = deq
        return fixpipe(c, *deq, shape=shape, relu=relu, dequant=dequant, scale=scale) + old
    if dequant:
        sa, sb = deq
        c = c * sa * sb
    c = c * scale
    return np.maximum(c, 0.0) if relu else c


@op
def headdiag(w, shape, tpc, **_):
    """Lightning-indexer head weights as the A operand of the head-reduction matmul: per L0 chunk of `tpc` tokens a
    16-row block, row i holding token i's head weights in that token's columns (block-diagonal, other rows zero)."""
    out = np.zeros(shape)
    heads = w.shape[1]
    for t in range(w.shape[0]):
        r, i = divmod(t, tpc)
        out[r * 16 + i, i * heads:(i + 1) * heads] = w[t]
    return out


@op
def li_scores(p, *ks, shape, qpos, kpos, keys, causal=True, **_):
    """Head-summed indexer scores of n tokens (first at position qpos) over a key tile at kpos, times the key scales
    (quantised variants); -inf past the sequence end and, causal, after each token's position."""
    out = p * ks[0] if ks else p
    pos = kpos + np.arange(p.shape[1])
    bad = (pos >= keys)[None] | (((pos[None] > (qpos + np.arange(p.shape[0]))[:, None])) if causal else False)
    return np.where(bad, -np.inf, out)


@op
def topk_init(shape, **_):
    """Running top-k state of n rows: n rows of values (-inf), then n rows of indices (-1)."""
    out = np.full(shape, -np.inf)
    out[shape[0] // 2:] = -1
    return out


def _topk(vals: np.ndarray, idx: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the k largest, ties to the lower index (the reference's order); -inf entries carry index -1."""
    idx = np.where(np.isneginf(vals), np.inf, idx)
    order = np.lexsort((idx, -vals), axis=-1)[:, :k]
    v, i = np.take_along_axis(vals, order, -1), np.take_along_axis(idx, order, -1)
    return v, np.where(np.isinf(i), -1, i)


@op
def topk_merge(state, scores, shape, kpos, **_):
    """Running exact top-k of n rows (state: values then indices) merged with a tile of scores starting at key kpos."""
    n, k = scores.shape[0], state.shape[1]
    vals = np.concatenate([state[:n], scores], 1)
    idx = np.concatenate([state[n:], np.broadcast_to(kpos + np.arange(scores.shape[1]), scores.shape)], 1)
    return np.concatenate(_topk(vals, idx, k))


@op
def topk_union(state, part, shape, **_):
    """Running exact top-k merged with another top-k list (values then indices, e.g. one key range's partial)."""
    n, k = state.shape[0] // 2, state.shape[1]
    return np.concatenate(_topk(np.concatenate([state[:n], part[:n]], 1), np.concatenate([state[n:], part[n:]], 1), k))


@op
def rmsnorm(x, p, shape, eps=1e-6, **_):
    """p row 0: weight."""
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * p[0]


@op
def layernorm(x, p, shape, eps=1e-6, **_):
    """p rows 0, 1: weight, bias."""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p[0] + p[1]



# ------------------------------------------------------------------ attention (npusim.kernels.attention)
@op
def gather(idx, kv, shape, base=0, **_):
    """The vector cores' discrete copy: rows base + idx of kv; index -1 (no key) gives a zero row."""
    i = idx[0].astype(np.int64)
    out = np.zeros((i.size, kv.shape[1]))
    ok = i >= 0
    out[ok] = kv[base + i[ok]]
    return out[:, :shape[1]]


@op
def iota(shape, kpos, keys, **_):
    """Positions of a contiguous key tile; -1 past the sequence end."""
    pos = kpos + np.arange(shape[1])
    return np.where(pos < keys, pos, -1)[None]


def _scores(pos, s, scale, qpos, row, hb, causal):
    """Scaled scores with masked keys at -inf: no key (-1) or, causal, after the row's query position."""
    qp = qpos + (row + np.arange(s.shape[0])) // hb
    bad = (pos < 0) | ((pos > qp[:, None]) if causal else False)
    return np.where(bad, -np.inf, s * scale)


def _finite(m):
    return np.where(np.isneginf(m), 0.0, m)


@op
def softmax_state(pos, s, *prev, shape, scale, qpos, row, hb, causal=True, **_):
    """One key tile of the online softmax: state rows (m', l', alpha) with m' = max(m, rowmax x),
    l' = l e^(m - m') + rowsum e^(x - m'), alpha = e^(m - m') (the accumulator's rescale factor); without a previous
    state (a group's first tile) m = -inf, l = 0."""
    x = _scores(pos, s, scale, qpos, row, hb, causal)
    st = prev[0] if prev else np.stack([np.full(x.shape[0], -np.inf), np.zeros(x.shape[0])], 1)
    m_new = np.maximum(st[:, 0], x.max(1))
    alpha = np.exp(st[:, 0] - _finite(m_new))
    l_new = st[:, 1] * alpha + np.exp(x - _finite(m_new)[:, None]).sum(1)
    return np.stack([m_new, l_new, alpha], 1)


@op
def softmax_exp(pos, s, st, shape, scale, qpos, row, hb, causal=True, **_):
    """P = e^(x - m') of the tile (0 at masked keys), for the cube's P V."""
    x = _scores(pos, s, scale, qpos, row, hb, causal)
    return np.exp(x - _finite(st[:, 0])[:, None])


@op
def rescale(acc, st, shape, **_):
    return acc * st[:, 2:3]


@op
def add(a, b, shape, **_):
    return a + b


@op
def finalize(acc, st, *sink, shape, **_):
    """O = acc / (l + e^(sink - m)) (the sink only in the denominator); rows without keys give 0."""
    den = st[:, 1] + (np.exp(sink[0][0] - _finite(st[:, 0])) if sink else 0.0)
    return np.divide(acc, den[:, None], out=np.zeros_like(acc), where=den[:, None] > 0)


# ------------------------------------------------------------------ split-KV (flash-decoding) partials and combine
@op
def partial(acc, st, shape, **_):
    """A key range's normalised output acc / l (0 where the range had no visible key)."""
    return np.divide(acc, st[:, 1:2], out=np.zeros_like(acc), where=st[:, 1:2] > 0)


@op
def lse(st, shape, **_):
    """A key range's log-sum-exp m + ln l (-inf where it had no visible key)."""
    with np.errstate(divide="ignore"):
        return np.where(st[:, 1] > 0, _finite(st[:, 0]) + np.log(st[:, 1]), -np.inf)[:, None]


@op
def merge_weights(lse_, *sink, shape, **_):
    """w_s = e^(lse_s - M) / (sum_s e^(lse_s - M) + e^(sink - M)), M the largest term (the sink only joins the
    denominator, as in the unsplit softmax); rows without any key get zero weights."""
    terms = lse_ if not sink else np.concatenate([lse_, sink[0][0][:, None]], 1)
    m = _finite(terms.max(1, keepdims=True))
    e = np.exp(terms - m)
    den = e.sum(1, keepdims=True)
    return np.divide(e[:, :lse_.shape[1]], den, out=np.zeros_like(lse_), where=den > 0)


@op
def axpy(acc, w, x, shape, col, **_):
    """acc + w[:, col] x: one partial merged into the output rows."""
    return acc + w[:, col:col + 1] * x


@op
def mul(a, b, shape, **_):
    """a * b, b broadcast (per-column or per-row scales)."""
    return a * b


@op
def sum_slices(parts, shape, **_):
    """The K slices of a split-K product (stacked on the first axis) summed."""
    return parts.sum(axis=0, keepdims=True)
