"""Vector-core kernels that stream token tiles through UB: mHC post, RoPE, quantise / dequantise, SwiGLU, MoE combine,
the embedding gather and the cache-row scatter.

One mechanism (`Tiled`): the op's GM operands are cut into tiles of `bt` tokens x `bc` columns of the op's wide axis
(hidden, or a row's elements); each AIV takes tiles in waves: MTE2 brings the tile's inputs into UB, a short list of
vector steps computes in fp32, MTE3 writes the outputs; inputs and outputs are double-buffered so the DMA of one
tile hides behind the vector work of the other. Operands that are small per token (mixing weights, scales, rotary
tables) come whole with each tile. A kernel says only its operands, its steps and their FLOPs per token.

When the tokens are few (decode) the wide axis is split as well so every vector core has work, but no tile moves
less than 4 KB and column tiles stay 512 B aligned (HcPost tiling, models.md §2.5 [CRI deepseek_v4_mHC_guide.md]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from npusim.errors import NpusimError
from npusim.kernels.base import Band, Kernel, Work, addr, cdiv, distribute, ins, nbytes, register
from npusim.kernels.tile import Act, Ref, lin
from npusim.kernels.trace import Node, Trace
from npusim.spec.chip import Chip

MIN_TILE_BYTES = 4096  # least data a tile moves when the wide axis is split (HcPost tiling, models.md §2.5 [CRI])
COL_ALIGN_BYTES = 512  # column tiles 512 B aligned (same source)
MIN_COL_BYTES = 1024  # and at least 1 KB of a row (same source)
TILE_TOKENS = (64, 32, 16, 8, 4, 2, 1)
FLAGS = {"in.free": 2, "in.full": 0, "out.free": 2, "out.full": 0}
FORMATS = {"fp8e4m3": 1.0, "fp8e5m2": 1.0, "fp4e2m1": 0.5, "e8m0": 1.0}  # element formats beside the chip's dtypes
EXACT = {"e8m0": ""}  # power-of-two scales are stored exactly (no rounding step)


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


class Tiled(Kernel):
    """Shared mechanism; subclasses give `tokens`, `wide` (the split axis length), inputs, outputs, steps."""

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

    # ------------------------------------------------------------------ tiling
    def _bytes(self, bt: int, bc: int) -> tuple[float, float]:
        """(DMA bytes, UB bytes) of one tile: inputs and outputs double-buffered, step results in fp32."""
        def cols(o: Operand) -> int:
            return bc if o.split else o.cols

        io = sum(mem(o.dtype, bt * o.per, cols(o)) for o in self.inputs() + self.outputs())
        work = sum(4.0 * bt * s.out.per * cols(s.out) for s in self.steps())
        return io, 2 * io + work

    def tile(self, chip: Chip) -> tuple[int, int]:
        """Most tokens per tile that fit UB with whole rows; with fewer tiles than vector cores, one token per tile
        and the wide axis split into aligned column tiles (at least 1 KB of a row, 4 KB moved per tile)."""
        ub, cores, W = chip.aiv.buffers.ub, chip.aiv.count, self.wide
        bt = next((b for b in TILE_TOKENS if b <= self.tokens and self._bytes(b, W)[1] <= ub
                   and cdiv(self.tokens, b) >= cores), 0)
        if bt:
            return bt, W
        split = [mem(o.dtype, 1) for o in self.inputs() + self.outputs() if o.split]
        if not split:  # nothing to cut along the wide axis: one token per tile
            return 1, W
        elem = max(split)
        align = max(1, int(COL_ALIGN_BYTES // elem))
        bc = align * cdiv(cdiv(W, max(1, cores // self.tokens)), align)
        bc = max(bc, align * cdiv(int(MIN_COL_BYTES // elem), align))
        while self._bytes(1, bc)[0] < MIN_TILE_BYTES and bc < W:
            bc += align
        while self._bytes(1, bc)[1] > ub and bc > align:
            bc = max(align, bc // 2 // align * align)
        bc = min(bc, W)
        if self._bytes(1, bc)[1] > ub:
            raise NpusimError(f"{self.name}: one token's tile needs {self._bytes(1, bc)[1] / 1024:g} KiB of UB but "
                              f"{chip.name} has {ub / 1024:g} KiB", field="tiling.ub")
        return 1, bc

    def build(self, chip: Chip) -> Trace:
        bt, bc = self.tile(chip)
        T, W = self.tokens, self.wide
        ncol = cdiv(W, bc)
        share = bc / W
        c0 = lin(("ct", bc))

        def ref(o: Operand, ub: bool) -> Ref:
            rows, cols = bt * o.per, bc if o.split else o.cols
            if ub:
                return Ref(f"ub.{o.name}", (0, 0), (rows, cols))
            col = lin(("ct", bc), base=o.offset) if o.split else o.offset
            return Ref(o.gm, (lin(("tt", bt * o.per)), col), (rows, cols),
                       (T * o.per, (W if o.split else o.cols) + o.offset))

        ins_, outs, steps = self.inputs(), self.outputs(), self.steps()
        body: list[Node] = []
        for i, o in enumerate(ins_):
            edge = dict(wait=("in.free",) if i == 0 else (), set=("in.full",) if i == len(ins_) - 1 else ())
            cols = bc if o.split else o.cols
            moved = mem(o.dtype, bt * o.per, cols)
            if o.gather:  # index row [1, tokens] and the table's column tile: the discrete copy of the rows
                rows = bt * o.per
                act = Act("gather", ref(o, True), (Ref(o.gather, (0, lin(("tt", rows))), (1, rows), (1, T * o.per)),
                                                   Ref(o.gm, (0, c0), (-1, bc))), rnd_as(o.dtype), (("fill", -1),))
                body.append(ins("mte2", f"gather_{o.name}", act, bytes=moved + 4.0 * rows, dtype=o.dtype, src="gm",
                                dst="ub", **edge))
                continue
            body.append(ins("mte2", f"load_{o.name}", Act("load", ref(o, True), (ref(o, False),), rnd_as(o.dtype)),
                            bytes=moved, dtype=o.dtype, src="gm", dst="ub", **edge))
        for i, s in enumerate(steps):
            cols = bc if s.out.split else s.out.cols
            flags = dict(wait=(("in.full", "out.free") if i == 0 else ()),
                         set=(("in.free", "out.full") if i == len(steps) - 1 else ()))
            args = s.args + (("tokens", bt), ("col0", c0))
            body.append(ins("vector", s.op, Act(s.op, Ref(f"ub.{s.out.name}", (0, 0), (bt * s.out.per, cols)),
                                                tuple(Ref(f"ub.{n}", (0, 0), (-1, -1)) for n in s.ins),
                                                rnd_as(s.out.dtype), args),
                            flops=s.flops * bt * (share if s.out.split else 1.0), bytes=4.0 * bt * s.out.per * cols,
                            dtype="fp32", src="ub", dst="ub", **flags))
        for i, o in enumerate(outs):
            cols = bc if o.split else o.cols
            act = Act("store", ref(o, False), (ref(o, True),), rnd_as(o.dtype))
            if o.gather:  # the discrete copy out: rows land at their slots (functionally the column tile updated)
                whole = Ref(o.gm, (0, c0), (-1, bc))
                act = Act("scatter", whole, (whole, Ref(o.gather, (0, lin(("tt", bt * o.per))), (1, bt * o.per),
                                                         (1, T * o.per)), ref(o, True)), rnd_as(o.dtype),
                          (("fill", -1),))
            body.append(ins("mte3", f"store_{o.name}", act,
                            bytes=mem(o.dtype, bt * o.per, cols), dtype=o.dtype, src="ub", dst="gm",
                            wait=("out.full",) if i == 0 else (), set=("out.free",) if i == len(outs) - 1 else ()))
        head = addr(tt=lin(("blk", 1), div=ncol), ct=lin(("blk", 1), mod=ncol))
        blocks = cdiv(T, bt) * ncol
        groups = distribute([Band(blocks, None, ((head,) + tuple(body),))], chip.aiv.count, FLAGS)
        w = self.work()
        return Trace(self.name, chip.name, self.shape, groups, 0.0, w.hbm_bytes, {"ub": self._bytes(bt, bc)[1]},
                     {"tile_tokens": bt, "tile_cols": bc, "tiles": blocks}, dtype="bf16")


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


@register
@dataclass(frozen=True)
class Rope(Tiled):
    """Rotary embedding of `dim` dims of `heads` vectors per token: x [tokens*heads, dim], cos / sin
    [tokens, dim/2] (the token's position) -> out. Pairs are (2i, 2i+1) interleaved (MLA) or (i, i + dim/2) half
    and half (the V3.2 indexer, models.md §1.3 [DS32-fix])."""

    name: ClassVar[str] = "rope"
    options: ClassVar[tuple[str, ...]] = ("layout",)
    tokens: int
    heads: int = 1
    dim: int = 64
    layout: str = "interleaved"

    @property
    def wide(self) -> int:
        return self.dim

    def inputs(self) -> tuple[Operand, ...]:
        if self.layout not in ROPE_LAYOUTS or self.dim % 2:
            raise NpusimError(f"rope: layout must be one of {', '.join(ROPE_LAYOUTS)} and dim even "
                              f"(got {self.layout}, {self.dim})", field="layout")
        half = self.dim // 2
        return (Operand("x", self.heads, self.dim, "bf16", False), Operand("cos", 1, half, "fp32", False),
                Operand("sin", 1, half, "fp32", False))

    def outputs(self) -> tuple[Operand, ...]:
        return (Operand("out", self.heads, self.dim, "bf16", False),)

    def steps(self) -> tuple[Step, ...]:  # 3 FLOP per element: two multiplies and an add (as the op graph counts)
        return (Step("rope", self.outputs()[0], ("x", "cos", "sin"), 3.0 * self.heads * self.dim,
                     (("heads", self.heads), ("interleaved", self.layout == "interleaved"))),)


@dataclass(frozen=True)
class QuantFormat:
    """Element format, scale block along the row (0 = one scale per row) and scale format of a quantisation."""

    elem: str
    block: int
    scale: str  # fp32 | e8m0


QUANT = {  # models.md §1.1 (fp8 1x128 activations), §2.1 (MX 1x32 ue8m0), §3.2 (int8 per token)
    "int8": QuantFormat("int8", 0, "fp32"),
    "fp8": QuantFormat("fp8e4m3", 128, "fp32"),
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
    options: ClassVar[tuple[str, ...]] = ("dtype", "block")
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
        return (Operand("q", 1, self.elements, f.elem, False), Operand("s", 1, self.blocks(), f.scale, False))

    def steps(self) -> tuple[Step, ...]:
        q, s = self.outputs()
        f, e = self.fmt, self.elements
        args = (("elem", f.elem), ("block", f.block), ("scale_fmt", f.scale))
        return (Step("quant_scale", s, ("x",), 1.0 * e, args), Step("quant_apply", q, ("x", "s"), 2.0 * e, args))


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
