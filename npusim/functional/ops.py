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
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
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
def fixpipe(c, *deq, shape, relu=False, dequant=False, **_):
    """L0C -> GM/L1 on the way out: optional per-row x per-column dequant, optional ReLU."""
    if dequant:
        sa, sb = deq
        c = c * sa * sb
    return np.maximum(c, 0.0) if relu else c


@op
def headsum(s, w, shape, qpos, kpos, keys, causal=True, **_):
    """Lightning-indexer weighted head-sum of ReLU scores for one token: w[1,H] @ s[H,n], masked past the
    sequence end and (causal) after the query position."""
    out = w @ s
    pos = kpos + np.arange(s.shape[1])
    bad = (pos >= keys) | ((pos > qpos) if causal else False)
    return np.where(bad, -np.inf, out)


@op
def topk_init(shape, **_):
    out = np.full(shape, -np.inf)
    out[1::2] = -1
    return out


@op
def topk_merge(state, scores, shape, kpos, **_):
    """Running exact top-k: state rows (values, indices) merged with a new tile of scores starting at key kpos.
    Order: larger score first, ties to the lower index (the reference's order); -inf entries carry index -1."""
    k = state.shape[1]
    vals = np.concatenate([state[0], scores[0]])
    idx = np.concatenate([state[1], kpos + np.arange(scores.shape[1])])
    idx = np.where(np.isneginf(vals), np.inf, idx)
    order = np.lexsort((idx, -vals))[:k]
    v, i = vals[order], idx[order]
    return np.stack([v, np.where(np.isinf(i), -1, i)])


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
