"""Float64 references of every op, written straight from the math of models.md §1-2 (no tiling, no rounding)."""

from __future__ import annotations

import numpy as np


def gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float64) @ np.asarray(b, np.float64)
