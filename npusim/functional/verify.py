"""Traced execution vs float64 reference for each kernel and dtype scheme: max abs / rel error on random inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from npusim import functional as F
from npusim.functional import reference as R
from npusim.functional.numerics import rnd


@dataclass(frozen=True)
class Error:
    scheme: str
    max_abs: float
    max_rel: float  # max abs error / max |reference|
    exact: bool | None = None  # index outputs: equal sets


def _err(scheme: str, out: np.ndarray, ref: np.ndarray, exact: bool | None = None) -> Error:
    ok = np.isfinite(ref)
    diff = float(np.abs(out[ok] - ref[ok]).max()) if ok.any() else 0.0
    return Error(scheme, diff, diff / max(float(np.abs(ref[ok]).max()) if ok.any() else 1.0, 1e-30), exact)


def verify_gemm(shape: dict, rng: np.random.Generator, schemes=("bf16", "fp16", "int8")) -> list[Error]:
    m, n, k = shape.get("m", 96), shape.get("n", 160), shape.get("k", 300)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    ref = R.gemm(a, b)
    return [_err(s, F.gemm(a, b, dtype=s, out_dtype="fp32"), ref) for s in schemes]


def verify_lightning_indexer(shape: dict, rng: np.random.Generator) -> list[Error]:
    t, s, h, d, k = (shape.get(x, v) for x, v in (("tokens", 24), ("keys", 700), ("heads", 64), ("dim", 128),
                                                  ("topk", 64)))
    q, kk, w = rng.standard_normal((t, h, d)), rng.standard_normal((s, d)), rng.standard_normal((t, h))
    sc, idx = F.lightning_indexer(q, kk, w, k)
    rs, ri = R.lightning_indexer(rnd(q, "bf16"), rnd(kk, "bf16"), w, k)
    same = all(set(a[a >= 0]) == set(b[b >= 0]) for a, b in zip(idx, ri))
    return [_err("bf16", sc, rs, same)]


def verify_rowwise(shape: dict, rng: np.random.Generator) -> list[Error]:
    rows, dim = shape.get("rows", 77), shape.get("dim", 1024)
    x, w, b = rng.standard_normal((rows, dim)), rng.standard_normal(dim), rng.standard_normal(dim)
    xq = rnd(x, "bf16")
    return [_err("rmsnorm bf16", F.rmsnorm(x, w), R.rmsnorm(xq, w)),
            _err("layernorm bf16", F.layernorm(x, w, b), R.layernorm(xq, w, b))]


VERIFY: dict[str, Callable[[dict, np.random.Generator], list[Error]]] = {
    "gemm": verify_gemm,
    "lightning_indexer": verify_lightning_indexer,
    "rowwise": verify_rowwise,
}
