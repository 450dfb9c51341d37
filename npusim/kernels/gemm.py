"""GEMM on the cube: C[b] = A[b] @ B[b] tiled as Ascend's matmul does it, for every dtype scheme of the chip.

Per output block (base_m x base_n) the AIC streams K: MTE2 brings an L1 tile (base_m x k_l1 of A, k_l1 x base_n
of B; double-buffered), MTE1 moves base_k slices into L0A/L0B (double-buffered), the cube accumulates into L0C,
and FIXPIPE writes L0C to GM (converting to the output dtype, dequantising INT8). Blocks are spread over the AICs
in waves. Grouped GEMM (MoE experts) is the same block body with one band of blocks per expert. `k_slice` is catlass
34's single-core split-K instead: a block is one C tile and one L1 tile of K, its fp32 partial added into a GM
workspace (atomic add), the AIVs casting the workspace after a SyncAll (`Gemm.split_k`).

The block is a tile program (npusim.kernels.program): queues L1 (MTE2 -> MTE1), L0 (MTE1 -> cube) and L0C
(cube -> FIXPIPE, `l0c_depth` deep) between the stages CopyIn, Split, Compute and CopyOut of `CubeBlock`; a plan's
`buffering` is the depth of the double-buffered ones. A MIX kernel (npusim.kernels.quant_matmul) hands the block to
the AIVs through a GM workspace queue instead of writing the output.

Layouts: A is stored [m, k] and B [n, k] (K contiguous, as nn.Linear weights) or [k, n] (`layout_b`), or either in
a fractal NZ layout. Each L1 tile is one ND -> NZ DMA per operand unless the stored matrix's row stride reaches
STRIDE_LIMIT elements: the DMA's source stride is 16 bits, so the tile is copied one row per DMA, each paying the
MTE2 start-up (catlass CopyGmToL1 for Atlas A2; K104/basic's BasicMatmul at K = 80000). An explicit base_m / base_n
larger than its dim runs at the dim rounded to the fractal (the actual block shape a kernel computes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from npusim.errors import NpusimError
from npusim.kernels.base import (Allowed, Band, Kernel, Work, capacity, cdiv, nbytes, need_cube, read_seconds, register,
                                 scaled, tiler_buffers)
from npusim.kernels.program import AIC, AIV, Code, Queue, TileProgram, stage
from npusim.kernels.tile import Act, Lin, Ref, lin
from npusim.kernels.trace import Trace
from npusim.spec.chip import Chip


@dataclass(frozen=True)
class Scheme:
    """How operands are stored and scaled. qblock: K elements sharing one scale (0 = per row / column)."""

    cube: str  # cube dtype (rate, fractal)
    elem: str  # functional element format
    qblock: int = 0
    scale: str = ""  # scale format ("" = unscaled, "fp32", "e8m0")
    fixpipe_dequant: bool = False  # scale applied once on L0C -> GM (INT8) instead of per K block in the cube
    b_block_n: int = 1  # columns of B sharing a scale (FP8: 128 x 128 weight blocks)
    b_scale: str = ""  # B's scale format when it differs from A's (DeepSeek FP8: fp32 weight scales)


SCHEMES = {
    "bf16": Scheme("bf16", "bf16"),
    "fp16": Scheme("fp16", "fp16"),
    "fp32": Scheme("fp32", "fp32"),
    # W8A8: per-token activation and per-channel weight scales, dequantised in FIXPIPE (models.md §3.1 DEQF16)
    "int8": Scheme("int8", "int8", 0, "fp32", fixpipe_dequant=True),
    # DeepSeek FP8: activations 1x128 with ue8m0 scales (act_quant, scale_fmt of the V3.2 / V4 configs), weights
    # 128x128 blocks with fp32 scales (models.md §1.1); fp8amax: the activation scales plain amax / 448
    "fp8": Scheme("fp8", "fp8e4m3", 128, "ue8m0", b_block_n=128, b_scale="fp32"),
    "fp8amax": Scheme("fp8", "fp8e4m3", 128, "fp32", b_block_n=128),
    # OCP MX formats: one e8m0 scale per 32 elements along K (models.md §2.1 "1x32 blocks, ue8m0")
    "mxfp8": Scheme("mxfp8", "fp8e4m3", 32, "e8m0"),
    "mxfp4": Scheme("mxfp4", "fp4e2m1", 32, "e8m0"),
}


def raw_int32(sch: Scheme, out_dtype: str) -> Scheme:
    """An int32 output is the accumulators as they are: no scales applied, no dequantisation on FIXPIPE (W8A8's
    gate-up before npu_dequant_swiglu_quant, which applies the scales)."""
    return dataclasses.replace(sch, scale="", fixpipe_dequant=False) if out_dtype == "int32" else sch


def scheme_of(name: str) -> Scheme:
    if name not in SCHEMES:
        raise NpusimError(f"unknown dtype scheme '{name}'; allowed: {', '.join(SCHEMES)}", field="dtype")
    return SCHEMES[name]


@dataclass(frozen=True)
class GemmShape:
    """What the tiler needs to know of the problem: sizes, scheme and output dtype."""

    m: int
    n: int
    k: int
    batch: int
    scheme: Scheme
    out_dtype: str

    def scale_bytes(self, rows: int, cols: int, depth: int) -> float:
        """Block-scale bytes loaded with an L1 tile: `rows` rows of A and `cols` columns of B, `depth` deep."""
        sch = self.scheme
        if not sch.scale or sch.fixpipe_dequant:
            return 0.0
        per = 1.0 if sch.scale == "e8m0" else 4.0
        nq = cdiv(depth, sch.qblock)
        return per * nq * (rows + cols / (1 if sch.scale == "e8m0" else sch.b_block_n))


STRIDE_LIMIT = 65536  # elements: a DMA source row stride from here on is copied row by row (catlass.hpp STRIDE_LIMIT)
BLOCK_SIZES = (16, 32, 64, 128, 256)  # candidate base_m / base_n: fractal multiples up to the 256 of Ascend tilers
BALANCED_MAX = 512  # estimate: largest block edge dealt evenly over the cores (L0B still double-buffers 16 deep)
SHORTLIST = 2  # tilings the tuner times at each level of L0C (more cost more time cold than they gain)
L0C_LEVELS = tuple(2 ** j * 128 * 1024 for j in range(6))  # 128 KiB (the 910's L0C) .. 4 MiB: `shortlist`'s ladder


@dataclass(frozen=True)
class CubeTiling:
    """Block sizes of one cube matmul: L0 blocks base_m x base_k x base_n, L1 tiles step_k base_k deep, `l0c_depth`
    accumulators in L0C, and the block order: `by_row` walks along n (consecutive blocks share the A panel, B is
    re-read once per row of blocks), otherwise along m (the B panel shared, A re-read)."""

    base_m: int
    base_n: int
    base_k: int
    step_k: int
    l0c_depth: int = 2
    by_row: bool = True

    @property
    def k_l1(self) -> int:
        return self.base_k * self.step_k

    @classmethod
    def choose(cls, chip: Chip, p: GemmShape, base_m=0, base_n=0, base_k=0, step_k=0, l0c_depth=0,
               by_row: bool | None = None) -> "CubeTiling":
        """The tiling `estimate` ranks first (see `ranked`)."""
        return cls.ranked(chip, p, base_m, base_n, base_k, step_k, l0c_depth, by_row)[0]

    @classmethod
    def ranked(cls, chip: Chip, p: GemmShape, base_m=0, base_n=0, base_k=0, step_k=0, l0c_depth=0,
               by_row: bool | None = None) -> list["CubeTiling"]:
        """What an Ascend tiler considers, best first by `estimate` (explicit sizes win): the fractal-aligned
        base_m x base_n blocks whose `l0c_depth` (1 or 2) fp32 accumulators fit L0C, with base_k filling L0A/L0B
        double-buffered and step_k (a power of two) filling L1 double-buffered, as much of them as a tiler fills
        (`tiler_buffers`). After the first come the others of `shortlist`: the tuner (npusim.engine.tune) times
        them and keeps the fastest. The block order re-reads
        the operand with the smaller footprint. With block scales (`qblock` K elements per scale) an L0 step never
        straddles two scale blocks."""
        dt = p.scheme.cube
        need_cube(chip, dt)
        fm, fk, fn = chip.aic.cube.fractal[dt]
        buf, cap = tiler_buffers(chip), capacity(chip)
        eb = nbytes(dt, 1)
        # an explicit block larger than the whole dim runs at the dim's fractal-rounded size (the actual block
        # shape a catlass kernel computes, e.g. an L1 tile of 128 rows over a 20-row A)
        base_m = min(base_m, cdiv(p.m, fm) * fm) if base_m else 0
        base_n = min(base_n, cdiv(p.n, fn) * fn) if base_n else 0
        if by_row is None:
            by_row = p.n <= p.m  # re-read B unless it is the larger operand

        def sizes(fixed: int, dim: int, f: int, other: int) -> list[int]:
            """Powers of two up to 256, and the sizes that deal the blocks evenly over the cores in 1-4 waves when
            the other dim has `other` blocks (e.g. a decode GEMM's n split 24 ways)."""
            if fixed:
                return [fixed]
            top = cdiv(dim, f) * f
            even = {f * cdiv(cdiv(dim, f), w * chip.aic.count // other) for w in (1, 2, 3, 4)
                    if w * chip.aic.count >= other}
            return sorted({min(s, top) for s in BLOCK_SIZES if s % f == 0} | {s for s in even if s <= BALANCED_MAX})

        cands = []
        for bm in sizes(base_m, p.m, fm, 1):
            for bn in sizes(base_n, p.n, fn, p.batch * cdiv(p.m, bm)):
                for depth in ((l0c_depth,) if l0c_depth else (2, 1)):
                    bk = base_k or _base_k(buf, bm, bn, eb, fk, p.k, p.scheme.qblock)
                    if bk <= 0:
                        continue
                    sk = step_k or _step_k(buf.l1, p, bm, bn, bk)
                    t = cls(bm, bn, bk, sk, depth, by_row)
                    fits = all(used <= cap[lv] for lv, used in t.buffers(p).items())
                    cands.append((not fits, t.estimate(chip, p) if fits else 0.0, -depth, t))
        if not cands:
            raise NpusimError(f"no base_k fits L0A/L0B for base_m={base_m} base_n={base_n} on {chip.name}",
                              field="tiling.base_k")
        cands.sort(key=lambda c: c[:3])
        ranked = [cands[0][3]] + [t for t in shortlist([c for c in cands if not c[0]], p, cap["l0c"])
                                  if t != cands[0][3]]

        def problem(t: CubeTiling) -> tuple[str, str] | None:
            sch = p.scheme
            if sch.qblock and (t.base_k % sch.qblock if t.base_k >= sch.qblock else sch.qblock % t.base_k):
                return (f"base_k={t.base_k} must be a multiple or a divisor of the {sch.qblock}-element scale block",
                        "tiling.base_k")
            for name, size, f in (("base_m", t.base_m, fm), ("base_k", t.base_k, fk), ("base_n", t.base_n, fn)):
                if size <= 0 or size % f:
                    return (f"{name}={size} must be a positive multiple of the {dt} fractal {f} on {chip.name}",
                            f"tiling.{name}")
            return None

        if problem(ranked[0]):
            msg, field = problem(ranked[0])
            raise NpusimError(msg, field=field)
        return [t for t in ranked if not problem(t)]

    def explicit(self) -> dict[str, int]:
        """The tiling as a kernel's explicit options (what the tuner's candidates carry)."""
        return {"base_m": self.base_m, "base_n": self.base_n, "base_k": self.base_k, "step_k": self.step_k,
                "l0c_depth": self.l0c_depth}

    def describe(self) -> dict[str, int | str]:
        return {"base_m": self.base_m, "base_n": self.base_n, "base_k": self.base_k, "step_k": self.step_k,
                "l0c_depth": self.l0c_depth, "order": "along n" if self.by_row else "along m"}

    def slots(self, p: GemmShape) -> dict[str, dict[str, float]]:
        """Bytes of one buffer of each queue of a block, per buffer level: the L1 tile of A and B (with its block
        scales), the L0A and L0B blocks, the fp32 L0C accumulator."""
        dt, bm, bn = p.scheme.cube, self.base_m, self.base_n
        return {"l1": {"l1": nbytes(dt, (bm + bn) * self.k_l1) + p.scale_bytes(bm, bn, self.k_l1)},
                "l0": {"l0a": nbytes(dt, bm * self.base_k), "l0b": nbytes(dt, self.base_k * bn)},
                "l0c": {"l0c": 4.0 * bm * bn}}

    def buffers(self, p: GemmShape) -> dict[str, float]:
        """Per-core use with L1 and L0 double-buffered and `l0c_depth` accumulators (2: FIXPIPE drains one while
        the cube fills the other; 1: one block twice as large, its write-out not overlapped)."""
        depth = {"l1": 2, "l0": 2, "l0c": self.l0c_depth}
        return {level: depth[q] * b for q, slot in self.slots(p).items() for level, b in slot.items()}

    def l2_hits(self, chip: Chip, p: GemmShape) -> tuple[float, float]:
        """Fraction of the A and B tile reads served by L2. Consecutive blocks share the panel of the operand they
        do not walk (read from HBM once: 1 - 1/blocks sharing it); the walked operand (B when by_row) is re-read
        once per row of blocks, from L2 when its footprint plus the panel and output row touched in between fit
        in L2, otherwise shared only by the blocks of one wave that need the same panel."""
        tm, tn = cdiv(p.m, self.base_m), cdiv(p.n, self.base_n)
        eb, ob = nbytes(p.scheme.cube, 1), nbytes(p.out_dtype, 1)
        outer, walk = (tm, tn) if self.by_row else (tn, tm)
        # bytes touched between two reads of a walked panel: the walked operand, one shared panel, one output row
        if self.by_row:
            reuse = p.k * p.n * eb + self.base_m * p.k * eb + self.base_m * p.n * ob
        else:
            reuse = p.m * p.k * eb + self.base_n * p.k * eb + p.m * self.base_n * ob
        wave = min(chip.aic.count, p.batch * tm * tn)
        shared = 1 - 1 / walk
        reread = 1 - 1 / outer if reuse <= chip.l2.size else 1 - min(walk, wave) / wave
        return (shared, reread) if self.by_row else (reread, shared)

    def estimate(self, chip: Chip, p: GemmShape) -> float:
        """Seconds of the whole GEMM as the engine runs it, wave by wave: the cores of a wave start together, so
        their MTE2 loads (A, then B, in order) share L2 and HBM at the same moments; a block takes its slowest
        pipe (cube, MTE2, MTE1), plus with one L0C accumulator its FIXPIPE write-out and the next block's first L1
        tile, which the engine does not overlap then (e.g. 128 x 256 blocks on a 950PR: 1.6 us more a block, its
        0.3 us write-out and a 1.2 us tile load).
        The tiler's cost model for ranking candidates; the engine times the chosen trace."""
        dt, bm, bn, k = p.scheme.cube, self.base_m, self.base_n, p.k
        aic, eff, clock = chip.aic, chip.efficiency, chip.clock
        fk = aic.cube.fractal[dt][1]
        a, b = nbytes(dt, bm, k), nbytes(dt, k, bn)
        mte2, mte1, fix = aic.pipes["mte2"], aic.pipes["mte1"], aic.pipes["fixpipe"]
        hbm_bw, l2_bw = chip.hbm.bandwidth * eff.hbm, chip.l2.read_bandwidth * eff.l2
        cube = 2.0 * bm * bn * cdiv(k, fk) * fk / (aic.cube.flop_per_cycle[dt] * clock * eff.cube)
        copy = (a / _route(mte1, "l1>l0a", dt) + b / _route(mte1, "l1>l0b", dt)) / clock
        out = nbytes(p.out_dtype, bm, bn) / (fix.bytes_per_cycle * clock)
        ha, hb = self.l2_hits(chip, p)
        loads = ((a, ha), (b, hb), (p.scale_bytes(bm, bn, k), 1.0))

        tiles, lat = cdiv(k, self.k_l1), mte2.latency_cycles / clock

        def wave(cores: int) -> float:
            # per L1 tile: each load at its share of the servers, its start-up hidden behind the previous load
            durs = [max(read_seconds(chip, x, h), cores * x * (1 - h) / hbm_bw, cores * x * h / l2_bw) / tiles
                    for x, h in loads if x]
            load = tiles * sum(d + max(0.0, lat - durs[i - 1]) for i, d in enumerate(durs))
            write = cores * nbytes(p.out_dtype, bm, bn) / hbm_bw
            return max(cube, copy, load, write) + (out + load / tiles if self.l0c_depth == 1 else 0.0)

        full, tail = divmod(p.batch * cdiv(p.m, bm) * cdiv(p.n, bn), aic.count)
        return full * wave(aic.count) + (wave(tail) if tail else 0.0) + out


def shortlist(fitting: list, p: GemmShape, l0c: float) -> list[CubeTiling]:
    """The tilings the tuner times, best estimate first: at each level of L0C on a fixed ladder (L0C_LEVELS, and
    the chip's own), the SHORTLIST best of the tilings whose accumulators fit that much. `fitting` is (refused, estimate, -depth, tiling), sorted. An estimate does not depend on the
    buffers, so a chip with twice the L0C times every tiling the smaller one timed (its levels are a superset),
    and the tuner's choice is never slower (L0A / L0B / L1 beyond `tiler_buffers` change nothing)."""
    levels = sorted({l0c} | {lv for lv in L0C_LEVELS if lv < l0c})
    out: list[CubeTiling] = []
    for level in levels:
        within = [c for c in fitting if c[3].buffers(p)["l0c"] <= level]
        if within:
            out += [c[3] for c in within[:SHORTLIST]]
    return sorted(dict.fromkeys(out), key=lambda t: next(c[:3] for c in fitting if c[3] is t))


def _route(pipe, path: str, dtype: str) -> float:
    """Bytes per cycle of a pipe on a path, for a dtype where the chip gives one (the engine's lookup)."""
    return pipe.routes.get(f"{path}:{dtype}", pipe.routes.get(path, pipe.bytes_per_cycle))


def _base_k(buf, bm: int, bn: int, eb: float, fk: int, k: int, qblock: int) -> int:
    """The deepest fractal-aligned K step whose A and B blocks double-buffer in L0A / L0B, aligned to the scale
    block (a multiple of it, or a divisor when smaller)."""
    bk = min(int(buf.l0a / 2 / (bm * eb)) // fk * fk, int(buf.l0b / 2 / (bn * eb)) // fk * fk, cdiv(k, fk) * fk)
    if qblock and bk >= qblock:
        return bk // qblock * qblock
    if qblock:
        return max((f for f in range(fk, bk + 1, fk) if qblock % f == 0), default=0)
    return bk


def _step_k(l1: float, p: GemmShape, bm: int, bn: int, bk: int) -> int:
    """The largest power-of-two number of K steps per L1 tile that double-buffers in L1 without passing K."""
    s = 1
    while (bk * s * 2 <= cdiv(p.k, bk) * bk and
           2 * (nbytes(p.scheme.cube, (bm + bn) * bk * s * 2) + p.scale_bytes(bm, bn, bk * s * 2)) <= l1):
        s *= 2
    return s


def cube_queues(prog: TileProgram, t: CubeTiling, p: GemmShape) -> tuple[Queue, Queue, Queue]:
    """The AIC's queues of a matmul: L1 tiles (A1/B1: MTE2 -> MTE1, double-buffered), L0A/L0B blocks (A2/B2:
    MTE1 -> cube, double-buffered) and the `l0c_depth` L0C accumulators (CO1: cube -> FIXPIPE)."""
    slot = t.slots(p)
    return (prog.queue("l1", (AIC, "mte2"), (AIC, "mte1"), depth=2, slot=slot["l1"]),
            prog.queue("l0", (AIC, "mte1"), (AIC, "cube"), depth=2, slot=slot["l0"]),
            prog.queue("l0c", (AIC, "cube"), (AIC, "fixpipe"), depth=t.l0c_depth, slot=slot["l0c"]))


def at_k(ref: Ref, axis: int, off: Lin, size: int) -> Ref:
    """`ref` moved `off` elements along its K axis, `size` deep."""
    start, sz = list(ref.start), list(ref.size)
    s0 = start[axis]
    start[axis] = Lin(off.base + (s0 if isinstance(s0, int) else s0.base), off.terms + (() if isinstance(s0, int)
                                                                                     else s0.terms))
    sz[axis] = size
    return Ref(ref.name, tuple(start), tuple(sz), ref.stop)


@dataclass(frozen=True)
class CubeBlock:
    """One output block on the AIC: zero L0C, stream K through L1 and L0 (double-buffered), FIXPIPE out.

    a, b, out, sa, sb are refs at k = 0 of the block (3-d: batch, rows, cols); the K offset is added here. Stages:
    CopyIn (MTE2, GM -> L1), Split (MTE1, L1 -> L0A/L0B), Compute (cube), CopyOut (FIXPIPE, L0C -> GM)."""

    t: CubeTiling
    sch: Scheme
    k: int
    a: Ref
    b: Ref
    out: Ref
    out_dtype: str
    hits: tuple[float, float]
    queues: tuple[Queue, Queue, Queue]
    sa: Ref | None = None
    sb: Ref | None = None
    relu: bool = False
    handoff: Queue | None = None  # the GM workspace queue FIXPIPE fills for the AIVs (a MIX kernel's epilogue)
    strides: tuple[int, int] = (0, 0)  # GM row strides (elements) of the stored A and B
    b_nk: bool = True  # B stored [n, k] (K contiguous: nn.Linear weights, catlass ColumnMajor), else [k, n]
    out_hit: float = 0.0  # fraction of the write that stays in L2 (a workspace the AIVs read back at once)
    atomic: bool = False  # FIXPIPE adds the block into `out` (GM atomic add) instead of writing it

    @property
    def scaled(self) -> bool:
        """Block scales read by the cube from L1 per K step (not dequantised once in FIXPIPE)."""
        return bool(self.sch.scale) and not self.sch.fixpipe_dequant

    def write(self, c: Code) -> None:
        nfull, rem = divmod(self.k, self.t.k_l1)
        self.init(c)
        c.pingpong(nfull, "kt", lambda slot, i: self.l1_tile(c, slot, i, self.t.k_l1))
        if rem:
            self.l1_tile(c, nfull % 2, Lin(nfull), rem)
        self.copy_out(c)

    def l1_tile(self, c: Code, slot: int, i: Lin, depth: int) -> None:
        self.copy_in(c, slot, i, depth)
        steps = cdiv(depth, self.t.base_k)
        for s in range(steps):
            self.split(c, slot, s, s == steps - 1)
            self.compute(c, slot, s, s == steps - 1)

    @stage
    def init(self, c: Code) -> None:
        c.alloc(self.queues[2])
        c.op("cube", "init", Act("zero", Ref("l0c", (0, 0, 0), (1, self.t.base_m, self.t.base_n))),
             dtype=self.sch.cube, dst="l0c")

    @stage
    def copy_in(self, c: Code, slot: int, i: Lin, depth: int) -> None:
        """The L1 tile at K tile i (`depth` deep, the last one shorter) and its block scales; full after the last."""
        sch, dt, bm, bn, kl1 = self.sch, self.sch.cube, self.t.base_m, self.t.base_n, self.t.k_l1
        l1, koff = self.queues[0], scaled(i, kl1)
        c.alloc(l1)
        a_rows, b_rows = (stride >= STRIDE_LIMIT for stride in self.strides)
        self.load(c, slot, Ref(f"l1.a{slot}", (0, 0, 0), (1, bm, kl1)), at_k(self.a, 2, koff, kl1), 1 if a_rows else 0,
                  nbytes(dt, bm, depth), self.hits[0])
        b_axis = (2 if self.b_nk else 1) if b_rows else 0
        self.load(c, slot, Ref(f"l1.b{slot}", (0, 0, 0), (1, kl1, bn)), at_k(self.b, 1, koff, kl1), b_axis,
                  nbytes(dt, depth, bn), self.hits[1])
        if self.scaled:
            nq, kq, per = cdiv(kl1, sch.qblock), scaled(i, cdiv(kl1, sch.qblock)), cdiv(depth, sch.qblock)
            c.op("mte2", "load", Act("load", Ref(f"l1.sa{slot}", (0, 0, 0), (1, bm, nq)),
                                     (at_k(self.sa, 2, kq, nq),), "fp32"),
                 bytes=4.0 * bm * per / (4 if sch.scale == "e8m0" else 1), dtype="fp32", src="gm", dst="l1",
                 slot=slot)
            c.op("mte2", "load", Act("load", Ref(f"l1.sb{slot}", (0, 0, 0), (1, nq, bn)),
                                     (at_k(self.sb, 1, kq, nq),), "fp32"),
                 bytes=4.0 * bn * per / (4 if sch.scale == "e8m0" else sch.b_block_n), dtype="fp32", src="gm",
                 dst="l1", slot=slot)
        c.enque(l1)

    def load(self, c: Code, slot: int, dst: Ref, src: Ref, axis: int, size: float, hit: float) -> None:
        """GM -> L1 of one operand tile in one ND->NZ DMA, or (`axis` > 0) one DMA per row of the stored matrix
        along that axis of the tile: a source row stride of STRIDE_LIMIT elements or more does not fit the DMA's
        16-bit srcDValue (AscendC Nd2NzParams), so catlass copies such a tile row by row (CopyGmToL1, atlasa2)."""
        dt, elem = self.sch.cube, self.sch.elem
        if not axis:
            c.op("mte2", "load", Act("load", dst, (src,), elem), bytes=size, dtype=dt, src="gm", dst="l1", slot=slot,
                 hit=hit)
            return
        rows = dst.size[axis]

        def row(r: Lin) -> None:
            def at(ref: Ref) -> Ref:
                start, sz = list(ref.start), list(ref.size)
                s0 = start[axis]
                start[axis] = Lin(r.base + (s0 if isinstance(s0, int) else s0.base),
                                  (() if isinstance(s0, int) else s0.terms) + r.terms)
                sz[axis] = 1
                return Ref(ref.name, tuple(start), tuple(sz), ref.stop)
            c.op("mte2", "load_row", Act("load", at(dst), (at(src),), elem), bytes=size / rows, dtype=dt, src="gm",
                 dst="l1", slot=slot, hit=hit)

        row(Lin(0))  # the first and the last row are instructions of their own: they carry the queue's flags
        if rows > 2:
            with c.loop(rows - 2, "row"):
                row(lin(("row", 1), base=1))
        if rows > 1:
            row(Lin(rows - 1))

    @stage
    def split(self, c: Code, slot: int, s: int, last: bool) -> None:
        """K step s of the L1 tile into L0A / L0B; the tile is freed after its last step (by the cube when the
        cube still reads its scales)."""
        dt, bm, bn, bk = self.sch.cube, self.t.base_m, self.t.base_n, self.t.base_k
        l1, l0, _ = self.queues
        p = s % 2
        if s == 0:
            c.deque(l1)
        c.alloc(l0)
        c.op("mte1", "load_l0a", Act("copy", Ref(f"l0a{p}", (0, 0, 0), (1, bm, bk)),
                                     (Ref(f"l1.a{slot}", (0, 0, s * bk), (1, bm, bk)),), self.sch.elem),
             bytes=nbytes(dt, bm, bk), dtype=dt, src="l1", dst="l0a", slot=p)
        c.op("mte1", "load_l0b", Act("copy", Ref(f"l0b{p}", (0, 0, 0), (1, bk, bn)),
                                     (Ref(f"l1.b{slot}", (0, s * bk, 0), (1, bk, bn)),), self.sch.elem),
             bytes=nbytes(dt, bk, bn), dtype=dt, src="l1", dst="l0b", slot=p)
        c.enque(l0)
        if last and not self.scaled:
            c.free(l1)

    @stage
    def compute(self, c: Code, slot: int, s: int, last: bool) -> None:
        sch, bm, bn, bk = self.sch, self.t.base_m, self.t.base_n, self.t.base_k
        l1, l0, _ = self.queues
        p, l0c = s % 2, Ref("l0c", (0, 0, 0), (1, bm, bn))
        scales: tuple[Ref, ...] = ()
        if self.scaled:  # the step's scale blocks (aligned by CubeTiling.choose)
            nqs, q0 = cdiv(bk, sch.qblock), s * bk // sch.qblock
            scales = (Ref(f"l1.sa{slot}", (0, 0, q0), (1, bm, nqs)), Ref(f"l1.sb{slot}", (0, q0, 0), (1, nqs, bn)))
        c.deque(l0)
        c.op("cube", "mmad", Act("mmad", l0c, (l0c, Ref(f"l0a{p}", (0, 0, 0), (1, bm, bk)),
                                              Ref(f"l0b{p}", (0, 0, 0), (1, bk, bn))) + scales, "fp32",
                                 (("qblock", min(sch.qblock, bk) if self.scaled else 0),)),
             flops=2.0 * bm * bn * bk, dtype=sch.cube, src="l0a", dst="l0c", slot=p)
        c.free(l0)
        if last and self.scaled:
            c.free(l1)

    @stage
    def copy_out(self, c: Code) -> None:
        """FIXPIPE: L0C to GM in the output dtype (with ReLU, and the INT8 dequant by per-row / per-column scales),
        or into a workspace slot the AIVs are handed."""
        l0c, bm, bn = self.queues[2], self.t.base_m, self.t.base_n
        deq = (self.sa, self.sb) if self.sch.fixpipe_dequant else ()
        c.op("cube", "sync")
        c.enque(l0c)
        c.deque(l0c)
        if self.handoff:
            c.alloc(self.handoff)
        add = (self.out,) if self.atomic else ()
        c.op("fixpipe", "store", Act("fixpipe", self.out, (Ref("l0c", (0, 0, 0), (1, bm, bn)),) + deq + add,
                                     self.out_dtype, (("relu", self.relu), ("dequant", self.sch.fixpipe_dequant))
                                     + ((("add", True),) if self.atomic else ())),
             bytes=nbytes(self.out_dtype, bm, bn), dtype=self.out_dtype, src="l0c", dst="gm", hit=self.out_hit)
        c.free(l0c)
        if self.handoff:
            c.enque(self.handoff)


@register
@dataclass(frozen=True)
class Gemm(Kernel):
    """C[batch, m, n] = A[batch, m, k] @ B[batch, k, n] (batch = 1: a plain GEMM; a GEMV is m small)."""

    name: ClassVar[str] = "gemm"
    options: ClassVar[tuple[str, ...]] = ("dtype", "out_dtype", "base_m", "base_n", "base_k", "step_k", "l0c_depth",
                                          "buffering", "layout_a", "layout_b", "k_slice")
    limits: ClassVar[dict[str, Allowed]] = {"dtype": Allowed()}  # a scheme, which scheme_of checks
    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "bf16"
    out_dtype: str = "bf16"
    base_m: int = 0
    base_n: int = 0
    base_k: int = 0
    step_k: int = 0
    l0c_depth: int = 0  # L0C accumulators, 1 or 2 (0 = the tiler's choice)
    buffering: int = 0  # depth of the double-buffered queues (0 = 2, as written)
    layout_a: str = "mk"  # A stored [m, k] row-major, or "nz" (fractal: no DMA row stride)
    layout_b: str = "nk"  # B stored [n, k] (K contiguous, as nn.Linear weights), "kn" ([k, n] row-major) or "nz"
    k_slice: int = 0  # catlass 34's single-core split-K: each block one C tile and one L1 tile of K (`split_k`)

    @property
    def scheme(self) -> Scheme:
        """The dtype scheme; int32 out: the raw accumulators, no dequantisation on FIXPIPE (a W8A8 linear's gate-up
        before npu_dequant_swiglu_quant, which applies the scales), as GroupedGemm.scheme."""
        return raw_int32(scheme_of(self.dtype), self.out_dtype)

    @property
    def problem(self) -> GemmShape:
        return GemmShape(self.m, self.n, self.k, self.batch, self.scheme, self.out_dtype)

    def tiling(self, chip: Chip) -> CubeTiling:
        return CubeTiling.choose(chip, self.problem, self.base_m, self.base_n, self.base_k, self.step_k,
                                 self.l0c_depth)

    def candidates(self, chip: Chip) -> tuple[Kernel, ...]:
        return tuple(dataclasses.replace(self, **t.explicit()) for t in CubeTiling.ranked(
            chip, self.problem, self.base_m, self.base_n, self.base_k, self.step_k, self.l0c_depth))

    def work(self) -> Work:
        dt = self.scheme.cube
        io = nbytes(dt, self.m, self.k) + nbytes(dt, self.k, self.n) + nbytes(self.out_dtype, self.m, self.n)
        return Work(2.0 * self.batch * self.m * self.n * self.k, self.batch * io, cube_dtype=dt)

    def build(self, chip: Chip) -> Trace:
        t, sch = self.tiling(chip), self.scheme
        tm, tn = cdiv(self.m, t.base_m), cdiv(self.n, t.base_n)
        w = self.work()
        nq = cdiv(self.k, sch.qblock) if sch.qblock else 1
        bi = lin(("blk", 1), div=tm * tn)
        if t.by_row:
            mi, ni = lin(("blk", 1), div=tn, mod=tm), lin(("blk", 1), mod=tn)
        else:
            mi, ni = lin(("blk", 1), mod=tm), lin(("blk", 1), div=tm, mod=tn)
        a = Ref("a", (Lin(0, (("bi", 1),)), Lin(0, (("mi", t.base_m),)), 0), (1, t.base_m, 0), (None, self.m, self.k))
        b = Ref("b", (Lin(0, (("bi", 1),)), 0, Lin(0, (("ni", t.base_n),))), (1, 0, t.base_n), (None, self.k, self.n))
        sa = Ref("sa", (Lin(0, (("bi", 1),)), Lin(0, (("mi", t.base_m),)), 0), (1, t.base_m, nq), (None, self.m, nq))
        sb = Ref("sb", (Lin(0, (("bi", 1),)), 0, Lin(0, (("ni", t.base_n),))), (1, nq, t.base_n), (None, nq, self.n))
        out = Ref("c", (Lin(0, (("bi", 1),)), Lin(0, (("mi", t.base_m),)), Lin(0, (("ni", t.base_n),))),
                  (1, t.base_m, t.base_n), (None, self.m, self.n))
        prog = TileProgram(self.name, chip, self.buffering)
        c = prog.code(AIC)
        c.addr(bi=bi, mi=mi, ni=ni)
        if self.layout_a not in ("mk", "nz") or self.layout_b not in ("nk", "kn", "nz"):
            raise NpusimError(f"gemm layout_a '{self.layout_a}' / layout_b '{self.layout_b}': A 'mk' or 'nz', B 'nk' "
                              "(stored [n, k]), 'kn' ([k, n]) or 'nz' (fractal)",
                              field="shape.layout_a" if self.layout_a not in ("mk", "nz") else "shape.layout_b")
        nk = self.layout_b != "kn"
        strides = (0 if self.layout_a == "nz" else self.k, {"nk": self.k, "kn": self.n, "nz": 0}[self.layout_b])
        if self.k_slice:
            return self.split_k(chip, prog, t, (a, b, out), strides, nk, (bi, mi, ni), tm * tn)
        CubeBlock(t, sch, self.k, a, b, out, self.out_dtype, t.l2_hits(chip, self.problem),
                  cube_queues(prog, t, self.problem),
                  sa if sch.scale else None, sb if sch.scale else None,
                  strides=strides, b_nk=nk).write(c)
        groups = prog.groups([Band(self.batch * tm * tn, c.body())], chip.aic.count)
        return Trace(self.name, chip.name, self.shape, groups, w.cube_flops, w.hbm_bytes, prog.buffers(),
                     t.describe() | {"blocks": self.batch * tm * tn, "scheme": self.dtype} | prog.tiling(),
                     dtype=sch.cube)

    def split_k(self, chip: Chip, prog: TileProgram, t: CubeTiling, refs: tuple[Ref, Ref, Ref],
                strides: tuple[int, int], nk: bool, idx: tuple[Lin, Lin, Lin], tiles: int) -> Trace:
        """catlass 34_single_core_splitk_matmul (single_core_slicek_matmul.hpp, SingleCoreSplitkGemmIdentityBlock
        Swizzle): a block is one C tile and one K slice of `k_slice` (its L1 tile); L0C accumulates the slice only
        and FIXPIPE adds the fp32 partial into a GM workspace of C (the first slice writes it, the others
        AtomicAdd: output traffic M N K / k_slice, the workspace resident in L2), slices dealt k outer; after a
        SyncAll the AIVs cast the workspace to the output dtype (RemovePaddingNDAndCastC). A slice's A and B are read
        from HBM once and from L2 by the other blocks of the slice. Limits: the blocks are dealt to the cores in
        waves (catlass gives each core a contiguous range of C tiles), A is reloaded per block (catlass keeps it in
        L1 while m stays, with one L1 buffer for A and two for B), the AIV padding prologue is not timed."""
        sch, (a, b, out), (_, mi, ni) = self.scheme, refs, idx
        if sch.scale or self.k_slice != t.k_l1 or self.batch != 1:
            raise NpusimError(f"gemm k_slice={self.k_slice}: the L1 tile's K ({t.k_l1}: base_k x step_k) of one "
                              "unbatched GEMM on an unscaled dtype (fp16, bf16, fp32)", field="shape.k_slice")
        ks, rem = divmod(self.k, self.k_slice)
        ws = Ref("gm.cws", out.start, out.size, out.stop)
        # k outer: the cores work on one K slice at a time, its A (M x k_slice) and B (k_slice x N) a few MB that L2
        # holds, so each A tile comes from HBM once for the tn blocks of its row and each B tile once for its tm
        tm, tn = cdiv(self.m, t.base_m), cdiv(self.n, t.base_n)
        hits = (1.0 - 1.0 / tn, 1.0 - 1.0 / tm)
        ki = lin(("blk", 1), div=tiles)
        queues = cube_queues(prog, t, self.problem)
        bands = []
        slices = [(0, 1, self.k_slice, False)] + ([(1, ks - 1, self.k_slice, True)] if ks > 1 else []) \
            + ([(ks, 1, rem, True)] if rem else [])
        for first, count, depth, atomic in slices:
            c = prog.code(AIC)
            c.addr(bi=Lin(0), mi=mi, ni=ni, ki=ki)
            koff = lin(("ki", self.k_slice), base=first * self.k_slice)
            CubeBlock(t, sch, depth, at_k(a, 2, koff, 0), at_k(b, 1, koff, 0), ws, "fp32", hits, queues,
                      strides=strides, b_nk=nk, out_hit=1.0,
                      atomic=atomic).write(c)
            bands.append(Band(tiles * count, c.body(), ((), ())))  # no AIV work before the SyncAll
        bands.append(self.cast_out(prog, t, tiles))
        w = self.work()
        return Trace(self.name, chip.name, self.shape, prog.groups(bands, chip.aic.count), w.cube_flops, w.hbm_bytes,
                     prog.buffers(), t.describe() | {"blocks": tiles, "k_slice": self.k_slice,
                                                     "scheme": self.dtype} | prog.tiling(), dtype=sch.cube)

    def cast_out(self, prog: TileProgram, t: CubeTiling, tiles: int) -> Band:
        """After a SyncAll, each AIV casts half of a C tile's rows from the fp32 workspace to the output dtype."""
        bm, bn, half = t.base_m, t.base_n, cdiv(t.base_m, 2)
        inq = prog.queue("cin", (AIV, "mte2"), (AIV, "vector"), depth=2, slot={"ub": 4.0 * half * bn})
        outq = prog.queue("cout", (AIV, "vector"), (AIV, "mte3"), depth=2, slot={"ub": 4.0 * half * bn})
        tm = cdiv(self.m, bm)
        bodies, leads = [], []
        for v_i in range(2):
            v = prog.code(AIV, v_i)
            v.addr(bi=Lin(0), mi=lin(("blk", 1), mod=tm), ni=lin(("blk", 1), div=tm, mod=cdiv(self.n, bn)))
            rows = Lin(v_i * half, (("mi", bm),))
            src = Ref("gm.cws", (Lin(0, (("bi", 1),)), rows, Lin(0, (("ni", bn),))), (1, half, bn),
                      (None, self.m, self.n))
            dst = Ref("c", src.start, src.size, src.stop)
            v.alloc(inq)
            v.op("mte2", "load_c", Act("load", Ref("ub.c", (0, 0, 0), (1, half, bn)), (src,), "fp32"),
                 bytes=4.0 * half * bn, dtype="fp32", src="gm", dst="ub", hit=1.0)
            v.enque(inq)
            v.deque(inq)
            v.alloc(outq)
            v.op("vector", "cast", Act("copy", Ref("ub.o", (0, 0, 0), (1, half, bn)), (Ref("ub.c", (0, 0, 0),
                                                                                        (1, half, bn)),),
                                       self.out_dtype), bytes=4.0 * half * bn, dtype="fp32", src="ub", dst="ub")
            v.free(inq)
            v.enque(outq)
            v.deque(outq)
            v.op("mte3", "store_c", Act("store", dst, (Ref("ub.o", (0, 0, 0), (1, half, bn)),), self.out_dtype),
                 bytes=nbytes(self.out_dtype, half, bn), dtype=self.out_dtype, src="ub", dst="gm")
            v.free(outq)
            bodies.append(v.body())
            lead = prog.code(AIV, v_i)
            lead.sync_all()
            leads.append(lead.body())
        return Band(tiles, None, tuple(bodies), lead=tuple(leads))


@register
@dataclass(frozen=True)
class GroupedGemm(Kernel):
    """MoE experts: out[r] = a[r] @ b[e(r)] with a's rows sorted by expert — a [rows, k], b [experts, k, n],
    out [rows, n]. One band of cube blocks per expert (the GEMM block body), so experts with few rows cost a
    partial wave rather than a whole GEMM launch."""

    name: ClassVar[str] = "grouped_gemm"
    options: ClassVar[tuple[str, ...]] = ("dtype", "out_dtype", "counts", "base_m", "base_n", "base_k", "step_k",
                                          "l0c_depth", "buffering")
    limits: ClassVar[dict[str, Allowed]] = Gemm.limits
    rows: int
    k: int
    n: int
    experts: int = 1
    dtype: str = "bf16"
    out_dtype: str = "bf16"
    counts: str = ""  # rows per expert, comma-separated ("" = spread evenly)
    base_m: int = 0
    base_n: int = 0
    base_k: int = 0
    step_k: int = 0
    l0c_depth: int = 0
    buffering: int = 0

    def tiler(self, chip: Chip) -> tuple:
        """CubeTiling.choose's arguments: one expert's blocks walk along n (its rows are few); the tiler sees the
        largest expert."""
        per = self.rows_per_expert()
        used = [m for m in per if m]
        p = GemmShape(max(per), self.n, self.k, max(1, len(used)), scheme_of(self.dtype), self.out_dtype)
        return chip, p, self.base_m, self.base_n, self.base_k, self.step_k, self.l0c_depth, True

    def candidates(self, chip: Chip) -> tuple[Kernel, ...]:
        return tuple(dataclasses.replace(self, **t.explicit()) for t in CubeTiling.ranked(*self.tiler(chip)))

    def rows_per_expert(self) -> list[int]:
        if not self.counts:
            q, r = divmod(self.rows, max(1, self.experts))
            return [q + (e < r) for e in range(max(1, self.experts))]
        out = [int(c) if c.strip().isdigit() else -1 for c in self.counts.split(",")]
        if len(out) != self.experts or sum(out) != self.rows or min(out) < 0:
            raise NpusimError(f"grouped_gemm counts '{self.counts}' must give {self.experts} non-negative row counts "
                              f"summing to rows={self.rows}", field="shape.counts")
        return out

    def work(self) -> Work:
        dt = scheme_of(self.dtype).cube
        used = sum(1 for m in self.rows_per_expert() if m)
        io = (nbytes(dt, self.rows, self.k) + used * nbytes(dt, self.k, self.n)
              + nbytes(self.out_dtype, self.rows, self.n))
        return Work(2.0 * self.rows * self.n * self.k, io, cube_dtype=dt)

    def scheme(self) -> Scheme:
        """The dtype scheme; int32 out: the raw accumulators (`raw_int32`)."""
        return raw_int32(scheme_of(self.dtype), self.out_dtype)

    def build(self, chip: Chip) -> Trace:
        sch = self.scheme()
        per = self.rows_per_expert()
        used = [m for m in per if m]
        # one expert's blocks walk along n (its rows are few); the tiler sees an average expert, batched
        p = GemmShape(max(1, cdiv(self.rows, max(1, len(used)))), self.n, self.k, max(1, len(used)), sch,
                      self.out_dtype)
        t = CubeTiling.choose(*self.tiler(chip))
        tn = cdiv(self.n, t.base_n)
        nq = cdiv(self.k, sch.qblock) if sch.qblock else 1
        w = self.work()
        hits = t.l2_hits(chip, p)
        # band constants: ex (expert), r0 (its first row), rend (one past its last row)
        mi, ni = lin(("blk", 1), div=tn), lin(("blk", 1), mod=tn)
        row = Lin(0, (("r0", 1), ("mi", t.base_m)))
        a = Ref("a", (0, row, 0), (1, t.base_m, 0), (None, lin(("rend", 1)), self.k))
        b = Ref("b", (lin(("ex", 1)), 0, Lin(0, (("ni", t.base_n),))), (1, 0, t.base_n), (None, self.k, self.n))
        sa = Ref("sa", (0, row, 0), (1, t.base_m, nq), (None, lin(("rend", 1)), nq))
        sb = Ref("sb", (lin(("ex", 1)), 0, Lin(0, (("ni", t.base_n),))), (1, nq, t.base_n), (None, nq, self.n))
        out = Ref("c", (0, row, Lin(0, (("ni", t.base_n),))), (1, t.base_m, t.base_n), (None, lin(("rend", 1)), self.n))
        prog = TileProgram(self.name, chip, self.buffering)
        c = prog.code(AIC)
        c.addr(mi=mi, ni=ni)
        CubeBlock(t, sch, self.k, a, b, out, self.out_dtype, hits, cube_queues(prog, t, p),
                  sa if sch.scale else None, sb if sch.scale else None, strides=(self.k, self.k)).write(c)
        body = c.body()
        bands, r0 = [], 0
        for e, m in enumerate(per):
            if m:
                bands.append(Band(cdiv(m, t.base_m) * tn, body, bind=(("ex", e), ("r0", r0), ("rend", r0 + m))))
            r0 += m
        return Trace(self.name, chip.name, self.shape, prog.groups(bands, chip.aic.count), w.cube_flops, w.hbm_bytes,
                     prog.buffers(), t.describe() | {"experts": len(bands), "blocks": sum(b.blocks for b in bands),
                                                     "scheme": self.dtype} | prog.tiling(), dtype=sch.cube)
