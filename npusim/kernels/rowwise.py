"""Row-wise vector kernels (RMSNorm, LayerNorm): AIV-only, rows streamed through UB.

The rows are split evenly over the AIVs, each cutting its share into equal blocks of rows: MTE2 GM->UB, one vector
pass, MTE3 UB->GM, double-buffered in UB (the tuner times a few block counts: the fewest that fit and more). One class,
parameterised by the row op: the op's FLOPs per element and its functional meaning are all that differ. The weight
(and LayerNorm bias) row is read by the vector pass where it lies; UB holds the fp32 working copies of a block.

Barrier chains: CANN's RMSNorm NORMAL template (ops-nn norm/rms_norm rms_norm.h on dav-c220) reduces each row on its
own: x^2, a halving tree of Adds down to one 64-lane repeat, WholeReduceSum, the sum read by the scalar unit (a
V->S->V hand-off) for 1/sqrt, then scale, gamma and the cast out, every step behind a PipeBarrier<PIPE_V>. The vector
pass of a block stands for that chain (`chain`): the engine charges the vector pipe's `issue_cycles` for each
instruction after the first. LayerNorm's chain is not counted (no source read): one instruction per block.
The per-head q / k RMSNorm of Qwen3 (`head_rmsnorm`, rows = tokens x heads of head_dim 128) is not that kernel: the
NPU backends run it inside the fused split / q-k norm / RoPE kernel (vllm-ascend vllm_ascend/ops/triton/linearnorm/
split_qkv_rmsnorm_rope.py, sgl-kernel-npu's split_qkv_norm_rope_kernel), which loads a block of head rows as one
tile and takes each step over the whole tile, the row sums reduced with the rows as the repeat axis, as the ops-nn
MERGE_N template does for narrow rows (rms_norm_merge_n.h: one cast, one x^2, ReduceSumMultiN — a Duplicate, then
per 64-lane chunk of a row one Add / WholeReduceSum over at most 255 rows — Muls, Adds, Sqrt, Duplicate, Div on the
sums, the rstd BroadCast, the scale, gamma and the cast out). Its chain is per block, not per row (`merged_chain`).
The plain norms keep the per-row chain: the one measured narrow RMSNorm ([515, 1536], kernels.md K193, what the
chain's issue cost is fitted on) behaves so.

AddRmsNorm (`residual` 1: torch_npu.npu_add_rms_norm, what the DeepSeek decoder layers of cann-recipes run for both
norms, models/deepseek_r1/models/modules.py:86 @ fbc225d): the block's residual rows come in beside x, one Add over
the block, the norm of the sum, and the sum goes out beside y as the next residual (ops-nn norm/add_rms_norm: Add,
then RMSNorm's per-row chain); twice the rows in and out.

Written on the tile-program layer (npusim.kernels.program): a block's rows go through two UB queues (in: MTE2 ->
vector, out: vector -> MTE3) between the stages copy_in / compute / copy_out; a plan's `buffering` is their depth.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from npusim.errors import NpusimError
from npusim.kernels.base import Band, Kernel, Work, cdiv, even_tiles, nbytes, register
from npusim.kernels.program import AIV, Code, Queue, TileProgram, stage
from npusim.kernels.tile import Act, Ref, lin
from npusim.kernels.trace import Trace
from npusim.spec.chip import Chip

# vector FLOPs per element of each row op (estimate: count of fp32 multiply/add/compare per element)
ROW_OPS = {"rmsnorm": 4, "layernorm": 7, "head_rmsnorm": 4}
MATH = {"head_rmsnorm": "rmsnorm"}  # the row op's functional meaning, where its name says how it runs
LANES, MAX_REPEAT = 64, 255  # fp32 elements of one repeat; repeats of one instruction (ReduceSumForSmallReduceDim)
# the merged template's steps around the reduction, each on the whole block (rms_norm_merge_n.h Compute): x^2,
# Duplicate of the sums' buffer, Muls, Adds, Sqrt, Duplicate, Div, the rstd BroadCast, x * rstd, * gamma, the cast out
MERGE_N_STEPS = 11


@register
@dataclass(frozen=True)
class RowWise(Kernel):
    """x [rows, dim] -> op(x) [rows, dim]; p [1 or 2, dim] holds the weight (and LayerNorm bias)."""

    name: ClassVar[str] = "rowwise"
    options: ClassVar[tuple[str, ...]] = ("op", "dtype", "block_rows", "buffering", "residual")
    rows: int
    dim: int
    op: str = "rmsnorm"
    dtype: str = "bf16"
    block_rows: int = 0  # 0 = as many as double-buffer in UB
    buffering: int = 0  # depth of the in / out queues (0 = 2, as written)
    residual: int = 0  # 1: AddRmsNorm, x + residual normed and the sum written back

    @property
    def arrays(self) -> int:
        """Row arrays in (and out) per row: x (y), and the residual (the sum) for AddRmsNorm."""
        return 1 + self.residual

    def work(self) -> Work:
        io = 2 * self.arrays * nbytes(self.dtype, self.rows, self.dim)
        return Work(0.0, io, vector_flops=(ROW_OPS[self.op] + self.residual) * self.rows * self.dim)

    def fewest(self, chip: Chip) -> tuple[int, int]:
        """(a vector core's share of the rows, the fewest equal blocks it cuts into that double-buffer in and out in
        UB as fp32 working copies)."""
        share = cdiv(self.rows, chip.aiv.count)
        fit = max(1, min(share, int(chip.aiv.buffers.ub // self.ub_per_row())))
        return share, cdiv(share, fit)

    def slot(self, br: int) -> float:
        """One in (or out) buffer of a block: the rows' fp32 working copy; AddRmsNorm's hold its two row arrays as
        stored, the sum's fp32 copy resident beside them (estimate: its four row arrays in fp32 would not double-buffer
        one 7168-wide row in a 192 KiB UB)."""
        return 2 * nbytes(self.dtype, br, self.dim) if self.residual else 4.0 * self.dim * br

    def ub_per_row(self) -> float:
        """UB a row takes: the in and out buffers double-buffered (and AddRmsNorm's resident fp32 sum)."""
        return 2 * 2 * self.slot(1) + 4.0 * self.dim * self.residual + 128

    def block(self, chip: Chip) -> int:
        """Rows per block: the rows split evenly over the vector cores (CANN's former / tail cores), a core's share
        in the fewest equal blocks that fit UB (or `block_rows`)."""
        share, fewest = self.fewest(chip)
        return self.block_rows or cdiv(share, fewest)

    def candidates(self, chip: Chip) -> tuple[Kernel, ...]:
        """The rows per block of a core's share cut into n equal blocks for n on the fixed ladder (`even_tiles`)."""
        if self.block_rows:
            return (self,)
        share, fewest = self.fewest(chip)
        row_bytes = 2 * self.arrays * nbytes(self.dtype, self.dim)
        return tuple(replace(self, block_rows=br) for br in even_tiles(share, fewest, row_bytes))

    def merged_chain(self, br: int) -> int:
        """Dependent vector instructions of a merged block of br rows (head_rmsnorm): the cast in, the fixed steps, and
        the reduction's Add / WholeReduceSum per 64-lane chunk of a row for every 255 rows (and AddRmsNorm's Add)."""
        return ((self.dtype != "fp32") * self.arrays + self.residual + MERGE_N_STEPS
                + cdiv(self.dim, LANES) * cdiv(br, MAX_REPEAT))

    def chain(self, br: int) -> int:
        """Dependent vector instructions of a block of br rows (RMSNorm, ops-nn rms_norm.h / rms_norm_merge_n.h): the
        block's cast to fp32, then per row x^2, the halving Adds (a tail Add when dim is not a power of two),
        WholeReduceSum, the scalar's read of the sum, the scale by rstd, gamma and the cast out."""
        if self.op != "rmsnorm":
            return 1
        pow2 = 1 << (self.dim.bit_length() - 1)
        halvings = (pow2 != self.dim) + max(0, (pow2 // 64).bit_length() - 1)
        return (self.dtype != "fp32") * self.arrays + self.residual + br * (halvings + 6)

    def rows_at(self, name: str, br: int) -> Ref:
        return Ref(name, (lin(("blk", br)), 0), (br, self.dim), (self.rows, self.dim))

    @stage
    def copy_in(self, v: Code, inq: Queue, br: int) -> None:
        """MTE2: the block's rows (and its residual rows) into UB as fp32."""
        v.alloc(inq)
        for name, op in (("x", "load"), ("r", "load_r"))[:self.arrays]:
            v.op("mte2", op, Act("load", Ref(f"ub.{name}", (0, 0), (br, self.dim)),
                                             (self.rows_at(name, br),), "fp32"),
                 bytes=nbytes(self.dtype, br, self.dim), dtype=self.dtype, src="gm", dst="ub")
        v.enque(inq)

    @stage
    def compute(self, v: Code, inq: Queue, outq: Queue, br: int, merged: bool = False) -> None:
        """Vector: (the residual added, then) the row op over the block, the parameters read in place; `merged`:
        every step over the whole block (see the module)."""
        v.deque(inq)
        v.alloc(outq)
        src = Ref("ub.x", (0, 0), (br, self.dim))
        if self.residual:
            src = Ref("ub.s", (0, 0), (br, self.dim))
            v.op("vector", "add", Act("add", src, (Ref("ub.x", (0, 0), (br, self.dim)),
                                                   Ref("ub.r", (0, 0), (br, self.dim))), self.dtype),
                 flops=1.0 * br * self.dim, bytes=4.0 * self.dim * br, dtype="fp32", src="ub", dst="ub")
        math = MATH.get(self.op, self.op)
        v.op("vector", math, Act(math, Ref("ub.y", (0, 0), (br, self.dim)),
                                    (src, Ref("p", (0, 0), (-1, -1))), self.dtype),
             flops=ROW_OPS[self.op] * br * self.dim, bytes=4.0 * self.dim * br, dtype="fp32", src="ub", dst="ub",
             issues=self.merged_chain(br) if merged else self.chain(br))
        v.free(inq)
        v.enque(outq)

    @stage
    def copy_out(self, v: Code, outq: Queue, br: int) -> None:
        """MTE3: the block's results (and the sums, the next residual) to GM."""
        v.deque(outq)
        for name, ub, op in (("y", "ub.y", "store"), ("s", "ub.s", "store_s"))[:self.arrays]:
            v.op("mte3", op, Act("store", self.rows_at(name, br), (Ref(ub, (0, 0), (br, self.dim)),),
                                              self.dtype),
                 bytes=nbytes(self.dtype, br, self.dim), dtype=self.dtype, src="ub", dst="gm")
        v.free(outq)

    def build(self, chip: Chip) -> Trace:
        if self.op not in ROW_OPS:
            raise NpusimError(f"unknown row op '{self.op}'; allowed: {', '.join(ROW_OPS)}", field="op")
        br = self.block(chip)
        prog = TileProgram(self.name, chip, self.buffering)
        slot = {"ub": self.slot(br)}
        inq = prog.queue("ub", (AIV, "mte2"), (AIV, "vector"), depth=2, slot=slot)
        outq = prog.queue("out", (AIV, "vector"), (AIV, "mte3"), depth=2, slot=slot)
        if self.residual:
            prog.reserve("ub", 4.0 * self.dim * br)
        v = prog.code(AIV)
        self.copy_in(v, inq, br)
        merged = self.op == "head_rmsnorm"
        self.compute(v, inq, outq, br, merged)
        self.copy_out(v, outq, br)
        blocks = cdiv(self.rows, br)
        groups = prog.groups([Band(blocks, None, (v.body(),))], chip.aiv.count)
        return Trace(self.name, chip.name, self.shape, groups, 0.0, self.work().hbm_bytes, prog.buffers(),
                     {"op": self.op, "block_rows": br, "blocks": blocks} | ({"residual": 1} if self.residual else {})

                     | prog.tiling(), dtype=self.dtype)
