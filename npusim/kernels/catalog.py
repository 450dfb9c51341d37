"""All kernels by name, and building one from a name and a shape dict (what the op graph and the CLI do)."""

from __future__ import annotations

from typing import Any

from npusim.errors import NpusimError, did_you_mean
from npusim.kernels import (attention, gemm, indexer, projection, quant_matmul, rowwise,  # noqa: F401  (registration)
                            vector)
from npusim.kernels.base import KERNELS, Kernel


def kernel(name: str, shape: dict[str, Any] | None = None, **options: Any) -> Kernel:
    if name not in KERNELS:
        raise NpusimError(f"unknown kernel '{name}'{did_you_mean(name, KERNELS)}", field="kernel")
    return KERNELS[name].from_shape(shape or {}, **options)


def names() -> list[str]:
    return sorted(KERNELS)
