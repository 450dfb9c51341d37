"""Number formats of the functional path: rounding a result to its dtype, and block-scaled quantisation.

Arrays are stored as float64 holding exactly representable values of their dtype, so every rounding step of the
trace is explicit and the float64 reference shares the storage.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from npusim.errors import NpusimError

FLOATS = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp8e4m3": ml_dtypes.float8_e4m3fn,
          "fp8e5m2": ml_dtypes.float8_e5m2, "fp4e2m1": ml_dtypes.float4_e2m1fn}
INTS = {"int8": 127, "int32": 2**31 - 1}
# largest finite magnitude of each element format (OCP FP8/MX specs; int8 symmetric)
QMAX = {"int8": 127.0, "fp8e4m3": 448.0, "fp8e5m2": 57344.0, "fp4e2m1": 6.0, "bf16": 3.0e38, "fp16": 65504.0}


def rnd(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded to dtype (round-to-nearest-even; ints saturate), returned as float64."""
    x = np.asarray(x, dtype=np.float64)
    if dtype in ("", "fp64"):
        return x
    if dtype in FLOATS:
        return x.astype(FLOATS[dtype]).astype(np.float64)
    if dtype in INTS:
        return np.clip(np.rint(x), -INTS[dtype] - 1, INTS[dtype])
    raise NpusimError(f"unknown functional dtype '{dtype}'; allowed: {', '.join([*FLOATS, *INTS])}")


def quantize(x: np.ndarray, elem: str, axis: int, block: int = 0, scale_fmt: str = "fp32",
             other_block: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric quantisation of x along `axis` in blocks of `block` elements (0 = the whole axis).

    Returns (q, s) with x ~ q * repeat(s): q holds values of `elem`, s one scale per block (axis length
    ceil(n/block)); `other_block` > 1 shares a scale over that many entries of the last other axis (FP8 weights
    use 128 x 128 blocks). e8m0 scales are powers of two (MX, ue8m0).
    """
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    n = x.shape[-1]
    blk = block or n
    nb = -(-n // blk)
    pad = np.zeros(x.shape[:-1] + (nb * blk,))
    pad[..., :n] = x
    amax = np.abs(pad.reshape(x.shape[:-1] + (nb, blk))).max(-1)
    if other_block > 1:  # share across groups of rows of the other (second-to-last) axis
        r = amax.shape[-2]
        g = -(-r // other_block)
        padded = np.zeros(amax.shape[:-2] + (g * other_block, nb))
        padded[..., :r, :] = amax
        amax = np.repeat(padded.reshape(amax.shape[:-2] + (g, other_block, nb)).max(-2), other_block, -2)[..., :r, :]
    s = np.where(amax > 0, amax / QMAX[elem], 1.0)
    s = 2.0 ** np.ceil(np.log2(s)) if scale_fmt == "e8m0" else rnd(s, "fp32")
    q = rnd(pad.reshape(x.shape[:-1] + (nb, blk)) / s[..., None], elem).reshape(pad.shape)[..., :n]
    return np.moveaxis(q, -1, axis), np.moveaxis(s, -1, axis)


def expand(s: np.ndarray, axis: int, block: int, n: int) -> np.ndarray:
    """Per-block scales repeated to per-element along axis (for dequantising a reference)."""
    return np.repeat(s, block or n, axis=axis).take(range(n), axis=axis)
