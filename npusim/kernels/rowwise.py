"""Row-wise vector kernels (RMSNorm, LayerNorm): AIV-only, rows streamed through UB.

Each AIV takes blocks of rows: MTE2 GM->UB, one vector pass, MTE3 UB->GM, double-buffered in UB. One class,
parameterised by the row op: the op's FLOPs per element and its functional meaning are all that differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from npusim.errors import NpusimError
from npusim.kernels.base import Band, Kernel, Work, cdiv, distribute, ins, nbytes, register
from npusim.kernels.tile import Act, Ref, lin
from npusim.kernels.trace import Trace
from npusim.spec.chip import Chip

# vector FLOPs per element of each row op (estimate: count of fp32 multiply/add/compare per element)
ROW_OPS = {"rmsnorm": 4, "layernorm": 7}
ROW_FLAGS = {"ub.free": 2, "ub.full": 0, "out.free": 2, "out.full": 0}


@register
@dataclass(frozen=True)
class RowWise(Kernel):
    """x [rows, dim] -> op(x) [rows, dim]; p [1 or 2, dim] holds the weight (and LayerNorm bias)."""

    name: ClassVar[str] = "rowwise"
    options: ClassVar[tuple[str, ...]] = ("op", "dtype", "block_rows")
    rows: int
    dim: int
    op: str = "rmsnorm"
    dtype: str = "bf16"
    block_rows: int = 0  # 0 = as many as double-buffer in UB

    def work(self) -> Work:
        io = 2 * nbytes(self.dtype, self.rows, self.dim)
        return Work(0.0, io, vector_flops=ROW_OPS[self.op] * self.rows * self.dim)

    def build(self, chip: Chip) -> Trace:
        if self.op not in ROW_OPS:
            raise NpusimError(f"unknown row op '{self.op}'; allowed: {', '.join(ROW_OPS)}", field="op")
        row_bytes = 4.0 * self.dim  # fp32 working copy in UB
        br = self.block_rows or max(1, min(self.rows, int(chip.aiv.buffers.ub / 2 / (2 * row_bytes + 64))))
        dt = self.dtype
        r0, stop = lin(("blk", br)), (self.rows, self.dim)
        body = (
            ins("mte2", "load", Act("load", Ref("ub.x", (0, 0), (br, self.dim)), (Ref("x", (r0, 0), (br, self.dim), stop),),
                                    "fp32"), bytes=nbytes(dt, br, self.dim), dtype=dt, src="gm", dst="ub",
                wait=("ub.free",), set=("ub.full",)),
            ins("vector", self.op, Act(self.op, Ref("ub.y", (0, 0), (br, self.dim)),
                                       (Ref("ub.x", (0, 0), (br, self.dim)), Ref("p", (0, 0), (-1, -1))), dt),
                flops=ROW_OPS[self.op] * br * self.dim, bytes=row_bytes * br, dtype="fp32", src="ub", dst="ub",
                wait=("ub.full", "out.free"), set=("ub.free", "out.full")),
            ins("mte3", "store", Act("store", Ref("y", (r0, 0), (br, self.dim), stop), (Ref("ub.y", (0, 0),
                                                                                              (br, self.dim)),), dt),
                bytes=nbytes(dt, br, self.dim), dtype=dt, src="ub", dst="gm", wait=("out.full",), set=("out.free",)))
        blocks = cdiv(self.rows, br)
        groups = distribute([Band(blocks, None, (body,))], chip.aiv.count, ROW_FLAGS)
        w = self.work()
        return Trace(self.name, chip.name, self.shape, groups, 0.0, w.hbm_bytes, {"ub": 2 * 2 * row_bytes * br},
                     {"op": self.op, "block_rows": br, "blocks": blocks}, dtype=dt)
