"""Layer 4b: the ops executed by their kernels' tile traces on NumPy arrays (one trace, two executors).

Every function builds its kernel for the given shapes on `chip` (default 910b2), executes the trace with
`npusim.functional.executor.execute`, and returns float64 arrays holding values of the output dtype. Shapes
follow models.md: T query tokens, S keys, H heads, D head dim. Float64 references live in `.reference`.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from npusim.functional.executor import execute
from npusim.functional.numerics import quantize, rnd
from npusim.spec.chip import Chip, load_chip


@lru_cache(maxsize=8)
def _chip(name: str) -> Chip:
    return load_chip(name)


def run(kernel, tensors: dict[str, np.ndarray], chip: str | Chip = "910b2") -> dict[str, np.ndarray]:
    """Trace `kernel` on the chip and execute it on `tensors` (outputs must be present, preallocated)."""
    c = _chip(chip) if isinstance(chip, str) else chip
    return execute(kernel.trace(c), tensors)


def gemm(a: np.ndarray, b: np.ndarray, dtype: str = "bf16", out_dtype: str = "bf16", chip: str | Chip = "910b2",
         **tiles: int) -> np.ndarray:
    """a [m, k] @ b [k, n] (or batched [B, m, k] @ [B, k, n]) under a dtype scheme (bf16, fp16, int8 W8A8,
    fp8 128-blocks, mxfp8, mxfp4): operands are quantised as the scheme says, then multiplied by the GEMM trace."""
    from npusim.kernels.gemm import Gemm, scheme_of

    squeeze = a.ndim == 2
    a3, b3 = (a[None], b[None]) if squeeze else (a, b)
    sch = scheme_of(dtype)
    kern = Gemm(a3.shape[1], b3.shape[2], a3.shape[2], a3.shape[0], dtype, out_dtype, **tiles)
    t = {"c": np.zeros((a3.shape[0], a3.shape[1], b3.shape[2]))}
    if sch.scale:
        t["a"], t["sa"] = quantize(a3, sch.elem, 2, sch.qblock, sch.scale)
        t["b"], t["sb"] = quantize(b3, sch.elem, 1, sch.qblock, sch.scale, sch.b_block_n)
    else:
        t["a"], t["b"] = rnd(a3, sch.elem), rnd(b3, sch.elem)
    c = run(kern, t, chip)["c"]
    return c[0] if squeeze else c


def lightning_indexer(q: np.ndarray, k: np.ndarray, weights: np.ndarray, topk: int, causal: bool = True,
                      dtype: str = "bf16", chip: str | Chip = "910b2", **tiles: int):
    """q [T, H, D], k [S, D], weights [T, H] (scales folded in) -> (scores, indices) [T, topk].

    Queries are the last T positions of the S keys; with `causal`, key s is visible to query t iff
    s <= S - T + t. Indices are sorted by score (ties to the lower index); -1 (score -inf) where fewer than
    topk keys are visible.
    """
    from npusim.kernels.indexer import LightningIndexer

    T, H, D = q.shape
    S = k.shape[0]
    kern = LightningIndexer(T, S, H, D, topk, 1, int(causal), dtype, **tiles)
    out = run(kern, {"q": rnd(q.reshape(T * H, D), dtype), "k": rnd(k, dtype), "w": rnd(weights, "fp32"),
                     "scores": np.zeros((T, topk)), "indices": np.zeros((T, topk))}, chip)
    return out["scores"], out["indices"].astype(np.int64)


def rmsnorm(x: np.ndarray, weight: np.ndarray, dtype: str = "bf16", chip: str | Chip = "910b2") -> np.ndarray:
    """x [rows, dim] -> x / rms(x) * weight (eps 1e-6, fp32 math, output rounded to dtype)."""
    return _rowwise("rmsnorm", x, weight[None], dtype, chip)


def layernorm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, dtype: str = "bf16",
              chip: str | Chip = "910b2") -> np.ndarray:
    """x [rows, dim] -> (x - mean) / std * weight + bias (eps 1e-6)."""
    return _rowwise("layernorm", x, np.stack([weight, bias]), dtype, chip)


def _rowwise(op: str, x: np.ndarray, p: np.ndarray, dtype: str, chip) -> np.ndarray:
    from npusim.kernels.rowwise import RowWise

    kern = RowWise(x.shape[0], x.shape[1], op, dtype)
    return run(kern, {"x": rnd(x, dtype), "p": p, "y": np.zeros(x.shape)}, chip)["y"]
