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
def mmad(c, a, b, *scales, shape, qblock=0, transpose_b=False, accumulate=True, **_):
    """c (+)= a @ b on the cube (fp32/int32 accumulation); with block scales, each K block's partial sum is scaled."""
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
