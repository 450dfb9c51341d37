"""A narrow projection on the cube followed by a vector epilogue over its rows: mHC pre (HcPre), the MoE gate and the
KV Compressor.

One mechanism (`Projected`): token rows are cut into blocks of `bm`; per block the AIC computes the block's
[bm, n] = x[bm, k] @ w[k, n] (K streamed through L1 double-buffered, L0 blocks base_k deep, fp32 in L0C), FIXPIPE
writes it to a GM workspace, and the two AIVs run the op's epilogue on half of the rows each (CV pipeline through
GM, the workspace double-buffered so block b+1's GEMM overlaps block b's epilogue). Decode (blocks fewer than the
cores) splits K instead: every core computes a K range of all rows, writes the partial sum, and after a SyncAll
the vector cores add the partials and run the epilogue on a few rows each (HcPre's decode template, models.md §2.5
[CRI deepseek_v4_mHC_guide.md]). The Compressor pools rows of other blocks, so it always takes the second form:
all GEMM blocks, SyncAll, then the pooling over the compressed entries.

mHC pre computes in fp32 (models.md §2.5): its AIVs first convert the block's x to fp32 in a workspace (and sum
its squares for the RMS) — HcPre's "move -> cast -> cube" stage — and the cube multiplies in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from npusim.errors import NpusimError
from npusim.kernels.base import Band, Kernel, Work, addr, cdiv, distribute, ins, nbytes, need_cube, register
from npusim.kernels.tile import Act, Lin, Ref, lin
from npusim.kernels.trace import Loop, Node, Trace
from npusim.spec.chip import Chip

SIGMOID_FLOPS = 4  # exp, add, reciprocal, scale (estimate)
SINKHORN_FLOPS = 3  # per element per half-iteration: sum, add eps, divide (estimate)
TOPK_FLOPS = 8  # per score: group top-2 sums, group selection, top-k compare-select passes (estimate)
FLAGS = {"l1.free": 2, "l1.full": 0, "l0.free": 2, "l0.full": 0, "l0c.free": 2, "l0c.full": 0, "x.free0": 1,
         "x.full0": 0, "x.free1": 1, "x.full1": 0, "c.free0": 1, "c.full0": 0, "c.free1": 1, "c.full1": 0, "in.free0": 2, "in.full0": 0,
         "in.free1": 2, "in.full1": 0, "out.free0": 2, "out.full0": 0, "out.free1": 2, "out.full1": 0,
         "sync0": 0, "sync1": 0}


@dataclass(frozen=True)
class Plan:
    bm: int  # rows per block (streaming) or all rows (split K)
    bn: int  # GEMM columns per L0C block
    bk: int  # L0 depth
    kl1: int  # K per L1 tile
    ksplit: int  # K ranges over the cores (1 = streaming blocks)
    kr: int  # K per range
    er: int  # rows per epilogue tile on one AIV (split K)
    nsplit: int = 1  # column blocks of bn spread over the cores (decode pooling: d split across cores)


class Projected(Kernel):
    """Shared mechanism; subclasses give the GEMM (`rows`, `depth`, `cols`, `cube_dtype`), the epilogue and its
    vector FLOPs per row, and say whether they `cast` x to fp32 or always `pool` across blocks."""

    cast: ClassVar[bool] = False
    pool: ClassVar[bool] = False

    @property
    def rows(self) -> int:
        raise NotImplementedError

    @property
    def depth(self) -> int:
        raise NotImplementedError

    @property
    def cols(self) -> int:
        raise NotImplementedError

    cube_dtype: ClassVar[str] = "bf16"

    def epilogue_flops(self) -> float:
        """Vector FLOPs of the epilogue per row."""
        raise NotImplementedError

    def epilogue_bytes(self) -> float:
        """HBM bytes the epilogue reads and writes per row (besides the GEMM result)."""
        raise NotImplementedError

    def work(self) -> Work:
        T, K, N = self.rows, self.depth, self.cols
        w = nbytes(self.cube_dtype, K, N)
        x = nbytes("bf16", T, K)
        return Work(2.0 * T * K * N, x + w + T * self.epilogue_bytes(),
                    vector_flops=T * self.epilogue_flops() + (2.0 * T * K if self.cast else 0.0),
                    cube_dtype=self.cube_dtype)

    # ------------------------------------------------------------------ tiling
    def plan(self, chip: Chip) -> Plan:
        """The largest row block (up to 128) whose accumulator double-buffers in L0C and whose epilogue fits UB;
        K split over the cores when the row blocks are fewer than the cores (not when pooling across blocks)."""
        dt = self.cube_dtype
        need_cube(chip, dt)
        fm, fk, fn = chip.aic.cube.fractal[dt]
        T, K, N = self.rows, self.depth, self.cols
        b = chip.aic.buffers
        bn = min(fn * cdiv(N, fn), 256)
        options = []
        for bm in ((self.block_rows,) if self.block_rows else (128, 64, 32, 16)):
            bm = min(bm, fm * cdiv(T, fm))
            bk = next(k for k in (256, 128, 64, 32, 16) if 2 * nbytes(dt, max(bm, bn), k) <= min(b.l0a, b.l0b))
            kl1 = bk
            while kl1 * 2 <= K and 2 * nbytes(dt, bm + bn, 2 * kl1) <= b.l1 / 2:
                kl1 *= 2
            blocks = cdiv(T, bm)
            ksplit = self.k_split or (max(1, min(chip.aic.count // blocks, K // kl1))
                                      if blocks < chip.aic.count and not self.pool else 1)
            kr = kl1 * cdiv(cdiv(K, ksplit), kl1)
            er = max(1, min(16, cdiv(T, 2 * chip.aic.count)))
            p = Plan(bm, bn, bk, kl1, cdiv(K, kr), kr, er)
            options.append(p)
            if 2 * 4.0 * bm * bn <= b.l0c and self.ub(chip, p) <= chip.aiv.buffers.ub:
                return p
        return options[-1]  # the smallest: trace() then says by how much it overflows

    # ------------------------------------------------------------------ the block GEMM
    def gemm(self, p: Plan, a: str, rows: Lin, a_k0: Lin, klen: int, out) -> tuple[Node, ...]:
        """[bm, cols] = a[rows .., a_k0 ..] @ w[k0 .., :] over klen (env k0: the weight row of a_k0), per L0C block
        of bn columns written by `out(col, n)`. The first L1 tile starts the accumulation, the others loop."""
        dt, bm, bn, bk = self.cube_dtype, p.bm, p.bn, p.bk
        T, N = self.rows, self.cols
        adt = "fp32" if self.cast else "bf16"
        nk, steps = cdiv(klen, p.kl1), p.kl1 // bk
        w_hit = 1.0 - 1.0 / cdiv(T, p.bm)  # the narrow weight is re-read by every row block: from L2 after the first
        body: list[Node] = []
        for col in ([lin(("nb", bn))] if p.nsplit > 1 else range(0, N, bn)):
            n = bn if p.nsplit > 1 else min(bn, N - col)

            def tile(j: tuple, first: bool) -> tuple[Node, ...]:
                ak = Lin(a_k0.base + p.kl1 * j[1], a_k0.terms + j[0])
                wk = lin(("k0", 1), *j[0], base=p.kl1 * j[1])
                out_: list[Node] = [
                    ins("mte2", "load_x", Act("load", Ref("l1.a", (0, 0), (bm, p.kl1)),
                                              (Ref(a, (rows, ak), (bm, p.kl1), (T, None)),), adt),
                        bytes=nbytes(adt, bm, p.kl1), dtype=adt, src="gm", dst="l1", hit=1.0 if self.cast else 0.0,
                        wait=("l1.free",)),
                    ins("mte2", "load_w", Act("load", Ref("l1.b", (0, 0), (p.kl1, n)),
                                              (Ref("w", (wk, col), (p.kl1, n), (lin(("kend", 1)), N)),), dt),
                        bytes=nbytes(dt, p.kl1, n), dtype=dt, src="gm", dst="l1", hit=w_hit, set=("l1.full",))]
                for s_ in range(steps):
                    acc = not (first and s_ == 0)
                    out_ += [
                        ins("mte1", "load_l0a", Act("copy", Ref("l0a", (0, 0), (bm, bk)),
                                                    (Ref("l1.a", (0, s_ * bk), (bm, bk)),), dt),
                            bytes=nbytes(dt, bm, bk), dtype=dt, src="l1", dst="l0a",
                            wait=("l0.free",) + (("l1.full",) if s_ == 0 else ())),
                        ins("mte1", "load_l0b", Act("copy", Ref("l0b", (0, 0), (bk, n)),
                                                    (Ref("l1.b", (s_ * bk, 0), (bk, n)),), dt),
                            bytes=nbytes(dt, bk, n), dtype=dt, src="l1", dst="l0b",
                            set=("l0.full",) + (("l1.free",) if s_ == steps - 1 else ())),
                        ins("cube", "mmad", Act("mmad", Ref("l0c", (0, 0), (bm, n)),
                                                ((Ref("l0c", (0, 0), (bm, n)),) if acc else ())
                                                + (Ref("l0a", (0, 0), (bm, bk)), Ref("l0b", (0, 0), (bk, n))), "fp32",
                                                (("accumulate", acc),)),
                            flops=2.0 * bm * bk * n, dtype=dt, src="l0a", dst="l0c",
                            wait=("l0.full",) + (("l0c.free",) if not acc else ()), set=("l0.free",))]
                return tuple(out_)

            body += tile(((), 0), True)
            if nk > 1:
                body.append(Loop(nk - 1, tile(((("kt", p.kl1),), 1), False), "kt"))
            body += [ins("cube", "l0c_done", set=("l0c.full",)), out(col, n, p.nsplit > 1)]
        return tuple(body)

    # ------------------------------------------------------------------ trace
    def build(self, chip: Chip) -> Trace:
        p = self.plan(chip)
        bands: list[Band] = []
        if p.ksplit == 1 and not self.pool:
            bands.append(self.streaming(chip, p))
        else:
            bands += self.split(chip, p)
        w = self.work()
        return Trace(self.name, chip.name, self.shape, distribute(bands, chip.aic.count, FLAGS), w.cube_flops,
                     w.hbm_bytes, self.buffers(chip, p),
                     {"block_rows": p.bm, "base_n": p.bn, "base_k": p.bk, "k_l1": p.kl1, "k_split": p.ksplit,
                      "epilogue_rows": p.er, "n_split": p.nsplit} | self.tiling_extra(p), dtype=self.cube_dtype)

    def tiling_extra(self, p: Plan) -> dict:
        return {}

    def buffers(self, chip: Chip, p: Plan) -> dict[str, float]:
        dt = self.cube_dtype
        return {"l1": 2 * nbytes(dt, p.bm + p.bn, p.kl1) if not self.cast else 2 * (4.0 * p.bm + nbytes(dt, p.bn))
                * p.kl1, "l0a": 2 * nbytes(dt, p.bm, p.bk), "l0b": 2 * nbytes(dt, p.bk, p.bn),
                "l0c": 2 * 4.0 * p.bm * p.bn, "ub": self.ub(chip, p)}

    def ub(self, chip: Chip, p: Plan) -> float:
        raise NotImplementedError

    def cast_rows(self, p: Plan, a: int, r0: Lin, klen: int, ss_out: Ref | None) -> tuple[Node, ...]:
        """AIV a converts its half of the block's x (K range from env k0) to fp32 into the workspace the cube reads,
        summing squares for the RMS; the cube is told when both halves are in (x.full{a})."""
        half, T = cdiv(p.bm, 2), self.rows
        kc = min(cast_chunk(half), klen)
        n = cdiv(klen, kc)
        body: list[Node] = [ins("vector", "ss_init", Act("zero", Ref("ub.ss", (0, 0), (half, 1))), bytes=4.0 * half,
                                dtype="fp32", src="ub", dst="ub")]
        for j in range(n):
            body += [
                ins("mte2", "load_x", Act("load", Ref("ub.x", (0, 0), (half, kc)),
                                          (Ref("x", (r0, lin(("k0", 1), base=j * kc)), (half, kc),
                                               (T, lin(("kend", 1)))),), "bf16"),
                    bytes=nbytes("bf16", half, kc), dtype="bf16", src="gm", dst="ub", wait=(f"in.free{a}",),
                    set=(f"in.full{a}",)),
                ins("vector", "cast", Act("cast_ss", Ref("ub.xf", (0, 0), (half, kc + 1)),
                                          (Ref("ub.x", (0, 0), (half, kc)), Ref("ub.ss", (0, 0), (half, 1))), "fp32"),
                    flops=2.0 * half * kc, bytes=4.0 * half * kc, dtype="fp32", src="ub", dst="ub",
                    wait=(f"in.full{a}", f"out.free{a}"), set=(f"in.free{a}",)),
                ins("vector", "keep_ss", Act("copy", Ref("ub.ss", (0, 0), (half, 1)),
                                             (Ref("ub.xf", (0, kc), (half, 1)),), "fp32"),
                    bytes=4.0 * half, dtype="fp32", src="ub", dst="ub", set=(f"out.full{a}",)),
                ins("mte3", "store_xf", Act("store", Ref("ws.xf", (a * half, j * kc), (half, kc)),
                                            (Ref("ub.xf", (0, 0), (half, kc)),), "fp32"),
                    bytes=4.0 * half * kc, dtype="fp32", src="ub", dst="gm", hit=1.0,
                    wait=(f"out.full{a}",) + ((f"x.free{a}",) if j == 0 else ()),
                    set=(f"out.free{a}",) + ((f"x.full{a}",) if j == n - 1 else ()))]
        if ss_out is not None:
            body.append(ins("mte3", "store_ss", Act("store", ss_out, (Ref("ub.ss", (0, 0), (half, 1)),), "fp32"),
                            bytes=4.0 * half, dtype="fp32", src="ub", dst="gm", hit=1.0))
        return tuple(body)

    def cube_waits(self) -> tuple[Node, ...]:
        """The cube starts a block once both AIVs converted their halves of x."""
        return (ins("mte2", "wait_x", wait=("x.full0", "x.full1")),) if self.cast else ()

    def cube_done(self) -> tuple[Node, ...]:
        return (ins("mte2", "free_x", set=("x.free0", "x.free1")),) if self.cast else ()

    def streaming(self, chip: Chip, p: Plan) -> Band:
        """Row blocks: (cast,) GEMM to the block workspace, epilogue on the AIVs."""
        T, K, N = self.rows, self.depth, self.cols
        half = cdiv(p.bm, 2)
        head = addr(k0=Lin(0), kend=Lin(K), r0=lin(("blk", p.bm)))

        def out(col: int, n: int, _: bool) -> Node:
            return ins("fixpipe", "store_c", Act("fixpipe", Ref("ws.c", (0, col), (p.bm, n)),
                                                 (Ref("l0c", (0, 0), (p.bm, n)),), "fp32"),
                       bytes=4.0 * p.bm * n, dtype="fp32", src="l0c", dst="gm", hit=1.0,
                       wait=("l0c.full",) + (("c.free0", "c.free1") if col == 0 else ()),
                       set=("l0c.free",) + (("c.full0", "c.full1") if col + n >= N else ()))

        a_name, a_rows = ("ws.xf", Lin(0)) if self.cast else ("x", lin(("r0", 1)))
        aic = (head,) + self.cube_waits() + self.gemm(p, a_name, a_rows, Lin(0), K, out) + self.cube_done()
        aiv = []
        for a in range(2):
            r0 = lin(("r0", 1), base=a * half)
            body: tuple[Node, ...] = (head,) + (self.cast_rows(p, a, r0, K, None) if self.cast else ())
            body += self.epilogue(chip, p, a, r0, half, Ref("ws.c", (a * half, 0), (half, N)), 1, "c")
            aiv.append(body)
        return Band(cdiv(T, p.bm), aic, tuple(aiv))

    def split(self, chip: Chip, p: Plan) -> list[Band]:
        """Split K (or, pooling, row blocks) over the cores, partial sums to GM, SyncAll, epilogue on all AIVs."""
        T, N = self.rows, self.cols
        half = cdiv(p.bm, 2)
        head = addr(ks=lin(("blk", 1), mod=p.ksplit), nb=lin(("blk", 1), div=p.ksplit, mod=p.nsplit),
                    rb=lin(("blk", 1), div=p.ksplit * p.nsplit), k0=lin(("ks", p.kr)),
                    kend=lin(("ks", p.kr), base=p.kr), r0=lin(("rb", p.bm)))

        def out(col, n: int, split_n: bool) -> Node:
            c = lin(("ks", N), ("nb", p.bn)) if split_n else lin(("ks", N), base=col)
            dst = Ref("gm.part", (lin(("r0", 1)), c), (p.bm, n), (T, None))
            return ins("fixpipe", "store_partial", Act("fixpipe", dst, (Ref("l0c", (0, 0), (p.bm, n)),), "fp32"),
                       bytes=4.0 * p.bm * n, dtype="fp32", src="l0c", dst="gm", hit=1.0, wait=("l0c.full",),
                       set=("l0c.free",))

        a_name, a_rows, a_k0 = ("ws.xf", Lin(0), Lin(0)) if self.cast else ("x", lin(("r0", 1)), lin(("k0", 1)))
        aic = (head,) + self.cube_waits() + self.gemm(p, a_name, a_rows, a_k0, p.kr, out) + self.cube_done()
        aiv: tuple = ((), ())  # no AIV work in the GEMM phase unless casting
        if self.cast:
            aiv = tuple((head,) + self.cast_rows(p, a, lin(("r0", 1), base=a * half), p.kr,
                                                Ref("gm.ss", (lin(("r0", 1), base=a * half), lin(("ks", 1))),
                                                    (half, 1), (T, None)))
                        for a in range(2))
        barrier = tuple((ins("mte3", "sync_all", bytes=32.0, dtype="int32", src="ub", dst="gm", hit=1.0,
                             set=(f"sync{a}",)),
                         ins("mte2", "sync_poll", bytes=32.0, dtype="int32", src="gm", dst="ub", hit=1.0,
                             wait=(f"sync{a}",))) for a in range(2))
        return [Band(cdiv(T, p.bm) * p.ksplit * p.nsplit, aic, aiv), self.after_barrier(chip, p, barrier)]

    def after_barrier(self, chip: Chip, p: Plan, barrier) -> Band:
        """Epilogue tiles of `er` rows over all AIVs, adding the K partials first."""
        T, N = self.rows, self.cols
        er = p.er
        bodies = []
        for a in range(2):
            r0 = lin(("blk", 2 * er), base=a * er)
            c = Ref("gm.part", (r0, 0), (er, N * p.ksplit), (T, None))
            bodies.append(self.epilogue(chip, p, a, r0, er, c, p.ksplit, "part"))
        return Band(cdiv(T, 2 * er), None, tuple(bodies), lead=barrier)

    def epilogue(self, chip: Chip, p: Plan, a: int, r0: Lin, rows: int, c: Ref, parts: int,
                 source: str) -> tuple[Node, ...]:
        """AIV a on `rows` rows from r0: the GEMM result c ([rows, cols] or `parts` K partials side by side)."""
        raise NotImplementedError

    def load_c(self, a: int, rows: int, c: Ref, parts: int, source: str) -> tuple[Node, ...]:
        """The GEMM rows into ub.c (K partials summed), after the cube's hand-off in the streaming form."""
        N = self.cols
        stream = source == "c"
        body: tuple[Node, ...] = (
            ins("mte2", "load_c", Act("load", Ref("ub.cp", (0, 0), (rows, N * parts)), (c,), "fp32"),
                bytes=4.0 * rows * N * parts, dtype="fp32", src="gm", dst="ub", hit=1.0,
                wait=(f"in.free{a}",) + ((f"c.full{a}",) if stream else ()),
                set=(f"in.full{a}",) + ((f"c.free{a}",) if stream else ())),
            ins("vector", "sum_parts", Act("sum_parts", Ref("ub.c", (0, 0), (rows, N)),
                                           (Ref("ub.cp", (0, 0), (rows, N * parts)),), "fp32", (("parts", parts),)),
                flops=1.0 * rows * N * (parts - 1), bytes=4.0 * rows * N * parts, dtype="fp32", src="ub", dst="ub",
                wait=(f"in.full{a}",), set=(f"in.free{a}",)))
        return body


def cast_chunk(rows: int) -> int:
    """Columns per cast step: bf16 in and fp32 out double-buffered in well under the 192 KiB UB (dav-c220)."""
    return next(k for k in (512, 256, 128, 64) if 2 * rows * k * (2 + 4) <= 160 * 1024 or k == 64)


def store(a: int, name: str, src: Ref, dst: Ref, dtype: str, nbytes_: float, last: bool) -> Node:
    return ins("mte3", f"store_{name}", Act("store", dst, (src,), dtype), bytes=nbytes_, dtype=dtype, src="ub",
               dst="gm", wait=(f"out.full{a}",), set=(f"out.free{a}",) if last else ())


# ------------------------------------------------------------------------------------------------------ mHC pre
@register
@dataclass(frozen=True)
class MhcPre(Projected):
    """mHC pre (HcPre, models.md §2.5): x [tokens, streams*hidden] (the n residual streams), fn [streams*hidden,
    mix] (hc_fn^T), hc [1, 3 + mix] (scales a0 a1 a2, then the base b) -> y [tokens, hidden] = sum_j pre_j X_j,
    post [tokens, streams], res [tokens, streams^2] (H_res after `sinkhorn_iters` Sinkhorn-Knopp iterations).
    mix = n (the LM head's hc_head: pre only) or (2+n)n."""

    name: ClassVar[str] = "mhc_pre"
    options: ClassVar[tuple[str, ...]] = ("block_rows", "k_split")
    cast: ClassVar[bool] = True
    cube_dtype: ClassVar[str] = "fp32"
    tokens: int
    streams: int = 4
    hidden: int = 4096
    mix: int = 24
    sinkhorn_iters: int = 20
    block_rows: int = 0  # 0 = the plan's
    k_split: int = 0  # K ranges over the cores: 0 = when row blocks are fewer than the cores

    @property
    def rows(self) -> int:
        return self.tokens

    @property
    def depth(self) -> int:
        return self.streams * self.hidden

    @property
    def cols(self) -> int:
        return self.mix

    @property
    def full(self) -> bool:
        n = self.streams
        if self.mix not in (n, (2 + n) * n):
            raise NpusimError(f"mhc_pre: mix must be streams ({n}) or (2+streams)*streams ({(2 + n) * n}), got "
                              f"{self.mix}", field="shape")
        return self.mix > n

    def epilogue_flops(self) -> float:
        n, d = self.streams, self.hidden
        f = SIGMOID_FLOPS * self.mix + 2.0 * n * d
        if self.full:
            f += 6.0 * n * n + 2 * SINKHORN_FLOPS * n * n * self.sinkhorn_iters
        return f

    def epilogue_bytes(self) -> float:  # y out, post and res out, x read again for the pre-sum
        n, d = self.streams, self.hidden
        return nbytes("bf16", d) + 4.0 * (n + n * n) + nbytes("bf16", n * d)

    def ub(self, chip: Chip, p: Plan) -> float:
        half = cdiv(p.bm, 2)
        rows = half if p.ksplit == 1 else p.er
        kc = cast_chunk(half)
        cast = 2 * (nbytes("bf16", half, kc) + 4.0 * half * (kc + 1))
        epi = 4.0 * rows * (self.mix * (p.ksplit + 1) + 2 * self.streams + self.streams ** 2 + 2 + 512) \
            + 2 * nbytes("bf16", rows, 512)
        return max(cast, epi)

    def epilogue(self, chip, p, a, r0, rows, c, parts, source):
        n, d, mix, T = self.streams, self.hidden, self.mix, self.rows
        mixes = Ref("ub.m", (0, 0), (rows, 2 * n + n * n))
        ss = (Ref("gm.ss", (r0, 0), (rows, p.ksplit), (T, None)) if source == "part"
              else Ref("ub.ss", (0, 0), (rows, 1)))
        body = self.load_c(a, rows, c, parts, source)
        if source == "part":  # the K ranges' sums of squares, beside the partial GEMMs
            body += (ins("mte2", "load_ss", Act("load", Ref("ub.ssp", (0, 0), (rows, p.ksplit)), (ss,), "fp32"),
                         bytes=4.0 * rows * p.ksplit, dtype="fp32", src="gm", dst="ub", hit=1.0),
                     ins("vector", "sum_ss", Act("sum_parts", Ref("ub.ss", (0, 0), (rows, 1)),
                                                 (Ref("ub.ssp", (0, 0), (rows, p.ksplit)),), "fp32",
                                                 (("parts", p.ksplit),)),
                         flops=1.0 * rows * p.ksplit, bytes=4.0 * rows * p.ksplit, dtype="fp32", src="ub",
                         dst="ub"))
        body += (ins("mte2", "load_hc", Act("load", Ref("ub.hc", (0, 0), (1, 3 + mix)), (Ref("hc", (0, 0),
                                                                                           (1, 3 + mix)),), "fp32"),
                     bytes=4.0 * (3 + mix), dtype="fp32", src="gm", dst="ub", hit=1.0),
                 ins("vector", "hc_mix", Act("hc_mix", mixes, (Ref("ub.c", (0, 0), (rows, mix)),
                                                               Ref("ub.ss", (0, 0), (rows, 1)),
                                                               Ref("ub.hc", (0, 0), (1, 3 + mix))), "fp32",
                                             (("streams", n), ("dim", n * d))),
                     flops=rows * (SIGMOID_FLOPS * mix + 6.0 * n * n), bytes=4.0 * rows * mix, dtype="fp32",
                     src="ub", dst="ub"))
        if self.full and self.sinkhorn_iters > 1:  # the first iteration's columns are part of hc_mix
            it = (ins("vector", "sinkhorn_rows", Act("sinkhorn", mixes, (mixes,), "fp32",
                                                     (("streams", n), ("axis", "rows"))),
                      flops=SINKHORN_FLOPS * rows * n * n, bytes=4.0 * rows * n * n, dtype="fp32", src="ub",
                      dst="ub"),
                  ins("vector", "sinkhorn_cols", Act("sinkhorn", mixes, (mixes,), "fp32",
                                                     (("streams", n), ("axis", "cols"))),
                      flops=SINKHORN_FLOPS * rows * n * n, bytes=4.0 * rows * n * n, dtype="fp32", src="ub",
                      dst="ub"))
            body += (Loop(self.sinkhorn_iters - 1, it),)
        # pre-sum y = sum_j pre_j X_j per 512-column chunk, streaming x again (L2 hits: the cast phase read these
        # rows moments before); the mixes go out with the first chunk
        stop = (T, None)
        kc = min(512, d)
        for c0 in range(0, d, kc):
            y = Ref("ub.y", (0, 0), (rows, kc))
            body += (ins("vector", "y_init", Act("zero", y), bytes=4.0 * rows * kc, dtype="fp32", src="ub", dst="ub",
                         wait=(f"out.free{a}",)),)
            for j in range(n):
                body += (ins("mte2", "load_x", Act("load", Ref("ub.x", (0, 0), (rows, kc)),
                                                   (Ref("x", (r0, j * d + c0), (rows, kc), stop),), "bf16"),
                             bytes=nbytes("bf16", rows, kc), dtype="bf16", src="gm", dst="ub", hit=1.0,
                             wait=(f"in.free{a}",), set=(f"in.full{a}",)),
                         ins("vector", "presum", Act("presum", y, (y, Ref("ub.x", (0, 0), (rows, kc)), mixes), "fp32",
                                                     (("stream", j),)),
                             flops=2.0 * rows * kc, bytes=4.0 * rows * kc, dtype="fp32", src="ub", dst="ub",
                             wait=(f"in.full{a}",), set=(f"in.free{a}",) + ((f"out.full{a}",) if j == n - 1 else ())))
            body += (store(a, "y", y, Ref("y", (r0, c0), (rows, kc), stop), "bf16", nbytes("bf16", rows, kc), True),)
            if c0 == 0:
                body += (ins("mte3", "store_post", Act("store", Ref("post", (r0, 0), (rows, n), stop),
                                                       (Ref("ub.m", (0, n), (rows, n)),), "fp32"),
                             bytes=4.0 * rows * n, dtype="fp32", src="ub", dst="gm"),
                         ins("mte3", "store_res", Act("store", Ref("res", (r0, 0), (rows, n * n), stop),
                                                      (Ref("ub.m", (0, 2 * n), (rows, n * n)),), "fp32"),
                             bytes=4.0 * rows * n * n, dtype="fp32", src="ub", dst="gm"))
        return body


# ------------------------------------------------------------------------------------------------------ MoE gate
SCORES = ("sigmoid", "sqrtsoftplus")


@register
@dataclass(frozen=True)
class MoeGate(Projected):
    """MoE routing (models.md §1.2.1, §2.6): logits = x [m, k] @ w [k, n]; s = sigmoid (V3) or sqrt(softplus) (V4);
    idx = top-k of s + bias, limited to the best `limit` of `groups` expert groups (group score: sum of its top-2)
    — or, hash layers, idx = the token's fixed row of the tid2eid table (hash_idx [m, topk]); weights =
    s[idx] / sum * route_scale. bias [1, n] -> weights [m, topk], indices [m, topk]."""

    name: ClassVar[str] = "moe_gate"
    options: ClassVar[tuple[str, ...]] = ("score", "limit", "route_scale", "block_rows", "k_split")
    m: int
    k: int
    n: int
    topk: int = 8
    hash: int = 0
    groups: int = 1
    score: str = "sigmoid"
    limit: int = 0  # groups kept; 0 = half of them
    route_scale: float = 1.0
    block_rows: int = 0
    k_split: int = 0

    @property
    def rows(self) -> int:
        return self.m

    @property
    def depth(self) -> int:
        return self.k

    @property
    def cols(self) -> int:
        if self.score not in SCORES:
            raise NpusimError(f"moe_gate: score must be one of {', '.join(SCORES)}, got {self.score}", field="score")
        if self.n % max(1, self.groups):
            raise NpusimError(f"moe_gate: {self.n} experts do not split into {self.groups} groups", field="shape")
        return self.n

    def epilogue_flops(self) -> float:
        return (SIGMOID_FLOPS + (0 if self.hash else TOPK_FLOPS)) * self.n + 3.0 * self.topk

    def epilogue_bytes(self) -> float:
        return 8.0 * self.topk + (4.0 * self.topk if self.hash else 0.0)

    def ub(self, chip: Chip, p: Plan) -> float:
        rows = cdiv(p.bm, 2) if p.ksplit == 1 else p.er
        return 4.0 * rows * self.n * (p.ksplit + 3) + 2 * 4.0 * rows * 2 * self.topk

    def tiling_extra(self, p: Plan) -> dict:
        return {"score": self.score, "groups": self.groups, "limit": self.limit or max(1, self.groups // 2)}

    def epilogue(self, chip, p, a, r0, rows, c, parts, source):
        T, n, k = self.rows, self.n, self.topk
        g = Ref("ub.g", (0, 0), (rows, 2 * k))
        body = self.load_c(a, rows, c, parts, source)
        extra: tuple[Ref, ...] = ()
        if self.hash:
            extra = (Ref("ub.h", (0, 0), (rows, k)),)
            body += (ins("mte2", "load_hash", Act("load", extra[0], (Ref("hash_idx", (r0, 0), (rows, k), (T, k)),),
                                                  "int32"), bytes=4.0 * rows * k, dtype="int32", src="gm",
                         dst="ub"),)
        body += (ins("mte2", "load_bias", Act("load", Ref("ub.bias", (0, 0), (1, n)), (Ref("bias", (0, 0), (1, n)),),
                                              "fp32"), bytes=4.0 * n, dtype="fp32", src="gm", dst="ub", hit=1.0),
                 ins("vector", "gate", Act("gate", g, (Ref("ub.c", (0, 0), (rows, n)),
                                                       Ref("ub.bias", (0, 0), (1, n))) + extra, "fp32",
                                           (("topk", k), ("groups", self.groups),
                                            ("limit", self.limit or max(1, self.groups // 2)), ("score", self.score),
                                            ("route_scale", self.route_scale))),
                     flops=rows * self.epilogue_flops(), bytes=4.0 * rows * n, dtype="fp32", src="ub", dst="ub",
                     wait=(f"out.free{a}",), set=(f"out.full{a}",)),
                 ins("mte3", "store_weights", Act("store", Ref("weights", (r0, 0), (rows, k), (T, k)),
                                                  (Ref("ub.g", (0, 0), (rows, k)),), "fp32"),
                     bytes=4.0 * rows * k, dtype="fp32", src="ub", dst="gm", wait=(f"out.full{a}",)),
                 ins("mte3", "store_indices", Act("store", Ref("indices", (r0, 0), (rows, k), (T, k)),
                                                  (Ref("ub.g", (0, k), (rows, k)),), "int32"),
                     bytes=4.0 * rows * k, dtype="int32", src="ub", dst="gm", set=(f"out.free{a}",)))
        return body


# ------------------------------------------------------------------------------------------------------ Compressor
@register
@dataclass(frozen=True)
class Compressor(Projected):
    """DeepSeek-V4 KV Compressor (models.md §2.3): [C | Z] = x [m, k] @ w [k, n] (n = 2 * overlap * d), then per
    compressed entry and channel kc = sum softmax(Z + ape) * C over its `ratio` rows (overlap 2, ratio 4 = CSA: the
    a-half of the previous block's rows joins the b-half of its own), RMSNorm over d, RoPE on the last `rope` dims
    at the entry's first position. Tokens are positions 0 .. m-1 (block -1 padded); ape [ratio, overlap * d],
    norm [1, d], cos / sin [entries, rope/2] -> out [entries, d]. A3 tiling (models.md §3.6): base (M, N, K) =
    (256, 128, 512) for ratio 128, (128, 256, 512) for ratio 4; the pooling walks d in 64- or 128-channel chunks."""

    name: ClassVar[str] = "compressor"
    pool: ClassVar[bool] = True
    options: ClassVar[tuple[str, ...]] = ("rope", "block_rows")
    m: int
    k: int
    n: int
    ratio: int = 4
    overlap: int = 2
    entries: int = 0  # 0 = m // ratio
    rope: int = 64
    block_rows: int = 0
    k_split: ClassVar[int] = 1

    @property
    def rows(self) -> int:
        return self.m

    @property
    def depth(self) -> int:
        return self.k

    @property
    def cols(self) -> int:
        if self.n % (2 * self.overlap) or self.overlap not in (1, 2):
            raise NpusimError(f"compressor: n={self.n} must be 2 * overlap * d with overlap 1 or 2", field="shape")
        return self.n

    @property
    def d(self) -> int:
        return self.n // (2 * self.overlap)

    @property
    def count(self) -> int:
        return self.entries or self.m // self.ratio

    def epilogue_flops(self) -> float:  # per token row: add ape, exp, sum, weigh C, accumulate (+ the entry's norm)
        return 5.0 * self.overlap * self.d + (4.0 * self.d + 3.0 * self.rope) / self.ratio

    def epilogue_bytes(self) -> float:
        return nbytes("bf16", self.d) / self.ratio

    @property
    def chunk(self) -> int:
        """Channels per pooling step: the entry's rows of C and Z double-buffered in UB (64 for ratio 128)."""
        rows = self.overlap * self.ratio
        return min(self.d, next(c for c in (128, 64, 32, 16) if 2 * 2 * 4.0 * rows * c <= 96 * 1024 or c == 16))

    def ub(self, chip: Chip, p: Plan) -> float:
        rows = self.overlap * self.ratio
        return 2 * 2 * 4.0 * rows * self.chunk + 4.0 * self.ratio * self.overlap * self.chunk + 3 * 4.0 * self.d

    def plan(self, chip: Chip) -> Plan:
        """A3 base blocks (models.md §3.6): 256 rows x 128 columns for ratio 128, 128 x 256 for ratio 4; L0 depth
        and L1 tile as deep as the buffers allow (one L0C accumulator: it drains once per N block)."""
        if self.block_rows:
            return super().plan(chip)
        bm, bn = (256, 128) if self.ratio > 4 else (128, 256)
        p = replace(self, block_rows=min(bm, 16 * cdiv(self.m, 16))).plan(chip)
        dt, b = self.cube_dtype, chip.aic.buffers
        bn = min(bn, p.bn)
        bk = next(k for k in (256, 128, 64, 32, 16) if 2 * nbytes(dt, max(p.bm, bn), k) <= min(b.l0a, b.l0b))
        kl1 = bk
        while 2 * kl1 <= self.k and 2 * nbytes(dt, p.bm + bn, 2 * kl1) <= b.l1:
            kl1 *= 2
        nsplit = 1
        blocks = cdiv(self.m, p.bm)
        if blocks * cdiv(self.n, bn) < chip.aic.count:  # decode: narrower column blocks over the cores
            fn = chip.aic.cube.fractal[dt][2]
            bn = fn * cdiv(cdiv(self.n, cdiv(chip.aic.count, blocks)), fn)
            nsplit = cdiv(self.n, bn)
        return Plan(p.bm, bn, bk, kl1, 1, kl1 * cdiv(self.k, kl1), p.er, nsplit)

    def buffers(self, chip: Chip, p: Plan) -> dict[str, float]:
        b = super().buffers(chip, p)
        return b | {"l0c": 4.0 * p.bm * p.bn}  # one accumulator: the block's L0C is written out once per N block

    def tiling_extra(self, p: Plan) -> dict:
        return {"entries": self.count, "pool_channels": self.chunk}

    def after_barrier(self, chip: Chip, p: Plan, barrier) -> Band:
        """One compressed entry per AIV step: per channel chunk its rows' C and Z (and, overlapping, the previous
        block's a-half), pooled; then RMSNorm and RoPE over the whole entry."""
        r, co, d, T, E = self.ratio, self.overlap, self.d, self.rows, self.count
        dc = self.chunk
        bodies = []
        for a in range(2):
            e = lin(("blk", 2), base=a)
            cur = lin(("blk", 2 * r), base=a * r)  # the entry's own rows
            prev = lin(("blk", 2 * r), base=a * r - r, mod=max(T, r))  # the block before (wraps at entry 0: masked)
            ent = Ref("ub.e", (0, 0), (1, d))
            body: list[Node] = [ins("mte2", "load_ape", Act("load", Ref("ub.ape", (0, 0), (r, co * d)),
                                                            (Ref("ape", (0, 0), (r, co * d)),), "fp32"),
                                    bytes=4.0 * r * co * d, dtype="fp32", src="gm", dst="ub", hit=1.0)]
            for c0 in range(0, d, dc):
                srcs = []  # (rows, C column, Z column) of each half pooled into channel c0
                if co == 2:
                    srcs = [(prev, c0, 2 * d + c0), (cur, d + c0, 3 * d + c0)]
                else:
                    srcs = [(cur, c0, d + c0)]
                tiles = []
                for i, (rows, cc, zc) in enumerate(srcs):
                    for what, col in (("c", cc), ("z", zc)):
                        name = f"ub.{what}{i}"
                        tiles.append(Ref(name, (0, 0), (r, dc)))
                        body.append(ins("mte2", f"load_{what}", Act("load", tiles[-1], (Ref("gm.part", (rows, col),
                                                                                           (r, dc), (T, None)),),
                                                                    "fp32"),
                                        bytes=4.0 * r * dc, dtype="fp32", src="gm", dst="ub", hit=1.0,
                                        wait=(f"in.free{a}",) if len(tiles) == 1 else (),
                                        set=(f"in.full{a}",) if len(tiles) == 2 * len(srcs) else ()))
                body.append(ins("vector", "pool", Act("pool", Ref("ub.e", (0, c0), (1, dc)),
                                                      tuple(tiles) + (Ref("ub.ape", (0, 0), (r, co * d)),), "fp32",
                                                      (("entry", e), ("c0", c0), ("d", d))),
                                flops=5.0 * co * r * dc, bytes=4.0 * co * r * dc, dtype="fp32", src="ub", dst="ub",
                                wait=(f"in.full{a}",), set=(f"in.free{a}",)))
            h = self.rope // 2
            body += [ins("mte2", "load_norm", Act("load", Ref("ub.nw", (0, 0), (1, d)), (Ref("norm", (0, 0), (1, d)),),
                                                  "fp32"), bytes=4.0 * d, dtype="fp32", src="gm", dst="ub", hit=1.0),
                     ins("mte2", "load_rope", Act("load", Ref("ub.cs", (0, 0), (1, 2 * h)),
                                                  (Ref("cossin", (e, 0), (1, 2 * h), (E, 2 * h)),), "fp32"),
                         bytes=8.0 * h, dtype="fp32", src="gm", dst="ub"),
                     ins("vector", "norm_rope", Act("norm_rope", Ref("ub.o", (0, 0), (1, d)),
                                                    (ent, Ref("ub.nw", (0, 0), (1, d)), Ref("ub.cs", (0, 0), (1, 2 * h))),
                                                    "bf16", (("rope", self.rope),)),
                         flops=4.0 * d + 3.0 * self.rope, bytes=4.0 * d, dtype="fp32", src="ub", dst="ub",
                         wait=(f"out.free{a}",), set=(f"out.full{a}",)),
                     ins("mte3", "store_entry", Act("store", Ref("out", (e, 0), (1, d), (E, d)),
                                                    (Ref("ub.o", (0, 0), (1, d)),), "bf16"),
                         bytes=nbytes("bf16", d), dtype="bf16", src="ub", dst="gm", wait=(f"out.full{a}",),
                         set=(f"out.free{a}",))]
            bodies.append(tuple(body))
        return Band(cdiv(E, 2), None, tuple(bodies), lead=barrier)
