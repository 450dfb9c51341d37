"""Vector-core kernels that stream token tiles through UB: mHC post, RoPE, quantise / dequantise, SwiGLU and W8A8's
fused dequant-SwiGLU-quant, MoE combine, the MoE routing permutations, the embedding gather and the cache-row scatter.

One mechanism (`Tiled`): the op's GM operands are cut into tiles of `bt` tokens x `bc` columns of the op's wide axis
(hidden, or a row's elements); the tokens are split evenly over the AIVs as CANN's vector ops split rows over their
block dim (former / tail cores: ceil(T / cores) each), a core's share cut into the fewest equal tiles that fit UB.
MTE2 brings a tile's inputs into UB, a short list of vector steps computes in fp32, MTE3 writes the outputs; inputs
and outputs are double-buffered so the DMA of one tile hides behind the vector work of the other. Operands that are
small per token (mixing weights, scales, rotary tables) come whole with each tile. A kernel says only its operands,
its steps and their FLOPs per token. An output in an element format the chip's vector unit cannot convert to (fp8 /
fp4 on dav-c220: its scalar pipe has a `ub>ub:<format>` route) passes through a `convert` stage on the scalar pipe,
element by element, between the vector steps and the store (kernels.md K196: 97.6 % scalar).

When the tokens are few (decode) the wide axis is split as well so every vector core has work, but no tile moves
less than 4 KB and column tiles stay 512 B aligned (HcPost tiling, models.md §2.5 [CRI deepseek_v4_mHC_guide.md]).

Written on the tile-program layer (npusim.kernels.program): a tile's inputs share one UB buffer of the in queue
(MTE2 -> vector) and its outputs one of the out queue (vector -> MTE3), the step results resident beside them; the
stages copy_in / compute / copy_out are Ascend C's CopyIn / Compute / CopyOut, and a plan's `buffering` is the depth
of both queues.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import ClassVar

from npusim.errors import NpusimError
from npusim.kernels.base import Allowed, Band, Kernel, Work, cdiv, even_tiles, nbytes, register
from npusim.kernels.program import AIV, Code, Queue, TileProgram, stage
from npusim.kernels.tile import Act, Lin, Ref, lin
from npusim.kernels.trace import Trace
from npusim.spec.chip import Chip

MIN_TILE_BYTES = 4096  # least data a tile moves when the wide axis is split (HcPost tiling, models.md §2.5 [CRI])
COL_ALIGN_BYTES = 512  # column tiles 512 B aligned (same source)
MIN_COL_BYTES = 1024  # and at least 1 KB of a row (same source)
# DequantSwigluQuant when a row does not fit UB: UB bytes per column of a pass (11 fp32 buffers + the int8 output)
# and the chunk alignment, 512 B of fp32 (ops-nn quant/dequant_swiglu_quant/op_host/dequant_swiglu_quant_tiling_base.cpp
# DYNAMIC_BF16_TBUF_NUM_HALF, PACK_UINT_IN_CACHE_512B)
WIDE_UB_BYTES_PER_COL, WIDE_ALIGN = 45, 128
COPY_DTYPES = ("bf16", "fp16", "fp32", "int8", "int32")  # what the copy kernel moves and casts between
FORMATS = {"fp8e4m3": 1.0, "fp8e5m2": 1.0, "fp4e2m1": 0.5, "e8m0": 1.0}  # element formats beside the chip's dtypes
EXACT = {"e8m0": ""}  # power-of-two scales are stored exactly (no rounding step)
HALF = ("bf16", "fp16")  # 16-bit floats the vector steps take to fp32 and back (Cast)


def rnd_as(dtype: str) -> str:
    """The functional rounding of a stored dtype."""
    return EXACT.get(dtype, {"fp8": "fp8e4m3", "mxfp8": "fp8e4m3", "mxfp4": "fp4e2m1"}.get(dtype, dtype))


def mem(dtype: str, *dims: float) -> float:
    """Bytes of an array stored in `dtype` (chip dtypes, or an element format such as fp4e2m1)."""
    return FORMATS[dtype] * math.prod(dims) if dtype in FORMATS else nbytes(dtype, *dims)


@dataclass(frozen=True)
class Operand:
    """A GM array (or UB buffer) per tile: `per` rows per token, `cols` columns. `split`: its columns follow the
    column tile (else the whole row comes with each tile); `offset`: first column (two operands in one array);
    `gather`: the rows are picked (an input) or placed (an output: a scatter) by an index array [1, tokens*per]
    instead of read or written in order."""

    name: str
    per: int
    cols: int
    dtype: str
    split: bool = True
    offset: int = 0
    gather: str = ""
    array: str = ""  # GM array when it differs from `name` (two operands cut from one array)

    @property
    def gm(self) -> str:
        return self.array or self.name


@dataclass(frozen=True)
class Step:
    """One vector instruction on the tile: out = op(*ins, **args) (functional meaning in npusim.functional)."""

    op: str
    out: Operand
    ins: tuple[str, ...]
    flops: float  # per token over the full wide axis (scaled by the column tile's share)
    args: tuple[tuple[str, object], ...] = ()
    chain: int = 0  # dependent instructions per token row, each behind a PipeBarrier (0: one over the whole tile)


@dataclass(frozen=True)
class Tile:
    """The tile of a launch: `bt` tokens x `bc` columns of the wide axis `W` of `T` tokens; 'tt' / 'ct' are the
    block's token and column offsets."""

    bt: int
    bc: int
    T: int
    W: int

    def cols(self, o: Operand) -> int:
        return self.bc if o.split else o.cols

    def ub(self, o: Operand) -> Ref:
        return Ref(f"ub.{o.name}", (0, 0), (self.bt * o.per, self.cols(o)))

    def gm(self, o: Operand) -> Ref:
        col = lin(("ct", self.bc), base=o.offset) if o.split else o.offset
        return Ref(o.gm, (lin(("tt", self.bt * o.per)), col), (self.bt * o.per, self.cols(o)),
                   (self.T * o.per, (self.W if o.split else o.cols) + o.offset))

    def index(self, o: Operand) -> Ref:
        """The tile's rows of the index array of a gathered (or scattered) operand."""
        rows = self.bt * o.per
        return Ref(o.gather, (0, lin(("tt", rows))), (1, rows), (1, self.T * o.per))

    def table(self, o: Operand) -> Ref:
        """The column tile of the whole gathered table (or scattered cache)."""
        return Ref(o.gm, (0, lin(("ct", self.bc))), (-1, self.bc))


@dataclass(frozen=True)
class Queues:
    """A tile's UB buffers: its inputs (MTE2 -> vector) and its outputs (vector -> MTE3, through the scalar pipe
    when it converts some of them: `soft`)."""

    inq: Queue
    outq: Queue
    soft: tuple[str, ...] = ()  # outputs whose element format the scalar pipe converts in software


@dataclass(frozen=True)
class Tiled(Kernel):
    """Shared mechanism; subclasses give `tokens`, `wide` (the split axis length), inputs, outputs, steps."""

    options: ClassVar[tuple[str, ...]] = ("buffering", "tile_tokens", "tile_cols")
    buffering: int = field(default=0, kw_only=True)  # depth of the in / out queues (0 = 2, as written)
    tile_tokens: int = field(default=0, kw_only=True)  # tokens per tile (0 = the tiler's: the fewest tiles that fit)
    tile_cols: int = field(default=0, kw_only=True)  # a token's columns per tile (0 = the tiler's; one token a tile)

    def inputs(self) -> tuple[Operand, ...]:
        raise NotImplementedError

    def outputs(self) -> tuple[Operand, ...]:
        raise NotImplementedError

    def steps(self) -> tuple[Step, ...]:
        raise NotImplementedError

    @property
    def wide(self) -> int:
        raise NotImplementedError

    def work(self) -> Work:
        io = sum(mem(o.dtype, self.tokens * o.per, o.cols) for o in self.inputs() + self.outputs())
        return Work(0.0, io, vector_flops=self.tokens * sum(s.flops for s in self.steps()))

    def soft(self, chip: Chip) -> tuple[str, ...]:
        """Outputs in an element format the chip's vector unit cannot convert to: the scalar pipe converts them
        element by element at its `ub>ub:<format>` route (fp8 / fp4 on dav-c220, which has no such cast)."""
        routes = chip.aiv.pipes["scalar"].routes
        return tuple(o.name for o in self.outputs() if f"ub>ub:{o.dtype}" in routes)

    # ------------------------------------------------------------------ tiling
    def _io(self, operands: tuple[Operand, ...], bt: int, bc: int) -> float:
        return sum(mem(o.dtype, bt * o.per, bc if o.split else o.cols) for o in operands)

    def _work_bytes(self, bt: int, bc: int) -> float:
        """UB of the step results (fp32), resident beside the queues."""
        return sum(4.0 * bt * s.out.per * (bc if s.out.split else s.out.cols) for s in self.steps())

    def _bytes(self, bt: int, bc: int) -> tuple[float, float]:
        """(DMA bytes, UB bytes) of one tile: inputs and outputs double-buffered, step results in fp32."""
        io = self._io(self.inputs() + self.outputs(), bt, bc)
        return io, 2 * io + self._work_bytes(bt, bc)

    def fewest(self, chip: Chip) -> tuple[int, int]:
        """(a core's share of the tokens, the fewest equal tiles it cuts into that fit UB with whole rows; 0 when
        not even one token's whole row fits)."""
        ub, W = chip.aiv.buffers.ub, self.wide
        share = cdiv(self.tokens, chip.aiv.count)
        fit = min(share, int(ub // self._bytes(1, W)[1]))
        while fit and self._bytes(fit, W)[1] > ub:
            fit -= 1
        return share, cdiv(share, fit) if fit else 0

    def candidates(self, chip: Chip) -> tuple[Kernel, ...]:
        """With whole rows per tile, the tokens per tile of a core's share cut into n equal tiles for n on the fixed
        ladder of `even_tiles` (the fewest that fit first); where one token a tile is all that fits, or the tokens
        are fewer than the cores, also each column tile of `columns` (a half UB would have split the row)."""
        if self.tile_tokens or self.tile_cols:
            return (self,)
        share, fewest = self.fewest(chip)
        cols = [c for c in self.columns(chip) if c < self.wide]
        if self.tokens >= chip.aiv.count and fewest:
            rows = tuple(replace(self, tile_tokens=bt) for bt in even_tiles(share, fewest, self._bytes(1, self.wide)[0]))
            return rows + (tuple(replace(self, tile_cols=c) for c in cols) if fewest == share else ())
        return tuple(replace(self, tile_cols=c) for c in self.columns(chip)) or (self,)

    def columns(self, chip: Chip) -> list[int]:
        """A token's column tiles the tiler considers, its own first: from an aligned start (at least 1 KB of a row
        and 4 KB moved per tile, the row shared by the cores when the tokens are few) halved down to the 512 B
        alignment, those that fit UB. The start does not depend on UB, so a larger UB's list holds a smaller one's."""
        ub, cores, W = chip.aiv.buffers.ub, chip.aiv.count, self.wide
        split = [mem(o.dtype, 1) for o in self.inputs() + self.outputs() if o.split]
        if not split:
            return []
        elem = max(split)
        align = max(1, int(COL_ALIGN_BYTES // elem))
        bc = align * cdiv(cdiv(W, max(1, cores // self.tokens)), align)
        bc = max(bc, align * cdiv(int(MIN_COL_BYTES // elem), align))
        while self._bytes(1, bc)[0] < MIN_TILE_BYTES and bc < W:
            bc += align
        out = []
        while True:
            if self._bytes(1, bc)[1] <= ub:
                out.append(min(bc, W))
            if bc <= align:
                break
            bc = max(align, bc // 2 // align * align)
        return list(dict.fromkeys(out))

    def tile(self, chip: Chip) -> tuple[int, int]:
        """Tokens split evenly over the vector cores (CANN's former / tail cores: a core takes ceil(T / cores)), a
        core's share cut into the fewest equal tiles that fit UB with whole rows (or `tile_tokens` per tile); with
        fewer tokens than vector cores, one token per tile and the wide axis split into aligned column tiles (at
        least 1 KB of a row, 4 KB moved per tile; or `tile_cols`)."""
        ub, cores, W = chip.aiv.buffers.ub, chip.aiv.count, self.wide
        for n, (bt, bc) in (("tile_tokens", (self.tile_tokens, W)), ("tile_cols", (1, self.tile_cols))):
            if bt and bc:
                if self._bytes(bt, bc)[1] > ub:
                    raise NpusimError(f"{self.name}: a tile of {bt} tokens x {bc} columns needs "
                                      f"{self._bytes(bt, bc)[1] / 1024:g} KiB of UB but {chip.name} has "
                                      f"{ub / 1024:g} KiB", field=f"tiling.{n}")
                return bt, bc
        share, fewest = self.fewest(chip)
        if self.tokens >= cores and fewest:
            return cdiv(share, fewest), W
        split = [mem(o.dtype, 1) for o in self.inputs() + self.outputs() if o.split]
        if not split:
            return 1, W  # nothing to cut along the wide axis: one token per tile
        cols = self.columns(chip)
        if not cols:
            need = self._bytes(1, min(W, max(1, int(COL_ALIGN_BYTES // max(split)))))[1]
            raise NpusimError(f"{self.name}: one token's tile needs {need / 1024:g} KiB of UB but {chip.name} has "
                              f"{ub / 1024:g} KiB", field="tiling.ub")
        return 1, cols[0]

    # ------------------------------------------------------------------ the tile's stages (one AIV)
    @stage
    def copy_in(self, v: Code, q: Queues, t: Tile) -> None:
        """MTE2: every input of the tile into one UB buffer of the in queue (gathered rows: a discrete copy of the
        tile's index row and the table's column tile)."""
        ins_ = self.inputs()
        for i, o in enumerate(ins_):
            if i == 0:
                v.alloc(q.inq)
            moved = mem(o.dtype, t.bt * o.per, t.cols(o))
            if o.gather:
                act = Act("gather", t.ub(o), (t.index(o), t.table(o)), rnd_as(o.dtype), (("fill", -1),))
                v.op("mte2", f"gather_{o.name}", act, bytes=moved + 4.0 * t.bt * o.per, dtype=o.dtype, src="gm",
                     dst="ub")
            else:
                v.op("mte2", f"load_{o.name}", Act("load", t.ub(o), (t.gm(o),), rnd_as(o.dtype)), bytes=moved,
                     dtype=o.dtype, src="gm", dst="ub")
        v.enque(q.inq)

    @stage
    def compute(self, v: Code, q: Queues, t: Tile) -> None:
        """Vector: the steps in fp32 from the in buffer to the out buffer, FLOPs scaled by the column tile. Steps that
        compute (FLOPs) take their 16-bit float inputs to fp32 and their outputs back with a vector Cast each, one
        64-lane fp32 repeat per cycle (the TileLang mhc_post's T.tile.cast of every stream in and out, CANN's
        bf16 kernels' Cast to float): timed as a pass over the fp32 elements, functionally the loads' and stores'
        roundings."""
        steps, c0 = self.steps(), lin(("ct", t.bc))
        computes = any(s.flops for s in steps)
        for i, s in enumerate(steps):
            if i == 0:
                v.deque(q.inq)
                v.alloc(q.outq)
                for o in self.inputs() if computes else ():
                    if o.dtype in HALF:
                        v.op("vector", f"cast_{o.name}", bytes=4.0 * t.bt * o.per * t.cols(o), dtype="fp32",
                             src="ub", dst="ub")
            cols = t.cols(s.out)
            act = Act(s.op, t.ub(s.out), tuple(Ref(f"ub.{n}", (0, 0), (-1, -1)) for n in s.ins), rnd_as(s.out.dtype),
                      s.args + (("tokens", t.bt), ("col0", c0)))
            v.op("vector", s.op, act, flops=s.flops * t.bt * (t.bc / t.W if s.out.split else 1.0),
                 bytes=4.0 * t.bt * s.out.per * cols, dtype="fp32", src="ub", dst="ub", issues=max(1, s.chain * t.bt))
        for o in self.outputs() if computes else ():
            if o.dtype in HALF:
                v.op("vector", f"cast_{o.name}", bytes=4.0 * t.bt * o.per * t.cols(o), dtype="fp32", src="ub",
                     dst="ub")
        v.free(q.inq)
        v.enque(q.outq, to="scalar" if q.soft else "")

    @stage
    def convert(self, v: Code, q: Queues, t: Tile) -> None:
        """Scalar: the software conversion of the `soft` outputs, element by element, in place in the out buffer
        (functionally the rounding the vector step's action already applied, so the arrays are those of a chip that
        converts on its vector unit)."""
        v.deque(q.outq, at="scalar")
        for o in self.outputs():
            if o.name in q.soft:
                v.op("scalar", f"convert_{o.name}", Act("load", t.ub(o), (t.ub(o),), rnd_as(o.dtype)),
                     bytes=mem(o.dtype, t.bt * o.per, t.cols(o)), dtype=o.dtype, src="ub", dst="ub")
        v.enque(q.outq)

    @stage
    def copy_out(self, v: Code, q: Queues, t: Tile) -> None:
        """MTE3: every output to GM (scattered rows land at their slots: functionally the column tile updated)."""
        outs = self.outputs()
        for i, o in enumerate(outs):
            if i == 0:
                v.deque(q.outq)
            act = Act("store", t.gm(o), (t.ub(o),), rnd_as(o.dtype))
            if o.gather:
                whole = t.table(o)
                act = Act("scatter", whole, (whole, t.index(o), t.ub(o)), rnd_as(o.dtype), (("fill", -1),))
            v.op("mte3", f"store_{o.name}", act, bytes=mem(o.dtype, t.bt * o.per, t.cols(o)), dtype=o.dtype,
                 src="ub", dst="gm")
        v.free(q.outq)

    # ------------------------------------------------------------------ trace
    def build(self, chip: Chip) -> Trace:
        bt, bc = self.tile(chip)
        t, ncol = Tile(bt, bc, self.tokens, self.wide), cdiv(self.wide, bc)
        prog = TileProgram(self.name, chip, self.buffering)
        soft = self.soft(chip)
        out = ((AIV, "vector"),) + (((AIV, "scalar"),) if soft else ()) + ((AIV, "mte3"),)
        q = Queues(prog.queue("in", (AIV, "mte2"), (AIV, "vector"), depth=2,
                              slot={"ub": self._io(self.inputs(), bt, bc)}),
                   prog.queue("out", *out, depth=2, slot={"ub": self._io(self.outputs(), bt, bc)}), soft)
        prog.reserve("ub", self._work_bytes(bt, bc))
        v = prog.code(AIV)
        v.addr(tt=lin(("blk", 1), div=ncol), ct=lin(("blk", 1), mod=ncol))
        self.copy_in(v, q, t)
        self.compute(v, q, t)
        if soft:
            self.convert(v, q, t)
        self.copy_out(v, q, t)
        blocks = cdiv(self.tokens, bt) * ncol
        groups = prog.groups([Band(blocks, None, (v.body(),))], chip.aiv.count)
        return Trace(self.name, chip.name, self.shape, groups, 0.0, self.work().hbm_bytes, prog.buffers(),
                     {"tile_tokens": bt, "tile_cols": bc, "tiles": blocks} | prog.tiling(), dtype="bf16")


# ------------------------------------------------------------------------------------------------------ kernels
@register
@dataclass(frozen=True)
class MhcPost(Tiled):
    """mHC post (HcPost, models.md §2.5): X'_k = post_k F(y) + sum_j res[j, k] X_j over the n streams.
    x [tokens*streams, hidden], f [tokens, hidden] (the sublayer output), post [tokens, streams],
    res [tokens, streams*streams] (H_res, row j = source stream) -> out [tokens*streams, hidden]."""

    name: ClassVar[str] = "mhc_post"
    tokens: int
    streams: int = 4
    hidden: int = 4096

    @property
    def wide(self) -> int:
        return self.hidden

    def inputs(self) -> tuple[Operand, ...]:
        n, h = self.streams, self.hidden
        return (Operand("x", n, h, "bf16"), Operand("f", 1, h, "bf16"), Operand("post", 1, n, "fp32", False),
                Operand("res", 1, n * n, "fp32", False))

    def outputs(self) -> tuple[Operand, ...]:
        return (Operand("out", self.streams, self.hidden, "bf16"),)

    def steps(self) -> tuple[Step, ...]:
        n, h = self.streams, self.hidden
        return (Step("mhc_post", self.outputs()[0], ("x", "f", "post", "res"), 2.0 * (n * n * h + n * h),
                     (("streams", n),)),)


ROPE_LAYOUTS = ("interleaved", "half")


@dataclass(frozen=True)
class HeadLines:
    """The cut of aclnnRotaryPositionEmbedding (ops-transformer posembedding/rotary_position_embedding, RotateHalf
    tiling): the lines are the tokens when a token's cos / sin row is broadcast over its heads (x [T, 1, N, D],
    cos [T, 1, 1, D]: its SBND mode), else (one token: BND mode) the heads; a core takes `s` lines per step, and in
    broadcast mode copies each head's `s` rows in and out on their own (a strided DMA per head)."""

    s: int  # lines per step
    tokens: int
    heads: int
    dim: int

    @property
    def broadcast(self) -> bool:
        return self.tokens > 1

    @property
    def rows(self) -> int:
        """Rows of x one copy moves: one head of `s` tokens, or `s` heads of the one token."""
        return self.s

    @property
    def inner(self) -> int:
        """Copies per step: every head in broadcast mode, one otherwise."""
        return self.heads if self.broadcast else 1

    def first(self, h) -> Lin:
        """First row of x (token-major heads) of head `h`'s copy in step 'tt'."""
        if self.broadcast:
            return lin(("tt", self.s * self.heads), ("h", 1)) if isinstance(h, str) else \
                lin(("tt", self.s * self.heads), base=h)
        return lin(("tt", self.s))

    @property
    def step(self) -> int:
        return self.heads if self.broadcast else 1

    def table(self, name: str) -> Ref:
        half = self.dim // 2
        if self.broadcast:
            return Ref(name, (lin(("tt", self.s)), 0), (self.s, half), (self.tokens, half))
        return Ref(name, (0, 0), (1, half))

    @property
    def table_rows(self) -> int:
        return self.s if self.broadcast else 1


@register
@dataclass(frozen=True)
class Rope(Tiled):
    """Rotary embedding of `dim` dims of `heads` vectors per token: x [tokens*heads, dim], cos / sin
    [tokens, dim/2] (the token's position) -> out. Pairs are (2i, 2i+1) interleaved (MLA) or (i, i + dim/2) half
    and half (the V3.2 indexer, models.md §1.3 [DS32-fix]).

    `head_loop=1` is the tiling of CANN's aclnnRotaryPositionEmbedding (`HeadLines`): a step's cos / sin rows come
    once, then each head's rows go MTE2 -> vector -> MTE3 on their own, so a step costs a DMA start-up per head
    however few bytes it moves (the op's flat ~19 us from 4 to 64 tokens, kernels.md K188-K192). Its interleaved
    kernel loads a token's heads at once but broadcasts cos and sin over them with a UB copy per head: the same
    chain of per-head copies, timed here as the half kernel's (estimate: same count of short copies)."""

    name: ClassVar[str] = "rope"
    options: ClassVar[tuple[str, ...]] = ("layout", "buffering", "head_loop", "tile_tokens", "tile_cols")
    tokens: int
    heads: int = 1
    dim: int = 64
    layout: str = "interleaved"
    head_loop: int = 0  # 1 = aclnnRotaryPositionEmbedding's cut (lines over cores, a copy per head)

    @property
    def wide(self) -> int:
        return self.dim

    def inputs(self) -> tuple[Operand, ...]:
        if self.layout not in ROPE_LAYOUTS or self.dim % 2:
            raise NpusimError(f"rope: layout must be one of {', '.join(ROPE_LAYOUTS)} and dim even "
                              f"(got {self.layout}, {self.dim})", field="layout")
        if self.head_loop not in (0, 1):
            raise NpusimError(f"rope: head_loop must be 0 (a token's heads in one copy) or 1 (a copy per head, "
                              f"aclnnRotaryPositionEmbedding's cut), got {self.head_loop}", field="head_loop")
        half = self.dim // 2
        return (Operand("x", self.heads, self.dim, "bf16", False), Operand("cos", 1, half, "fp32", False),
                Operand("sin", 1, half, "fp32", False))

    def outputs(self) -> tuple[Operand, ...]:
        return (Operand("out", self.heads, self.dim, "bf16", False),)

    def steps(self) -> tuple[Step, ...]:  # 3 FLOP per element: two multiplies and an add (as the op graph counts)
        return (Step("rope", self.outputs()[0], ("x", "cos", "sin"), 3.0 * self.heads * self.dim,
                     (("heads", self.heads), ("interleaved", self.layout == "interleaved"))),)

    def row_fits(self, chip: Chip) -> bool:
        """Whether one token's heads fit UB double-buffered beside their fp32 result. Nothing of a rope row splits
        along its dim, so a wider row (an EAGLE-3 draft's 64 + 64 heads of 128 under DP attention: 32 KiB a token)
        runs the per-head cut, as CANN's kernel cuts every row."""
        return self._bytes(1, self.wide)[1] <= chip.aiv.buffers.ub

    # ------------------------------------------------------------------ aclnnRotaryPositionEmbedding's cut
    def _line_bytes(self, s: int) -> float:
        """UB of a step of `s` lines: cos / sin rows and x / out rows double-buffered, the fp32 result beside."""
        c = HeadLines(s, self.tokens, self.heads, self.dim)
        return 2 * (2 * 4.0 * c.table_rows * self.dim // 2 + 2 * 2.0 * c.rows * self.dim) + 4.0 * c.rows * self.dim

    def lines(self, chip: Chip) -> HeadLines:
        """Lines split evenly over the vector cores, as many per step as fit UB (RotateHalf's storeSLines)."""
        lines = self.tokens if self.tokens > 1 else self.heads
        s = cdiv(lines, min(lines, chip.aiv.count))
        while s > 1 and self._line_bytes(s) > chip.aiv.buffers.ub:
            s = cdiv(s, 2)
        return HeadLines(s, self.tokens, self.heads, self.dim)

    @stage
    def copy_tables(self, v: Code, tables: Queue, c: HeadLines) -> None:
        """MTE2 (CopyInR): the step's cos and sin rows."""
        v.alloc(tables)
        for name in ("cos", "sin"):
            v.op("mte2", f"load_{name}", Act("load", Ref(f"ub.{name}", (0, 0), (c.table_rows, self.dim // 2)),
                                             (c.table(name),), "fp32"),
                 bytes=4.0 * c.table_rows * self.dim // 2, dtype="fp32", src="gm", dst="ub")
        v.enque(tables)

    @stage
    def sign_tables(self, v: Code, tables: Queue, c: HeadLines) -> None:
        """Vector (SinCompute): sin's sign flipped for the rotated half once per step (functionally the table)."""
        v.deque(tables)
        ub = Ref("ub.sin", (0, 0), (c.table_rows, self.dim // 2))
        v.op("vector", "sin_sign", Act("load", ub, (ub,), "fp32"), flops=c.table_rows * self.dim / 2,
             bytes=2.0 * c.table_rows * self.dim, dtype="fp32", src="ub", dst="ub")

    @stage
    def copy_in_head(self, v: Code, q: Queues, c: HeadLines, h) -> None:
        """MTE2 (CopyInX): the copy's rows of x, strided by the heads in broadcast mode."""
        v.alloc(q.inq)
        act = Act("rows_every", Ref("ub.x", (0, 0), (c.rows, self.dim)), (Ref("x", (0, 0), (-1, -1)),), "bf16",
                  (("first", c.first(h)), ("step", c.step)))
        v.op("mte2", "load_x", act, bytes=2.0 * c.rows * self.dim, dtype="bf16", src="gm", dst="ub")
        v.enque(q.inq)

    @stage
    def compute_head(self, v: Code, q: Queues, tables: Queue, c: HeadLines, last: bool) -> None:
        """Vector: the rotation of the copy's rows; the step's tables are freed after its last head."""
        v.deque(q.inq)
        v.alloc(q.outq)
        ins = tuple(Ref(f"ub.{n}", (0, 0), (-1, -1)) for n in ("x", "cos", "sin"))
        heads = 1 if c.broadcast else c.rows
        v.op("vector", "rope", Act("rope", Ref("ub.out", (0, 0), (c.rows, self.dim)), ins, "bf16",
                                   (("heads", heads), ("interleaved", self.layout == "interleaved"))),
             flops=3.0 * c.rows * self.dim, bytes=4.0 * c.rows * self.dim, dtype="fp32", src="ub", dst="ub")
        v.free(q.inq)
        if last:
            v.free(tables)
        v.enque(q.outq)

    @stage
    def copy_out_head(self, v: Code, q: Queues, c: HeadLines, h) -> None:
        """MTE3 (CopyOut): the rows back to their places in out."""
        v.deque(q.outq)
        whole = Ref("out", (0, 0), (-1, -1))
        act = Act("place_every", whole, (whole, Ref("ub.out", (0, 0), (c.rows, self.dim))), "bf16",
                  (("first", c.first(h)), ("step", c.step)))
        v.op("mte3", "store_out", act, bytes=2.0 * c.rows * self.dim, dtype="bf16", src="ub", dst="gm")
        v.free(q.outq)

    def build(self, chip: Chip) -> Trace:
        if not self.head_loop and not self.row_fits(chip):
            return replace(self, head_loop=1).build(chip)
        if not self.head_loop:
            return super().build(chip)
        self.inputs()  # checks the layout
        c = self.lines(chip)
        prog = TileProgram(self.name, chip, self.buffering)
        tables = prog.queue("tables", (AIV, "mte2"), (AIV, "vector"), depth=2,
                            slot={"ub": 2 * 4.0 * c.table_rows * self.dim // 2})
        xbytes = {"ub": 2.0 * c.rows * self.dim}
        q = Queues(prog.queue("in", (AIV, "mte2"), (AIV, "vector"), depth=2, slot=xbytes),
                   prog.queue("out", (AIV, "vector"), (AIV, "mte3"), depth=2, slot=xbytes))
        prog.reserve("ub", 4.0 * c.rows * self.dim)
        v = prog.code(AIV)
        v.addr(tt=lin(("blk", 1)))
        self.copy_tables(v, tables, c)
        self.sign_tables(v, tables, c)
        if c.inner > 1:
            with v.loop(c.inner - 1, "h"):
                self.head(v, q, tables, c, "h", False)
        self.head(v, q, tables, c, c.inner - 1, True)
        blocks = cdiv(self.tokens if c.broadcast else self.heads, c.s)
        groups = prog.groups([Band(blocks, None, (v.body(),))], chip.aiv.count)
        return Trace(self.name, chip.name, self.shape, groups, 0.0, self.work().hbm_bytes, prog.buffers(),
                     {"head_loop": 1, "lines_per_step": c.s, "steps": blocks} | prog.tiling(), dtype="bf16")

    def head(self, v: Code, q: Queues, tables: Queue, c: HeadLines, h, last: bool) -> None:
        """One head's copy in, rotation and copy out (`h`: the loop variable, or the last head's index)."""
        self.copy_in_head(v, q, c, h)
        self.compute_head(v, q, tables, c, last)
        self.copy_out_head(v, q, c, h)


@dataclass(frozen=True)
class QuantFormat:
    """Element format, scale block along the row (0 = one scale per row) and scale format of a quantisation."""

    elem: str
    block: int
    scale: str  # fp32 (amax / max) | e8m0 (MX) | ue8m0 (DeepSeek act_quant: powers of two stored in fp32)

    @property
    def storage(self) -> str:
        """The dtype the scales are stored in."""
        return "e8m0" if self.scale == "e8m0" else "fp32"


QUANT = {  # models.md §1.1 (fp8 1x128 activations, ue8m0), §2.1 (MX 1x32 ue8m0), §3.2 (int8 per token)
    "int8": QuantFormat("int8", 0, "fp32"),
    "fp8": QuantFormat("fp8e4m3", 128, "ue8m0"),  # V3.2 / V4 configs: scale_fmt ue8m0
    "fp8amax": QuantFormat("fp8e4m3", 128, "fp32"),  # plain amax / 448 scales
    "mxfp8": QuantFormat("fp8e4m3", 32, "e8m0"),
    "mxfp4": QuantFormat("fp4e2m1", 32, "e8m0"),
}
QUANT_FLOPS = 3  # per element: |x| max, multiply by 1/scale, convert (estimate)


def quant_format(dtype: str, block: int) -> QuantFormat:
    if dtype not in QUANT:
        raise NpusimError(f"unknown quantisation '{dtype}'; allowed: {', '.join(QUANT)}", field="dtype")
    f = QUANT[dtype]
    return QuantFormat(f.elem, block if block >= 0 else f.block, f.scale)


@register
@dataclass(frozen=True)
class Quantise(Tiled):
    """Symmetric quantisation of rows (KV-cache and activation formats): x [rows, elements] -> q [rows, elements]
    in int8 / fp8 / mxfp8 / mxfp4 and scales [rows, elements/block] (amax / max of the format; MX: power of two)."""

    name: ClassVar[str] = "quantise"
    options: ClassVar[tuple[str, ...]] = ("dtype", "block", "buffering", "tile_tokens", "tile_cols")
    limits: ClassVar[dict[str, Allowed]] = {"dtype": Allowed(), "block": Allowed(low=-1)}  # dtype: quant_format
    rows: int
    elements: int
    dtype: str = "int8"
    block: int = -1  # elements per scale; 0 = one per row; -1 = the format's default

    @property
    def tokens(self) -> int:
        return self.rows

    @property
    def wide(self) -> int:
        return self.elements

    @property
    def fmt(self) -> QuantFormat:
        return quant_format(self.dtype, self.block)

    def blocks(self) -> int:
        return cdiv(self.elements, self.fmt.block or self.elements)

    def inputs(self) -> tuple[Operand, ...]:
        return (Operand("x", 1, self.elements, "bf16", False),)

    def outputs(self) -> tuple[Operand, ...]:
        f = self.fmt
        return (Operand("q", 1, self.elements, f.elem, False), Operand("s", 1, self.blocks(), f.storage, False))

    def steps(self) -> tuple[Step, ...]:
        q, s = self.outputs()
        f, e = self.fmt, self.elements
        args = (("elem", f.elem), ("block", f.block), ("scale_fmt", f.scale))
        scale, apply = self.chains()
        return (Step("quant_scale", s, ("x",), 1.0 * e, args, scale), Step("quant_apply", q, ("x", "s"), 2.0 * e, args,
                                                                           apply))

    def chains(self) -> tuple[int, int]:
        """Dependent steps per row of the scale and apply passes, one per PipeBarrier or hand-off. int8, one scale a
        row: CANN's DynamicQuant (ops-nn quant/dynamic_quant dynamic_quant.h, Compute) reduces each row on its own —
        Cast to fp32 | Abs | the repeat Max | WholeReduceMax | Div and the scalar's read of the scale (V->S) — then
        Muls | Cast to int32 | SetDeqScale | Cast to half and to int8 (back to back). Other formats: not read (one
        instruction over the tile)."""
        return (5, 4) if self.dtype == "int8" and self.fmt.block == 0 else (0, 0)


@register
@dataclass(frozen=True)
class Dequantise(Quantise):
    """q [rows, elements] with scales [rows, elements/block] -> x = q * scale [rows, elements] (bf16)."""

    name: ClassVar[str] = "dequantise"

    def inputs(self) -> tuple[Operand, ...]:
        return Quantise.outputs(self)

    def outputs(self) -> tuple[Operand, ...]:
        return (Operand("x", 1, self.elements, "bf16", False),)

    def steps(self) -> tuple[Step, ...]:
        return (Step("dequant", self.outputs()[0], ("q", "s"), 1.0 * self.elements, (("block", self.fmt.block),)),)


@register
@dataclass(frozen=True)
class Swiglu(Tiled):
    """x [rows, 2*width] = [gate | up] -> silu(gate) * up [rows, width]; clamp > 0 (V4 routed experts, models.md
    §2.6): gate <= clamp and up in [-clamp, clamp] first."""

    name: ClassVar[str] = "swiglu"
    rows: int
    width: int
    clamp: int = 0

    @property
    def tokens(self) -> int:
        return self.rows

    @property
    def wide(self) -> int:
        return self.width

    def inputs(self) -> tuple[Operand, ...]:
        w = self.width
        return (Operand("gate", 1, w, "bf16", array="x"), Operand("up", 1, w, "bf16", offset=w, array="x"))

    def outputs(self) -> tuple[Operand, ...]:
        return (Operand("out", 1, self.width, "bf16"),)

    def steps(self) -> tuple[Step, ...]:  # exp, add, divide, two multiplies (+ two clamps), as the op graph counts
        return (Step("swiglu", self.outputs()[0], ("gate", "up"), (6.0 + (2.0 if self.clamp else 0.0)) * self.width,
                     (("clamp", float(self.clamp)),)),)


@register
@dataclass(frozen=True)
class DequantSwigluQuant(Swiglu):
    """A W8A8 gate-up's int32 accumulators x [rows, 2*width] = [gate | up] with the rows' activation scales
    xs [rows, 1] -> silu(gate * xs) * (up * xs) quantised to int8 per row: q [rows, width], s [rows, 1] — the
    down projection's input (torch_npu.npu_dequant_swiglu_quant, quant_mode 1, after a grouped matmul with
    output_dtype int32: cann-recipes-infer module/quantization/compressed_tensors/compressed_tensors_moe_gmm.py
    :159-186). Whole rows per tile (the row's amax). Limit: the weights' per-channel scales and the down projection's
    smooth scales (2w + w fp32 per expert, read once per expert) are folded into the gate-up's int32 (not in the
    trace); clamp > 0: the clamped form (swiglu_mode 1)."""

    name: ClassVar[str] = "dequant_swiglu_quant"

    def inputs(self) -> tuple[Operand, ...]:
        w = self.width
        return (Operand("gate", 1, w, "int32", False, array="x"), Operand("up", 1, w, "int32", False, offset=w,
                                                                           array="x"),
                Operand("xs", 1, 1, "fp32", False))

    def outputs(self) -> tuple[Operand, ...]:
        return (Operand("q", 1, self.width, "int8", False), Operand("s", 1, 1, "fp32", False))

    def steps(self) -> tuple[Step, ...]:
        w, (q, s) = self.width, self.outputs()
        g, u, y = (Operand(n, 1, w, "fp32", False) for n in ("g", "u", "y"))
        args = (("elem", "int8"), ("block", 0), ("scale_fmt", "fp32"))
        scale, apply = Quantise(self.rows, w).chains()
        return (Step("dequant", g, ("gate", "xs"), 1.0 * w, (("block", 0),)),
                Step("dequant", u, ("up", "xs"), 1.0 * w, (("block", 0),)),
                *(replace(st, out=y, ins=("g", "u")) for st in Swiglu.steps(self)),
                Step("quant_scale", s, ("y",), 1.0 * w, args, scale),
                Step("quant_apply", q, ("y", "s"), 2.0 * w, args, apply))

    # ---------------------------------------------------------------- a row wider than UB (the dense MLP's 18432)
    def build(self, chip: Chip) -> Trace:
        if self.tile_tokens or self.tile_cols or self.fewest(chip)[1]:
            return super().build(chip)
        return self.build_wide(chip)

    def chunk(self, chip: Chip) -> tuple[int, int]:
        """(column chunks of a row, columns a chunk) when a whole row does not fit UB. CANN's tiling for int32 x with
        dynamic quantisation (ops-nn quant/dequant_swiglu_quant/op_host/dequant_swiglu_quant_tiling_base.cpp,
        GetBufferNumAndDataLenPerUB / getBaseColLenUpBound): UB / 45 B columns a pass (11 fp32 buffers and the int8
        output per column), 512 B (128 fp32) aligned, one row a tile; here the row cut into equal chunks of at most
        that (CANN: full chunks and a tail)."""
        cap = max(WIDE_ALIGN, int(chip.aiv.buffers.ub // WIDE_UB_BYTES_PER_COL) // WIDE_ALIGN * WIDE_ALIGN)
        n = cdiv(self.width, cap)
        return n, 8 * cdiv(cdiv(self.width, n), 8)

    def build_wide(self, chip: Chip) -> Trace:
        """One row a block, in two passes over its column chunks (the workspace of colLen fp32 per core that the
        tiling reserves when a row is cut, GetWorkspaceSize): dequantise and SwiGLU each chunk into the GM workspace
        (L2), keeping the chunk's scale; the row's scale is the largest; then each chunk read back, quantised and
        stored. The workspace round trip is L2 traffic (a core's row is colLen x 4 B)."""
        n, bc = self.chunk(chip)
        prog = TileProgram(self.name, chip, self.buffering)
        inq = prog.queue("in", (AIV, "mte2"), (AIV, "vector"), depth=2, slot={"ub": 2 * 4.0 * bc + 4.0})
        outq = prog.queue("out", (AIV, "vector"), (AIV, "mte3"), depth=2, slot={"ub": 4.0 * bc})
        prog.reserve("ub", 3 * 4.0 * bc + 4.0 * (n + 1))  # g, u, y in fp32; the chunks' scales and the row's
        v = prog.code(AIV)
        v.addr(tt=lin(("blk", 1)))
        with v.loop(n, "c"):
            self.first_pass(v, inq, outq, bc)
        self.row_scale(v, outq, n)
        with v.loop(n, "c"):
            self.second_pass(v, inq, outq, bc)
        groups = prog.groups([Band(self.rows, None, (v.body(),))], chip.aiv.count)
        return Trace(self.name, chip.name, self.shape, groups, 0.0, self.work().hbm_bytes, prog.buffers(),
                     {"tile_tokens": 1, "tile_cols": bc, "chunks": n, "tiles": self.rows} | prog.tiling(),
                     dtype="bf16")

    def wide_ref(self, name: str, bc: int, offset: int = 0, stop: int = 0) -> Ref:
        """Chunk `c` of the block's row of a [rows, stop] GM array, from column `offset`."""
        return Ref(name, (lin(("tt", 1)), lin(("c", bc), base=offset)), (1, bc), (self.rows, stop or self.width))

    @stage
    def first_pass(self, v: Code, inq: Queue, outq: Queue, bc: int) -> None:
        w, ub = self.width, (lambda name, cols=bc: Ref(f"ub.{name}", (0, 0), (1, cols)))
        v.alloc(inq)
        v.op("mte2", "load_gate", Act("load", ub("gate"), (self.wide_ref("x", bc, 0, w),), "int32"),
             bytes=4.0 * bc, dtype="int32", src="gm", dst="ub")
        v.op("mte2", "load_up", Act("load", ub("up"), (self.wide_ref("x", bc, w, 2 * w),), "int32"),
             bytes=4.0 * bc, dtype="int32", src="gm", dst="ub")
        v.op("mte2", "load_xs", Act("load", ub("xs", 1), (Ref("xs", (lin(("tt", 1)), 0), (1, 1), (self.rows, 1)),),
                                    "fp32"), bytes=4.0, dtype="fp32", src="gm", dst="ub")
        v.enque(inq)
        v.deque(inq)
        v.alloc(outq)
        (deq_g, deq_u, act, scale, _) = self.steps()
        for st, out, ins in ((deq_g, "g", ("gate", "xs")), (deq_u, "u", ("up", "xs")), (act, "y", ("g", "u"))):
            v.op("vector", f"{st.op}_{out}", Act(st.op, ub(out), tuple(ub(i, -1) for i in ins), "fp32", st.args),
                 flops=st.flops * bc / w, bytes=4.0 * bc, dtype="fp32", src="ub", dst="ub")
        v.op("vector", "chunk_scale", Act("quant_scale", Ref("ub.m", (0, lin(("c", 1))), (1, 1)), (ub("y"),), "fp32",
                                          scale.args), flops=scale.flops * bc / w, bytes=4.0 * bc, dtype="fp32",
             src="ub", dst="ub", issues=max(1, scale.chain))
        v.free(inq)
        v.enque(outq)
        v.deque(outq)
        v.op("mte3", "store_ws", Act("store", self.wide_ref("gm.y", bc), (ub("y"),), "fp32"), bytes=4.0 * bc,
             dtype="fp32", src="ub", dst="gm", hit=1.0)
        v.free(outq)

    @stage
    def row_scale(self, v: Code, outq: Queue, n: int) -> None:
        """The row's scale: the largest of its chunks' (amax / 127), stored."""
        s = Ref("ub.s", (0, 0), (1, 1))
        v.alloc(outq)
        v.op("vector", "row_scale", Act("row_max", s, (Ref("ub.m", (0, 0), (1, n)),), "fp32"), flops=1.0 * n,
             bytes=4.0 * n, dtype="fp32", src="ub", dst="ub")
        v.enque(outq)
        v.deque(outq)
        v.op("mte3", "store_s", Act("store", Ref("s", (lin(("tt", 1)), 0), (1, 1), (self.rows, 1)), (s,), "fp32"),
             bytes=4.0, dtype="fp32", src="ub", dst="gm")
        v.free(outq)

    @stage
    def second_pass(self, v: Code, inq: Queue, outq: Queue, bc: int) -> None:
        ub = (lambda name, cols=bc: Ref(f"ub.{name}", (0, 0), (1, cols)))
        apply = self.steps()[-1]
        v.alloc(inq)
        v.op("mte2", "load_ws", Act("load", ub("y2"), (self.wide_ref("gm.y", bc),), "fp32"), bytes=4.0 * bc,
             dtype="fp32", src="gm", dst="ub", hit=1.0)
        v.enque(inq)
        v.deque(inq)
        v.alloc(outq)
        v.op("vector", "quant_apply", Act("quant_apply", ub("q"), (ub("y2", -1), Ref("ub.s", (0, 0), (1, 1))), "int8",
                                          apply.args), flops=apply.flops * bc / self.width, bytes=4.0 * bc,
             dtype="fp32", src="ub", dst="ub", issues=max(1, apply.chain))
        v.free(inq)
        v.enque(outq)
        v.deque(outq)
        v.op("mte3", "store_q", Act("store", self.wide_ref("q", bc), (ub("q"),), "int8"), bytes=1.0 * bc,
             dtype="int8", src="ub", dst="gm")
        v.free(outq)


@register
@dataclass(frozen=True)
class Copy(Tiled):
    """Rows copied, cast or repeated: x [rows, cols] in `dtype` -> out [rows * repeat, cols] in `out_dtype`, each
    row written `repeat` times after itself. What a deployment's model code runs between kernels: torch's
    contiguous() of a permuted view before an op that takes no strided input (the permutation is the DMAs' strides:
    a row of a head moves as it is, so the arrays are the row copies), Tensor.to(float32) (a vector Cast, the
    rounding of the store), Tensor.repeat along a new leading axis. One vector move per tile between the queues
    (Ascend C's UB-to-UB DataCopy); no FLOPs."""

    name: ClassVar[str] = "copy"
    options: ClassVar[tuple[str, ...]] = ("dtype", "out_dtype", "buffering", "tile_tokens", "tile_cols")
    limits: ClassVar[dict[str, Allowed]] = {"dtype": Allowed(choices=COPY_DTYPES),
                                            "out_dtype": Allowed(choices=COPY_DTYPES)}
    rows: int
    cols: int
    repeat: int = 1
    dtype: str = "bf16"
    out_dtype: str = "bf16"

    @property
    def tokens(self) -> int:
        return self.rows

    @property
    def wide(self) -> int:
        return self.cols

    def inputs(self) -> tuple[Operand, ...]:
        return (Operand("x", 1, self.cols, self.dtype),)

    def outputs(self) -> tuple[Operand, ...]:
        return (Operand("out", self.repeat, self.cols, self.out_dtype),)

    def _work_bytes(self, bt: int, bc: int) -> float:
        """No fp32 working copy: the move writes the out buffer itself."""
        return 0.0

    def steps(self) -> tuple[Step, ...]:
        out = self.outputs()[0]
        if self.repeat > 1:
            return (Step("repeat_rows", out, ("x",), 0.0, (("streams", self.repeat),)),)
        return (Step("copy", out, ("x",), 0.0),)


@register
@dataclass(frozen=True)
class MoeCombine(Tiled):
    """out[t] = shared[t] + sum_i w[t, i] y[index[t, i]]: the routed experts' rows y [rows, hidden] gathered back to
    their tokens (index [1, tokens*topk] into y), weighted, plus the shared expert [tokens, hidden]."""

    name: ClassVar[str] = "moe_combine"
    tokens: int
    topk: int = 8
    hidden: int = 7168

    @property
    def wide(self) -> int:
        return self.hidden

    def inputs(self) -> tuple[Operand, ...]:
        k, h = self.topk, self.hidden
        return (Operand("y", k, h, "bf16", gather="index"), Operand("w", 1, k, "fp32", False),
                Operand("shared", 1, h, "bf16"))

    def outputs(self) -> tuple[Operand, ...]:
        return (Operand("out", 1, self.hidden, "bf16"),)

    def steps(self) -> tuple[Step, ...]:
        return (Step("combine", self.outputs()[0], ("y", "w", "shared"), 2.0 * (self.topk + 1) * self.hidden,
                     (("topk", self.topk),)),)


@register
@dataclass(frozen=True)
class MoePermute(Tiled):
    """out[i] = x[index[i]]: the rows of a bulk-prefill MoE put in another order, one pass over them (cann-recipes
    R1 prefill, "double routing"). init_routing (npu_moe_init_routing_v2) expands each token to its top-k rows in
    expert order, quantised to INT8 with one scale per row under W8A8 (quant_mode 1, dynamic); re_routing
    (npu_moe_re_routing) orders the rows the all-to-all brought by local expert, their scales carried along; the
    un-sort (index_select) puts the experts' BF16 outputs back in the all-to-all's order. x [n, hidden] in `dtype`
    (with scales [n, 1] when INT8) -> out [rows, hidden] in `out_dtype` ('' = as read; int8 = quantised per row).
    Limit: the sort of the rows' 4-byte expert ids that makes the index is not in the trace (a key per row beside
    a hidden-wide row), nor the smooth-quant scale of init_routing (one multiply per element)."""

    name: ClassVar[str] = "moe_permute"
    options: ClassVar[tuple[str, ...]] = ("dtype", "out_dtype", "tile_tokens", "tile_cols")
    rows: int
    hidden: int = 7168
    dtype: str = "bf16"
    out_dtype: str = ""

    @property
    def tokens(self) -> int:
        return self.rows

    @property
    def wide(self) -> int:
        return self.hidden

    @property
    def stored(self) -> str:
        return self.out_dtype or self.dtype

    def _scaled(self) -> bool:
        if self.stored not in ("bf16", "int8") or (self.dtype == "int8" and self.stored != "int8"):
            raise NpusimError(f"moe_permute moves bf16 or int8 rows (bf16 -> int8 quantises); got {self.dtype} -> "
                              f"{self.stored}", field="out_dtype")
        return self.stored == "int8"

    def inputs(self) -> tuple[Operand, ...]:
        x = Operand("x", 1, self.hidden, self.dtype, gather="index")
        return (x, Operand("s", 1, 1, "fp32", False, gather="index", array="scales")) if self.dtype == "int8" else (x,)

    def outputs(self) -> tuple[Operand, ...]:
        out = Operand("out", 1, self.hidden, self.stored)
        return (out, Operand("out_s", 1, 1, "fp32", False)) if self._scaled() else (out,)

    def steps(self) -> tuple[Step, ...]:
        outs, h = self.outputs(), self.hidden
        if self.dtype == self.stored:  # a pure permutation (re-routing carries the scales)
            return tuple(Step("copy", o, (i.name,), 0.0) for o, i in zip(outs, self.inputs()))
        args = (("elem", "int8"), ("block", 0), ("scale_fmt", "fp32"))
        return (Step("quant_scale", outs[1], ("x",), 1.0 * h, args), Step("quant_apply", outs[0], ("x", "out_s"),
                                                                              2.0 * h, args))


@register
@dataclass(frozen=True)
class Embedding(Tiled):
    """out = table[ids] repeated for each of the `streams` residual streams (V4 mHC: 4, else 1): ids [1, tokens],
    table [vocab, hidden] -> out [tokens*streams, hidden]."""

    name: ClassVar[str] = "embedding"
    tokens: int
    hidden: int = 7168
    streams: int = 1

    @property
    def wide(self) -> int:
        return self.hidden

    def inputs(self) -> tuple[Operand, ...]:
        return (Operand("rows", 1, self.hidden, "bf16", gather="ids", array="table"),)

    def outputs(self) -> tuple[Operand, ...]:
        return (Operand("out", self.streams, self.hidden, "bf16"),)

    def steps(self) -> tuple[Step, ...]:
        return (Step("repeat_rows", self.outputs()[0], ("rows",), 0.0, (("streams", self.streams),)),)


@register
@dataclass(frozen=True)
class CacheUpdate(Tiled):
    """New cache rows written to their slots (paged KV / indexer cache, no quantisation): x [rows, elements] ->
    cache[slots[i]] = x[i] (slots [1, rows], -1 = skip)."""

    name: ClassVar[str] = "cache_update"
    rows: int
    elements: int

    @property
    def tokens(self) -> int:
        return self.rows

    @property
    def wide(self) -> int:
        return self.elements

    def inputs(self) -> tuple[Operand, ...]:
        return (Operand("x", 1, self.elements, "bf16"),)

    def outputs(self) -> tuple[Operand, ...]:
        return (Operand("rows", 1, self.elements, "bf16", gather="slots", array="cache"),)

    def steps(self) -> tuple[Step, ...]:
        return (Step("copy", self.outputs()[0], ("x",), 0.0),)


SINKHORN_STEP_FLOPS = 3  # per element per half-iteration: sum, add eps, divide (as projection.SINKHORN_FLOPS)


@register
@dataclass(frozen=True)
class Sinkhorn(Tiled):
    """mHC's Sinkhorn-Knopp of H_res alone (models.md §2.5), the vector steps MhcPre runs after its mixes: per row
    of mix [rows, 2n + n^2] (pre | post | H_res logits, the layout of hc_mix), softmax of each H_res row + eps, divide
    by column sums + eps, then `iters` - 1 times rows then columns -> the same layout with H_res doubly stochastic."""

    name: ClassVar[str] = "sinkhorn"
    options: ClassVar[tuple[str, ...]] = ("eps", "buffering", "tile_tokens", "tile_cols")
    limits: ClassVar[dict[str, Allowed]] = {"iters": Allowed(low=0)}  # as mhc_pre's sinkhorn_iters
    rows: int
    streams: int = 4
    iters: int = 20
    eps: float = 1e-6

    @property
    def tokens(self) -> int:
        return self.rows

    @property
    def wide(self) -> int:
        return 2 * self.streams + self.streams ** 2

    def inputs(self) -> tuple[Operand, ...]:
        return (Operand("logits", 1, self.wide, "fp32", False, array="mix"),)

    def outputs(self) -> tuple[Operand, ...]:
        return (Operand("res", 1, self.wide, "fp32", False, array="mix"),)

    def steps(self) -> tuple[Step, ...]:
        n, out = self.streams, self.outputs()[0]
        args = (("streams", n), ("eps", self.eps))
        first = Step("sinkhorn_start", out, ("logits",), 6.0 * n * n, args)
        halves = [Step("sinkhorn", out, ("res",), SINKHORN_STEP_FLOPS * n * n, args + (("axis", axis),))
                  for _ in range(self.iters - 1) for axis in ("rows", "cols")]
        return (first, *halves)
