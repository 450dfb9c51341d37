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
    use 128 x 128 blocks). Scale formats: fp32 = amax / qmax (plain amax); e8m0 = its power of two above (MX);
    ue8m0 = DeepSeek's act_quant(scale_fmt="ue8m0") of V3.2 / V4: amax floored at 1e-4, times the fp32 constant
    1/qmax in fp32, rounded up to a power of two; x / s in fp32, clamped to +-qmax, then rounded to `elem`.
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
    blocks = pad.reshape(x.shape[:-1] + (nb, blk))
    if scale_fmt == "ue8m0":
        s = pow2_ceil(rnd(np.maximum(rnd(amax, "fp32"), rnd(1e-4, "fp32")) * rnd(1.0 / QMAX[elem], "fp32"), "fp32"))
        q = rnd(np.clip(rnd(blocks / s[..., None], "fp32"), -QMAX[elem], QMAX[elem]), elem)
    else:
        s = np.where(amax > 0, amax / QMAX[elem], 1.0)
        s = 2.0 ** np.ceil(np.log2(s)) if scale_fmt == "e8m0" else rnd(s, "fp32")
        q = rnd(blocks / s[..., None], elem)
    q = q.reshape(pad.shape)[..., :n]
    return np.moveaxis(q, -1, axis), np.moveaxis(s, -1, axis)


# the lightning indexer's quantised q and k: element format and scale format (one scale per head vector; DeepSeek's
# indexer: act_quant(q / k, 128, ue8m0) over its 128-dim heads)
INDEX_QUANT = {"int8": ("int8", "fp32"), "fp8": ("fp8e4m3", "ue8m0")}


def pow2_ceil(s: np.ndarray) -> np.ndarray:
    """The least power of two >= s (s > 0), exactly: frexp gives s = m 2^e with m in [0.5, 1)."""
    m, e = np.frexp(s)
    return np.ldexp(1.0, np.where(m == 0.5, e - 1, e))


def expand(s: np.ndarray, axis: int, block: int, n: int) -> np.ndarray:
    """Per-block scales repeated to per-element along axis (for dequantising a reference)."""
    return np.repeat(s, block or n, axis=axis).take(range(n), axis=axis)
