"""W8A8 quant matmul as a MIX kernel: INT8 A [m, k] (per-token scales) x INT8 B [k, n] (per-channel scales) ->
bf16 D, the int32 product dequantised on the vector cores (catlass `QuantMatmulMultiStageWorkspace`,
examples/12_quant_matmul; the multi-core split-K form of examples/52_quant_multi_core_splitk_matmul_tla).

Model
-----
* Streaming form (`k_split` 1, catlass 12): per output block the AIC runs the GEMM block body (npusim.kernels.gemm
  `CubeBlock`: K through L1 and L0, int32 in L0C) and FIXPIPE writes the int32 block into one of `workspace`
  (2) GM workspace slots of its core; the slot is handed to both AIVs (CrossCoreSetFlag mode 2). Each AIV takes
  every other epilogue tile of `epilogue_rows` x base_n (catlass EpilogueTileShape 32 x 256,
  EpilogueHorizontalTileSwizzle) and per tile: MTE2 loads the int32 tile (from L2: just written), the per-channel
  scales of its columns and the per-token scales of its rows; the vector unit casts to fp32, multiplies by the
  column scales and by the row scales (broadcast over one 32 B block per row) and casts to bf16; MTE3 stores it.
  UB in and out are double-buffered. The AIV gives the slot back after its last store (catlass sets
  flagAivFinishCompute after the whole block epilogue), so block b+1's GEMM overlaps block b's dequant.
* Split-K form (`k_split` > 1, catlass 52, "Plan B"): blocks x K slices over the AICs, each slice's int32 partial
  to GM; a barrier; all AIVs sum the slices (ReduceAdd, in chunks of UB); a barrier; the dequant epilogue per block
  as above, reading the reduced int32. `k_split` -1 takes catlass's GetSplitkFactor: AIC count // blocks, at most
  the L1 K tiles.

The default tiling is the chip tiler's (npusim.kernels.gemm `CubeTiling.choose` on the INT8 cube); catlass's fixed
L1 128 x 256 x 512, L0 128 x 256 x 128 with one L0C stage are `base_m=128 base_n=256 base_k=128 step_k=4
l0c_depth=1`, what the kernel-validation rows of the measured kernels pass.

Limits: A RowMajor and B ColumnMajor (both K-contiguous) are not distinguished from other layouts; edge blocks cost
full blocks in the engine (the functional path clips them); the kernel's scalar set-up is not an instruction.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from npusim.errors import NpusimError
from npusim.kernels.base import Allowed, Band, Kernel, Work, cdiv, nbytes, register
from npusim.kernels.gemm import SCHEMES, CubeBlock, CubeTiling, GemmShape, cube_queues
from npusim.kernels.program import AIC, AIV, AIVS, Code, Queue, TileProgram, stage
from npusim.kernels.tile import Act, Lin, Ref, lin
from npusim.kernels.trace import Trace
from npusim.spec.chip import Chip

# INT8 operands accumulated in int32 and written out as they are: the dequant is the AIVs' (no FIXPIPE scales)
INT8_RAW = dataclasses.replace(SCHEMES["int8"], scale="", fixpipe_dequant=False)
EPILOGUE_COLS = 256  # columns of an epilogue tile (catlass EpilogueTileShape::COLUMN)
BRCB_BYTES = 32  # a per-token scale broadcast over one 32 B block per row (catlass TileBroadcastOneBlk)


@dataclass(frozen=True)
class Tile:
    """An epilogue tile on one AIV: rows x cols of the block (catlass EpilogueTileShape 32 x 256)."""

    rows: int
    cols: int


@dataclass(frozen=True)
class EpilogueQueues:
    """The AIVs' side: the int32 block handed through GM (streaming form) and each AIV's UB in / out tiles."""

    ws: Queue | None
    inq: Queue
    outq: Queue


@register
@dataclass(frozen=True)
class QuantMatmul(Kernel):
    """D[m, n] = (A_int8 @ B_int8) * per-token scale[m] * per-channel scale[n] -> out_dtype."""

    name: ClassVar[str] = "quant_matmul"
    options: ClassVar[tuple[str, ...]] = ("out_dtype", "base_m", "base_n", "base_k", "step_k", "l0c_depth",
                                          "k_split", "epilogue_rows", "workspace", "buffering")
    limits: ClassVar[dict[str, Allowed]] = {"k_split": Allowed(low=-1)}
    m: int
    n: int
    k: int
    out_dtype: str = "bf16"
    base_m: int = 0
    base_n: int = 0
    base_k: int = 0
    step_k: int = 0
    l0c_depth: int = 0
    k_split: int = 1  # K slices over the AICs (catlass 52); -1 = catlass's GetSplitkFactor
    epilogue_rows: int = 32  # rows of an epilogue tile (catlass EpilogueTileShape::ROW)
    workspace: int = 2  # GM workspace slots per core (catlass WORKSPACE_STAGES)
    buffering: int = 0  # depth of the double-buffered queues (0 = 2, as written)

    @property
    def problem(self) -> GemmShape:
        return GemmShape(self.m, self.n, self.k, 1, INT8_RAW, "int32")

    def tiling(self, chip: Chip) -> CubeTiling:
        return CubeTiling.choose(chip, self.problem, self.base_m, self.base_n, self.base_k, self.step_k,
                                 self.l0c_depth)

    def candidates(self, chip: Chip) -> tuple[Kernel, ...]:
        return tuple(dataclasses.replace(self, **t.explicit()) for t in CubeTiling.ranked(
            chip, self.problem, self.base_m, self.base_n, self.base_k, self.step_k, self.l0c_depth))

    def splits(self, chip: Chip, t: CubeTiling) -> int:
        ktiles = cdiv(self.k, t.k_l1)
        if self.k_split == -1:  # catlass 52 GetSplitkFactor
            blocks = cdiv(self.m, t.base_m) * cdiv(self.n, t.base_n)
            return max(1, min(chip.aic.count // blocks if chip.aic.count // blocks else 2, ktiles))
        if self.k_split < 1:
            raise NpusimError(f"quant_matmul k_split={self.k_split}: 1 (no split), a slice count, or -1 (catlass's)",
                              field="shape.k_split")
        return min(self.k_split, ktiles)

    def work(self) -> Work:
        io = nbytes("int8", self.m, self.k) + nbytes("int8", self.k, self.n) + nbytes(self.out_dtype, self.m, self.n)
        io += 4.0 * (self.m + self.n)
        return Work(2.0 * self.m * self.n * self.k, io, vector_flops=4.0 * self.m * self.n, cube_dtype="int8")

    # ------------------------------------------------------------------------------------------------ trace
    def build(self, chip: Chip) -> Trace:
        t = self.tiling(chip)
        ks = self.splits(chip, t)
        prog = TileProgram(self.name, chip, self.buffering)
        tile = self.epilogue_tile(chip, t)
        eq = EpilogueQueues(
            prog.queue("ws", (AIC, "fixpipe"), (AIV, "mte2"), depth=self.workspace, fixed=self.workspace != 2)
            if ks == 1 else None,
            prog.queue("in", (AIV, "mte2"), (AIV, "vector"), depth=2, slot={"ub": self.in_bytes(tile)}),
            prog.queue("out", (AIV, "vector"), (AIV, "mte3"), depth=2,
                       slot={"ub": nbytes(self.out_dtype, tile.rows, tile.cols)}))
        prog.reserve("ub", self.scratch_bytes(tile))
        bands = self.streaming(prog, t, eq, tile) if ks == 1 else self.split_k(prog, chip, t, eq, tile, ks)
        w = self.work()
        tm, tn = cdiv(self.m, t.base_m), cdiv(self.n, t.base_n)
        tiling = {"blocks": tm * tn, "k_split": ks, "epilogue_tile": (tile.rows, tile.cols),
                  "workspace": self.workspace}
        return Trace(self.name, chip.name, self.shape, prog.groups(bands, chip.aic.count), w.cube_flops, w.hbm_bytes,
                     prog.buffers(), t.describe() | tiling | prog.tiling(), dtype="int8")

    def epilogue_tile(self, chip: Chip, t: CubeTiling) -> Tile:
        """`epilogue_rows` (at most the block's rows, 16-aligned) x 256 columns, the rows halved until the
        double-buffered tiles and the compute tensors fit UB (an fp32 output needs twice the out buffers)."""
        rows = min(self.epilogue_rows, 16 * cdiv(min(self.m, t.base_m), 16))
        tile = Tile(rows, min(t.base_n, EPILOGUE_COLS))
        while tile.rows > 8 and self.ub_bytes(tile) > chip.aiv.buffers.ub:
            tile = Tile(tile.rows // 2, tile.cols)
        return tile

    def ub_bytes(self, tile: Tile) -> float:
        return 2 * (self.in_bytes(tile) + nbytes(self.out_dtype, tile.rows, tile.cols)) + self.scratch_bytes(tile)

    def in_bytes(self, tile: Tile) -> float:
        """One UB input buffer: the int32 tile, its columns' and rows' scales."""
        return 4.0 * tile.rows * tile.cols + 4.0 * tile.cols + 4.0 * tile.rows

    def scratch_bytes(self, tile: Tile) -> float:
        """The fp32 tile, its product and the broadcast row scales (catlass's single-buffered compute tensors)."""
        return 2 * 4.0 * tile.rows * tile.cols + BRCB_BYTES * tile.rows

    def refs(self, t: CubeTiling, rows: Lin | int, cols: Lin | int) -> tuple[Ref, Ref]:
        """The A and B refs of a block at K 0 (3-d, batch 1)."""
        a = Ref("a", (0, rows, 0), (1, t.base_m, 0), (None, self.m, self.k))
        b = Ref("b", (0, 0, cols), (1, 0, t.base_n), (None, self.k, self.n))
        return a, b

    def cube(self, prog: TileProgram, chip: Chip, t: CubeTiling, k: int, out: Ref, handoff: Queue | None,
             **head: Lin) -> Code:
        """The AIC's block: the GEMM block body of npusim.kernels.gemm, int32 out to GM (kept in L2)."""
        if "l1" not in prog.queues:
            cube_queues(prog, t, self.problem)
        c = prog.code(AIC)
        c.addr(**head)
        a, b = self.refs(t, lin(("mi", t.base_m)), lin(("ni", t.base_n)))
        if "k0" in head:
            a = dataclasses.replace(a, start=(0, a.start[1], lin(("k0", 1))))
            b = dataclasses.replace(b, start=(0, lin(("k0", 1)), b.start[2]))
        hits = t.l2_hits(chip, self.problem)
        CubeBlock(t, INT8_RAW, k, a, b, out, "int32", hits, tuple(prog.queues[q] for q in ("l1", "l0", "l0c")),
                  handoff=handoff, out_hit=1.0, strides=(self.k, self.k)).write(c)
        return c

    def streaming(self, prog: TileProgram, t: CubeTiling, eq: EpilogueQueues, tile: Tile) -> list[Band]:
        tm, tn = cdiv(self.m, t.base_m), cdiv(self.n, t.base_n)
        head = self.block_head(t, tm, tn)
        slot = lin(("w", 1), mod=eq.ws.depth)  # the core's blocks take the workspace slots in turn
        ws = Ref("ws.c", (slot, 0, 0), (1, t.base_m, t.base_n))
        aic = self.cube(prog, prog.chip, t, self.k, ws, eq.ws, **head)
        aiv = []
        for a in range(AIVS):
            v = prog.code(AIV, a)
            v.addr(**head)
            self.epilogue(v, t, eq, tile, a, lambda r, c: Ref("ws.c", (slot, r, c), (1, tile.rows, tile.cols)))
            aiv.append(v.body())
        return [Band(tm * tn, aic.body(), tuple(aiv))]

    def block_head(self, t: CubeTiling, tm: int, tn: int) -> dict[str, Lin]:
        if t.by_row:
            return dict(mi=lin(("blk", 1), div=tn, mod=tm), ni=lin(("blk", 1), mod=tn))
        return dict(mi=lin(("blk", 1), mod=tm), ni=lin(("blk", 1), div=tm, mod=tn))

    def split_k(self, prog: TileProgram, chip: Chip, t: CubeTiling, eq: EpilogueQueues, tile: Tile,
                ks: int) -> list[Band]:
        """catlass 52: (block, K slice) over the AICs, partials to GM; barrier; ReduceAdd on all AIVs; barrier;
        the dequant epilogue per block."""
        tm, tn = cdiv(self.m, t.base_m), cdiv(self.n, t.base_n)
        kr = t.k_l1 * cdiv(cdiv(self.k, ks), t.k_l1)  # K per slice, whole L1 tiles
        ks = cdiv(self.k, kr)
        part = Ref("gm.part", (lin(("ks", 1)), lin(("mi", t.base_m)), lin(("ni", t.base_n))),
                   (1, t.base_m, t.base_n), (None, self.m, self.n))
        bands = []
        last = self.k - (ks - 1) * kr  # the last slice may be shorter: a band of its own
        for slices, first, depth in ((ks - 1, 0, kr), (1, ks - 1, last)) if last != kr else ((ks, 0, kr),):
            if slices:
                head = dict(ks=lin(("blk", 1), mod=slices, base=first) if slices > 1 else Lin(first),
                            **self.sliced_head(t, tm, tn, slices))
                head["k0"] = lin(("ks", kr))
                bands.append(Band(tm * tn * slices, self.cube(prog, chip, t, depth, part, None, **head).body(),
                                  ((),) * AIVS))
        bands += [barrier(prog, chip), self.reduce_band(prog, chip, ks), barrier(prog, chip)]
        bhead = self.block_head(t, tm, tn)
        aiv = []
        for a in range(AIVS):
            v = prog.code(AIV, a)
            v.addr(**bhead)
            self.epilogue(v, t, eq, tile, a, lambda r, c: Ref(
                "gm.red", (0, Lin(r, (("mi", t.base_m),)), Lin(c, (("ni", t.base_n),))), (1, tile.rows, tile.cols),
                (None, self.m, self.n)))
            aiv.append(v.body())
        bands.append(Band(tm * tn, None, tuple(aiv)))
        return bands

    def sliced_head(self, t: CubeTiling, tm: int, tn: int, ks: int) -> dict[str, Lin]:
        """Block coordinates when consecutive blocks are the K slices of one output block."""
        if t.by_row:
            return dict(mi=lin(("blk", 1), div=tn * ks, mod=tm), ni=lin(("blk", 1), div=ks, mod=tn))
        return dict(mi=lin(("blk", 1), div=ks, mod=tm), ni=lin(("blk", 1), div=tm * ks, mod=tn))

    def reduce_band(self, prog: TileProgram, chip: Chip, ks: int) -> Band:
        """ReduceAdd: the K slices of the m x n int32 result summed by all AIVs, `rr` rows each, in chunks of
        `cr` rows double-buffered in the UB the epilogue uses later (catlass splits the flat elements; rows here,
        so fewer rows than AIVs leave some idle)."""
        rr = cdiv(self.m, AIVS * chip.aic.count)
        per_row = 4.0 * (ks + 1) * self.n
        cr = max(1, min(rr, int(chip.aiv.buffers.ub // (2 * per_row))))
        if 2 * per_row * cr > chip.aiv.buffers.ub:
            raise NpusimError(f"quant_matmul: a ReduceAdd row of {ks} K slices x n={self.n} int32 does not "
                              f"double-buffer in the {chip.aiv.buffers.ub / 1024:g} KiB UB of {chip.name}",
                              field="shape.k_split")
        rq = (prog.queue("rin", (AIV, "mte2"), (AIV, "vector"), depth=2),
              prog.queue("rout", (AIV, "vector"), (AIV, "mte3"), depth=2))
        bodies = []
        for a in range(AIVS):
            v = prog.code(AIV, a)
            r0 = lin(("blk", AIVS * rr), base=a * rr)
            for j in range(cdiv(rr, cr)):
                self.reduce_chunk(v, rq, ks, Lin(r0.base + j * cr, r0.terms), cr)
            bodies.append(v.body())
        return Band(cdiv(self.m, AIVS * rr), None, tuple(bodies))

    @stage
    def reduce_chunk(self, v: Code, rq: tuple[Queue, Queue], ks: int, r0: Lin, rows: int) -> None:
        """One pass: `rows` rows of every K slice in, summed, out."""
        n, stop, (rin, rout) = self.n, (None, self.m, self.n), rq
        v.alloc(rin)
        v.op("mte2", "load_parts", Act("load", Ref("ub.parts", (0, 0, 0), (ks, rows, n)),
                                       (Ref("gm.part", (0, r0, 0), (ks, rows, n), stop),), "int32"),
             bytes=4.0 * ks * rows * n, dtype="int32", src="gm", dst="ub", hit=1.0)
        v.enque(rin)
        v.deque(rin)
        v.alloc(rout)
        v.op("vector", "reduce_add", Act("sum_slices", Ref("ub.red", (0, 0, 0), (1, rows, n)),
                                         (Ref("ub.parts", (0, 0, 0), (ks, rows, n)),), "int32"),
             flops=1.0 * (ks - 1) * rows * n, bytes=4.0 * ks * rows * n, dtype="int32", src="ub", dst="ub")
        v.free(rin)
        v.enque(rout)
        v.deque(rout)
        v.op("mte3", "store_red", Act("store", Ref("gm.red", (0, r0, 0), (1, rows, n), stop),
                                      (Ref("ub.red", (0, 0, 0), (1, rows, n)),), "int32"),
             bytes=4.0 * rows * n, dtype="int32", src="ub", dst="gm", hit=1.0)
        v.free(rout)

    # ------------------------------------------------------------------------------------------------ epilogue
    def epilogue(self, v: Code, t: CubeTiling, eq: EpilogueQueues, tile: Tile, a: int, source) -> None:
        """AIV a's tiles of the block (every other one in row-major tile order, catlass's sub-block loop over
        EpilogueHorizontalTileSwizzle), the workspace slot taken before the first and given back after the last
        store. `source(r, c)`: the int32 tile at row r, column c of the block."""
        rows, cols = min(t.base_m, self.m), min(t.base_n, self.n)
        per_row = cdiv(cols, tile.cols)
        mine = [(r * tile.rows, c * tile.cols) for r in range(cdiv(rows, tile.rows)) for c in range(per_row)][a::AIVS]
        if eq.ws:
            v.deque(eq.ws)
        if not mine:  # an AIV with no tile in this block still hands the slot back
            v.op("mte2", "skip_block")
        for r, c in mine:
            self.copy_in(v, t, eq, tile, r, c, source(r, c))
            self.dequant(v, eq, tile)
            self.copy_out(v, t, eq, tile, r, c)
        if eq.ws:
            v.free(eq.ws)

    @stage
    def copy_in(self, v: Code, t: CubeTiling, eq: EpilogueQueues, tile: Tile, r: int, c: int, ct: Ref) -> None:
        """The int32 tile, its columns' per-channel and its rows' per-token scales into UB."""
        er, ec, tm = tile.rows, tile.cols, cdiv(self.m, t.base_m)
        v.alloc(eq.inq)
        v.op("mte2", "load_c", Act("load", Ref("ub.c", (0, 0, 0), (1, er, ec)), (ct,), "int32"),
             bytes=4.0 * er * ec, dtype="int32", src="gm", dst="ub", hit=1.0)
        v.op("mte2", "load_scale", Act("load", Ref("ub.sb", (0, 0, 0), (1, 1, ec)),
                                       (Ref("sb", (0, 0, Lin(c, (("ni", t.base_n),))), (1, 1, ec),
                                            (None, None, self.n)),), "fp32"),
             bytes=4.0 * ec, dtype="fp32", src="gm", dst="ub", hit=1.0 - 1.0 / tm)
        v.op("mte2", "load_token_scale", Act("load", Ref("ub.sa", (0, 0, 0), (1, er, 1)),
                                             (Ref("sa", (0, Lin(r, (("mi", t.base_m),)), 0), (1, er, 1),
                                                  (None, self.m, None)),), "fp32"),
             bytes=4.0 * er, dtype="fp32", src="gm", dst="ub")
        v.enque(eq.inq)

    @stage
    def dequant(self, v: Code, eq: EpilogueQueues, tile: Tile) -> None:
        """Cast to fp32 (the input buffer is free after it), times the column scales, times the row scales
        (broadcast to one block per row first), cast to the output dtype."""
        er, ec = tile.rows, tile.cols
        n, shape = er * ec, (1, er, ec)
        f, p = Ref("ub.f", (0, 0, 0), shape), Ref("ub.p", (0, 0, 0), shape)
        v.deque(eq.inq)
        v.op("vector", "cast_fp32", Act("copy", f, (Ref("ub.c", (0, 0, 0), shape),), "fp32"), flops=n,
             bytes=4.0 * n, dtype="fp32", src="ub", dst="ub")
        v.op("vector", "mul_channel", Act("mul", p, (f, Ref("ub.sb", (0, 0, 0), (1, 1, ec))), "fp32"),
             flops=n, bytes=4.0 * n, dtype="fp32", src="ub", dst="ub")
        v.op("vector", "brcb_token", Act("copy", Ref("ub.st", (0, 0, 0), (1, er, 1)),
                                         (Ref("ub.sa", (0, 0, 0), (1, er, 1)),), "fp32"),
             bytes=1.0 * BRCB_BYTES * er, dtype="fp32", src="ub", dst="ub")
        v.free(eq.inq)
        v.alloc(eq.outq)
        v.op("vector", "mul_token", Act("mul", f, (p, Ref("ub.st", (0, 0, 0), (1, er, 1))), "fp32"),
             flops=n, bytes=4.0 * n, dtype="fp32", src="ub", dst="ub")
        v.op("vector", "cast_out", Act("copy", Ref("ub.d", (0, 0, 0), shape), (f,), self.out_dtype), flops=n,
             bytes=4.0 * n, dtype="fp32", src="ub", dst="ub")
        v.enque(eq.outq)

    @stage
    def copy_out(self, v: Code, t: CubeTiling, eq: EpilogueQueues, tile: Tile, r: int, c: int) -> None:
        er, ec = tile.rows, tile.cols
        out = Ref("c", (0, Lin(r, (("mi", t.base_m),)), Lin(c, (("ni", t.base_n),))), (1, er, ec),
                  (None, self.m, self.n))
        v.deque(eq.outq)
        v.op("mte3", "store_d", Act("store", out, (Ref("ub.d", (0, 0, 0), (1, er, ec)),), self.out_dtype),
             bytes=nbytes(self.out_dtype, er, ec), dtype=self.out_dtype, src="ub", dst="gm")
        v.free(eq.outq)


def barrier(prog: TileProgram, chip: Chip) -> Band:
    """The all-core barrier between phases (catlass CrossCoreBarrier over the vector cores): one block on every AI
    core, so every AIV passes the same barriers in the same order whatever work the phases give it."""
    bodies = []
    for a in range(AIVS):
        v = prog.code(AIV, a)
        v.sync_all()
        bodies.append(v.body())
    return Band(chip.aic.count, None, tuple(bodies))
