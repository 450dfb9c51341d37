"""GEMM on the cube: C[b] = A[b] @ B[b] tiled as Ascend's matmul does it, for every dtype scheme of the chip.

Per output block (base_m x base_n) the AIC streams K: MTE2 brings an L1 tile (base_m x k_l1 of A, k_l1 x base_n
of B; double-buffered), MTE1 moves base_k slices into L0A/L0B (double-buffered), the cube accumulates into L0C,
and FIXPIPE writes L0C to GM (converting to the output dtype, dequantising INT8). Blocks are spread over the AICs
in waves. Grouped GEMM (MoE experts) is the same block body with one band of blocks per expert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from npusim.errors import NpusimError
from npusim.kernels.base import (Band, Kernel, Work, addr, cdiv, distribute, ins, nbytes, need_cube, pingpong,
                                 register, scaled)
from npusim.kernels.tile import Act, Lin, Ref, lin
from npusim.kernels.trace import Instr, Node, Trace
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


SCHEMES = {
    "bf16": Scheme("bf16", "bf16"),
    "fp16": Scheme("fp16", "fp16"),
    # W8A8: per-token activation and per-channel weight scales, dequantised in FIXPIPE (models.md §3.1 DEQF16)
    "int8": Scheme("int8", "int8", 0, "fp32", fixpipe_dequant=True),
    # DeepSeek FP8: activations 1x128, weights 128x128 blocks (models.md §1.1 scale_fmt)
    "fp8": Scheme("fp8", "fp8e4m3", 128, "fp32", b_block_n=128),
    # OCP MX formats: one e8m0 scale per 32 elements along K (models.md §2.1 "1x32 blocks, ue8m0")
    "mxfp8": Scheme("mxfp8", "fp8e4m3", 32, "e8m0"),
    "mxfp4": Scheme("mxfp4", "fp4e2m1", 32, "e8m0"),
}

GEMM_FLAGS = {"l1.free": 2, "l1.full": 0, "l0.free": 2, "l0.full": 0, "l0c.free": 2, "l0c.full": 0}


def scheme_of(name: str) -> Scheme:
    if name not in SCHEMES:
        raise NpusimError(f"unknown dtype scheme '{name}'; allowed: {', '.join(SCHEMES)}", field="dtype")
    return SCHEMES[name]


@dataclass(frozen=True)
class CubeTiling:
    """Block sizes of one cube matmul: L0 blocks base_m x base_k x base_n, L1 tiles step_k base_k deep."""

    base_m: int
    base_n: int
    base_k: int
    step_k: int

    @property
    def k_l1(self) -> int:
        return self.base_k * self.step_k

    @classmethod
    def choose(cls, chip: Chip, dtype: str, m: int, n: int, k: int, base_m=0, base_n=0, base_k=0, step_k=0,
               l1_share: float = 0.5, qblock: int = 0) -> "CubeTiling":
        """Largest fractal-aligned blocks that double-buffer in L0A/L0B/L0C (the 2x32 KB / 2x64 KB split of
        models.md §3.1) and leave `l1_share` of L1 for the operand tiles; explicit sizes win. With block scales
        (`qblock` K elements per scale) an L0 step never straddles two scale blocks."""
        need_cube(chip, dtype)
        fm, fk, fn = chip.aic.cube.fractal[dtype]
        buf = chip.aic.buffers
        eb = nbytes(dtype, 1)
        bm = base_m or min(128, cdiv(m, fm) * fm)
        bn = base_n or min(max(fn, int(buf.l0c / 2 / 4 / bm) // fn * fn), 128 if m >= 128 else 256, cdiv(n, fn) * fn)
        bk = base_k or min(int(buf.l0a / 2 / (bm * eb)) // fk * fk, int(buf.l0b / 2 / (bn * eb)) // fk * fk,
                           cdiv(k, fk) * fk)
        if qblock and not base_k:
            bk = bk // qblock * qblock if bk >= qblock else max(f for f in range(fk, bk + 1, fk) if qblock % f == 0)
        if qblock and (bk % qblock if bk >= qblock else qblock % bk):
            raise NpusimError(f"base_k={bk} must be a multiple or a divisor of the {qblock}-element scale block",
                              field="tiling.base_k")
        for name, size, f in (("base_m", bm, fm), ("base_k", bk, fk), ("base_n", bn, fn)):
            if size <= 0 or size % f:
                raise NpusimError(f"{name}={size} must be a positive multiple of the {dtype} fractal {f} on {chip.name}",
                                  field=f"tiling.{name}")
        sk = step_k or next((s for s in (4, 2, 1) if 2 * (bm + bn) * bk * s * eb <= buf.l1 * l1_share
                             and bk * s <= cdiv(k, bk) * bk), 1)
        return cls(bm, bn, bk, sk)

    def buffers(self, dtype: str) -> dict[str, float]:
        return {"l1": 2 * nbytes(dtype, (self.base_m + self.base_n) * self.k_l1),
                "l0a": 2 * nbytes(dtype, self.base_m * self.base_k), "l0b": 2 * nbytes(dtype, self.base_k * self.base_n),
                "l0c": 2 * 4.0 * self.base_m * self.base_n}


def l2_hits(chip: Chip, cores: int, tiles_m: int, tiles_n: int, fits_l2: bool) -> tuple[float, float]:
    """Fraction of A and B tile reads served by L2: everything after the first read when the operands fit in L2,
    otherwise only the sharing between the blocks of one wave (row-major block order)."""
    if fits_l2:
        return 1 - 1 / tiles_n, 1 - 1 / tiles_m
    wave = min(cores, tiles_m * tiles_n)
    rows, cols = min(tiles_m, cdiv(wave, tiles_n)), min(tiles_n, wave)
    return 1 - rows / wave, 1 - cols / wave


def cube_block(t: CubeTiling, sch: Scheme, k: int, a: Ref, b: Ref, out: Ref, out_dtype: str, hits: tuple[float, float],
               sa: Ref | None = None, sb: Ref | None = None, relu: bool = False) -> tuple[Node, ...]:
    """One output block: zero L0C, stream K through L1 and L0 (double-buffered), FIXPIPE out.

    a, b, out, sa, sb are refs at k = 0 of the block (3-d: batch, rows, cols); the K offset is added here.
    """
    dt, bm, bn, bk, kl1 = sch.cube, t.base_m, t.base_n, t.base_k, t.k_l1
    per_block_scales = sch.scale and not sch.fixpipe_dequant
    nfull, rem = divmod(k, kl1)

    def shift(ref: Ref, axis: int, off: Lin, size: int) -> Ref:
        start = list(ref.start)
        s0 = start[axis]
        start[axis] = Lin(off.base + (s0 if isinstance(s0, int) else s0.base), off.terms + (() if isinstance(s0, int)
                                                                                         else s0.terms))
        sz = list(ref.size)
        sz[axis] = size
        return Ref(ref.name, tuple(start), tuple(sz), ref.stop)

    def l1_tile(slot: int, i: Lin, depth: int) -> tuple[Node, ...]:
        koff = scaled(i, kl1)
        steps = cdiv(depth, bk)
        la, lb = Ref(f"l1.a{slot}", (0, 0, 0), (1, bm, kl1)), Ref(f"l1.b{slot}", (0, 0, 0), (1, kl1, bn))
        body: list[Node] = [
            ins("mte2", "load", Act("load", la, (shift(a, 2, koff, kl1),), sch.elem), bytes=nbytes(dt, bm, depth),
                dtype=dt, src="gm", dst="l1", slot=slot, wait=("l1.free",), hit=hits[0]),
            ins("mte2", "load", Act("load", lb, (shift(b, 1, koff, kl1),), sch.elem), bytes=nbytes(dt, depth, bn),
                dtype=dt, src="gm", dst="l1", slot=slot, set=("l1.full",) if not per_block_scales else (),
                hit=hits[1])]
        nq = cdiv(kl1, sch.qblock) if per_block_scales else 0
        if per_block_scales:
            qa = Ref(f"l1.sa{slot}", (0, 0, 0), (1, bm, nq))
            qb = Ref(f"l1.sb{slot}", (0, 0, 0), (1, nq, bn))
            kq = scaled(i, nq)
            body += [ins("mte2", "load", Act("load", qa, (shift(sa, 2, kq, nq),), "fp32"),
                         bytes=4.0 * bm * cdiv(depth, sch.qblock) / (4 if sch.scale == "e8m0" else 1), dtype="fp32",
                         src="gm", dst="l1", slot=slot),
                     ins("mte2", "load", Act("load", qb, (shift(sb, 1, kq, nq),), "fp32"),
                         bytes=4.0 * bn * cdiv(depth, sch.qblock) / (4 if sch.scale == "e8m0" else sch.b_block_n),
                         dtype="fp32", src="gm", dst="l1", slot=slot, set=("l1.full",))]
        l0c = Ref("l0c", (0, 0, 0), (1, bm, bn))
        for s in range(steps):
            p = s % 2
            l0a, l0b = Ref(f"l0a{p}", (0, 0, 0), (1, bm, bk)), Ref(f"l0b{p}", (0, 0, 0), (1, bk, bn))
            first, last = s == 0, s == steps - 1
            body += [
                ins("mte1", "load_l0a", Act("copy", l0a, (Ref(la.name, (0, 0, s * bk), (1, bm, bk)),), sch.elem),
                    bytes=nbytes(dt, bm, bk), dtype=dt, src="l1", dst="l0a", slot=p,
                    wait=(("l1.full",) if first else ()) + ("l0.free",)),
                ins("mte1", "load_l0b", Act("copy", l0b, (Ref(lb.name, (0, s * bk, 0), (1, bk, bn)),), sch.elem),
                    bytes=nbytes(dt, bk, bn), dtype=dt, src="l1", dst="l0b", slot=p,
                    set=("l0.full",) + (("l1.free",) if last and not per_block_scales else ()))]
            scales = ()
            if per_block_scales:  # the step's scale blocks (aligned by CubeTiling.choose)
                nqs, q0 = cdiv(bk, sch.qblock), s * bk // sch.qblock
                scales = (Ref(f"l1.sa{slot}", (0, 0, q0), (1, bm, nqs)), Ref(f"l1.sb{slot}", (0, q0, 0), (1, nqs, bn)))
            body.append(ins("cube", "mmad", Act("mmad", l0c, (l0c, l0a, l0b) + scales, "fp32",
                                                (("qblock", min(sch.qblock, bk) if per_block_scales else 0),)),
                            flops=2.0 * bm * bn * bk, dtype=dt, src="l0a", dst="l0c", slot=p, wait=("l0.full",),
                            set=("l0.free",) + (("l1.free",) if last and per_block_scales else ())))
        return tuple(body)

    body: tuple[Node, ...] = (ins("cube", "init", Act("zero", Ref("l0c", (0, 0, 0), (1, bm, bn))), dtype=dt,
                                  dst="l0c", wait=("l0c.free",)),)
    body += pingpong(nfull, lambda slot, i: l1_tile(slot, i, kl1), "kt")
    if rem:
        body += l1_tile(nfull % 2, Lin(nfull), rem)
    deq = (sa, sb) if sch.fixpipe_dequant else ()
    body += (ins("cube", "sync", set=("l0c.full",)),
             ins("fixpipe", "store", Act("fixpipe", out, (Ref("l0c", (0, 0, 0), (1, bm, bn)),) + deq, out_dtype,
                                         (("relu", relu), ("dequant", sch.fixpipe_dequant))),
                 bytes=nbytes(out_dtype, bm, bn), dtype=out_dtype, src="l0c", dst="gm",
                 wait=("l0c.full",), set=("l0c.free",)))
    return body


@register
@dataclass(frozen=True)
class Gemm(Kernel):
    """C[batch, m, n] = A[batch, m, k] @ B[batch, k, n] (batch = 1: a plain GEMM; a GEMV is m small)."""

    name: ClassVar[str] = "gemm"
    options: ClassVar[tuple[str, ...]] = ("dtype", "out_dtype", "base_m", "base_n", "base_k", "step_k")
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

    @property
    def scheme(self) -> Scheme:
        return scheme_of(self.dtype)

    def tiling(self, chip: Chip) -> CubeTiling:
        return CubeTiling.choose(chip, self.scheme.cube, self.m, self.n, self.k, self.base_m, self.base_n,
                                 self.base_k, self.step_k, qblock=self.scheme.qblock)

    def work(self) -> Work:
        dt = self.scheme.cube
        io = nbytes(dt, self.m, self.k) + nbytes(dt, self.k, self.n) + nbytes(self.out_dtype, self.m, self.n)
        return Work(2.0 * self.batch * self.m * self.n * self.k, self.batch * io, cube_dtype=dt)

    def build(self, chip: Chip) -> Trace:
        t, sch = self.tiling(chip), self.scheme
        tm, tn = cdiv(self.m, t.base_m), cdiv(self.n, t.base_n)
        w = self.work()
        hits = l2_hits(chip, chip.aic.count, tm, tn, w.hbm_bytes <= chip.l2.size)
        nq = cdiv(self.k, sch.qblock) if sch.qblock else 1
        bi, mi, ni = lin(("blk", 1), div=tm * tn), lin(("blk", 1), div=tn, mod=tm), lin(("blk", 1), mod=tn)
        a = Ref("a", (Lin(0, (("bi", 1),)), Lin(0, (("mi", t.base_m),)), 0), (1, t.base_m, 0), (None, self.m, self.k))
        b = Ref("b", (Lin(0, (("bi", 1),)), 0, Lin(0, (("ni", t.base_n),))), (1, 0, t.base_n), (None, self.k, self.n))
        sa = Ref("sa", (Lin(0, (("bi", 1),)), Lin(0, (("mi", t.base_m),)), 0), (1, t.base_m, nq), (None, self.m, nq))
        sb = Ref("sb", (Lin(0, (("bi", 1),)), 0, Lin(0, (("ni", t.base_n),))), (1, nq, t.base_n), (None, nq, self.n))
        out = Ref("c", (Lin(0, (("bi", 1),)), Lin(0, (("mi", t.base_m),)), Lin(0, (("ni", t.base_n),))),
                  (1, t.base_m, t.base_n), (None, self.m, self.n))
        body = (addr(bi=bi, mi=mi, ni=ni),) + cube_block(t, sch, self.k, a, b, out, self.out_dtype, hits,
                                                         sa if sch.scale else None, sb if sch.scale else None)
        groups = distribute([Band(self.batch * tm * tn, body)], chip.aic.count, GEMM_FLAGS)
        return Trace(self.name, chip.name, self.shape, groups, w.cube_flops, w.hbm_bytes, t.buffers(sch.cube),
                     {"base_m": t.base_m, "base_n": t.base_n, "base_k": t.base_k, "step_k": t.step_k,
                      "blocks": self.batch * tm * tn, "scheme": self.dtype}, dtype=sch.cube)


@register
@dataclass(frozen=True)
class GroupedGemm(Kernel):
    """MoE experts: out[r] = a[r] @ b[e(r)] with a's rows sorted by expert — a [rows, k], b [experts, k, n],
    out [rows, n]. One band of cube blocks per expert (the GEMM block body), so experts with few rows cost a
    partial wave rather than a whole GEMM launch."""

    name: ClassVar[str] = "grouped_gemm"
    options: ClassVar[tuple[str, ...]] = ("dtype", "out_dtype", "counts", "base_m", "base_n", "base_k", "step_k")
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

    def rows_per_expert(self) -> list[int]:
        if not self.counts:
            q, r = divmod(self.rows, max(1, self.experts))
            return [q + (e < r) for e in range(max(1, self.experts))]
        out = [int(c) for c in self.counts.split(",")]
        if len(out) != self.experts or sum(out) != self.rows or min(out) < 0:
            raise NpusimError(f"grouped_gemm counts '{self.counts}' must give {self.experts} non-negative row counts "
                              f"summing to rows={self.rows}", field="shape.counts")
        return out

    def work(self) -> Work:
        dt = scheme_of(self.dtype).cube
        used = sum(1 for m in self.rows_per_expert() if m)
        io = nbytes(dt, self.rows, self.k) + used * nbytes(dt, self.k, self.n) + nbytes(self.out_dtype, self.rows, self.n)
        return Work(2.0 * self.rows * self.n * self.k, io, cube_dtype=dt)

    def build(self, chip: Chip) -> Trace:
        sch = scheme_of(self.dtype)
        per = self.rows_per_expert()
        t = CubeTiling.choose(chip, sch.cube, max(per), self.n, self.k, self.base_m, self.base_n, self.base_k,
                              self.step_k, qblock=sch.qblock)
        tn = cdiv(self.n, t.base_n)
        nq = cdiv(self.k, sch.qblock) if sch.qblock else 1
        w = self.work()
        hits = l2_hits(chip, chip.aic.count, max(1, cdiv(self.rows, max(1, len(per)) * t.base_m)), tn,
                       w.hbm_bytes <= chip.l2.size)
        # band constants: ex (expert), r0 (its first row), rend (one past its last row)
        mi, ni = lin(("blk", 1), div=tn), lin(("blk", 1), mod=tn)
        row = Lin(0, (("r0", 1), ("mi", t.base_m)))
        a = Ref("a", (0, row, 0), (1, t.base_m, 0), (None, lin(("rend", 1)), self.k))
        b = Ref("b", (lin(("ex", 1)), 0, Lin(0, (("ni", t.base_n),))), (1, 0, t.base_n), (None, self.k, self.n))
        sa = Ref("sa", (0, row, 0), (1, t.base_m, nq), (None, lin(("rend", 1)), nq))
        sb = Ref("sb", (lin(("ex", 1)), 0, Lin(0, (("ni", t.base_n),))), (1, nq, t.base_n), (None, nq, self.n))
        out = Ref("c", (0, row, Lin(0, (("ni", t.base_n),))), (1, t.base_m, t.base_n), (None, lin(("rend", 1)), self.n))
        body = (addr(mi=mi, ni=ni),) + cube_block(t, sch, self.k, a, b, out, self.out_dtype, hits,
                                                  sa if sch.scale else None, sb if sch.scale else None)
        bands, r0 = [], 0
        for e, m in enumerate(per):
            if m:
                bands.append(Band(cdiv(m, t.base_m) * tn, body, bind=(("ex", e), ("r0", r0), ("rend", r0 + m))))
            r0 += m
        groups = distribute(bands, chip.aic.count, GEMM_FLAGS)
        return Trace(self.name, chip.name, self.shape, groups, w.cube_flops, w.hbm_bytes, t.buffers(sch.cube),
                     {"base_m": t.base_m, "base_n": t.base_n, "base_k": t.base_k, "step_k": t.step_k,
                      "experts": len(bands), "blocks": sum(b.blocks for b in bands), "scheme": self.dtype},
                     dtype=sch.cube)
