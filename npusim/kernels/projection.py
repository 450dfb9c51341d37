"""A narrow projection on the cube followed by a vector epilogue over its rows: mHC pre (HcPre), the MoE gate and the
KV Compressor.

One mechanism (`Projected`): token rows are cut into blocks of `bm`; per block the AIC computes the block's
[bm, n] = x[bm, k] @ w[k, n] (K streamed through L1 double-buffered, L0 blocks base_k deep, fp32 in L0C), FIXPIPE
writes it to a GM workspace, and the two AIVs run the op's epilogue on half of the rows each (CV pipeline through
GM, the workspace double-buffered so block b+1's GEMM overlaps block b's epilogue). Decode (blocks fewer than the
cores) splits K instead: every core computes a K range of all rows, writes the partial sum, and after a SyncAll
the vector cores add the partials and run the epilogue on a few rows each (HcPre's decode template, models.md §2.5
[CRI deepseek_v4_mHC_guide.md]); mHC pre on dav-c220 takes this form at every size (its A3 kernel's only
template). The Compressor pools rows of other blocks, so it always takes the second form: all GEMM blocks, SyncAll,
then the pooling over the compressed entries.

mHC pre computes in fp32 (models.md §2.5): its AIVs first convert the block's x to fp32 in a workspace (and sum
its squares for the RMS) — HcPre's "move -> cast -> cube" stage — and the cube multiplies in fp32.

Written on the tile-program layer (npusim.kernels.program): the queues of `Queues` (the cube's L1 / L0 / L0C, x from
the AIVs to the cube and the block's rows back through GM, each AIV's UB in / out) between the stages of `Projected`
and of each op's epilogue; a plan's `buffering` is the depth of the double-buffered ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from npusim.errors import NpusimError
from npusim.kernels.base import Allowed, Band, Kernel, Work, cdiv, nbytes, need_cube, register, tiler_buffers
from npusim.kernels.program import AIC, AIV, Code, Queue, TileProgram, stage
from npusim.kernels.tile import Act, Lin, Ref, lin
from npusim.kernels.trace import Node, Trace
from npusim.spec.chip import Chip

SIGMOID_FLOPS = 4  # exp, add, reciprocal, scale (estimate)
SINKHORN_FLOPS = 3  # per element per half-iteration: sum, add eps, divide (estimate)
TOPK_FLOPS = 8  # per score: group top-2 sums, group selection, top-k compare-select passes (estimate)


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


@dataclass(frozen=True)
class Queues:
    """A projection launch's queues: the cube's L1 tiles, L0A/L0B blocks and L0C accumulators; x in fp32 from the
    AIVs to the cube (mHC pre's cast); the block's GEMM rows from the cube to the AIVs (streaming form); each AIV's
    UB in and out."""

    l1: Queue
    l0: Queue
    l0c: Queue
    x: Queue
    c: Queue
    inq: Queue
    outq: Queue


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
    x_dtype: ClassVar[str] = "bf16"  # x as stored in GM (the cast workspace of `cast` kernels aside)

    def epilogue_flops(self) -> float:
        """Vector FLOPs of the epilogue per row."""
        raise NotImplementedError

    def epilogue_bytes(self) -> float:
        """HBM bytes the epilogue reads and writes per row (besides the GEMM result)."""
        raise NotImplementedError

    def work(self) -> Work:
        T, K, N = self.rows, self.depth, self.cols
        w = nbytes(self.cube_dtype, K, N)
        x = nbytes(self.x_dtype, T, K)
        return Work(2.0 * T * K * N, x + w + T * self.epilogue_bytes(),
                    vector_flops=T * self.epilogue_flops() + (2.0 * T * K if self.cast else 0.0),
                    cube_dtype=self.cube_dtype)

    # ------------------------------------------------------------------ tiling
    def plan(self, chip: Chip) -> Plan:
        """The largest row block (up to 128) whose accumulator double-buffers in L0C and whose epilogue fits UB;
        K split over the cores when the row blocks are fewer than the cores (not when pooling across blocks)."""
        options = self.plans(chip)
        return next((p for p in options if self.fits(chip, p)), options[-1])  # else trace() says by how much

    def plans(self, chip: Chip) -> list[Plan]:
        """The plan of each row block the tiler considers (128, 64, 32, 16 rows, or `block_rows`), largest first:
        L0 blocks and L1 tiles as deep as the tiler fills (`tiler_buffers`)."""
        dt = self.cube_dtype
        need_cube(chip, dt)
        fm, fk, fn = chip.aic.cube.fractal[dt]
        T, K, N = self.rows, self.depth, self.cols
        b = tiler_buffers(chip)
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
            options.append(Plan(bm, bn, bk, kl1, cdiv(K, kr), kr, er))
        return options

    def fits(self, chip: Chip, p: Plan) -> bool:
        return 2 * 4.0 * p.bm * p.bn <= chip.aic.buffers.l0c and self.ub(chip, p) <= chip.aiv.buffers.ub

    def candidates(self, chip: Chip) -> tuple[Kernel, ...]:
        """Every row block that fits, largest first: a larger one leaves the epilogue's vector stream less to
        overlap, so the tuner times them all (the sizes are fixed, so a larger L0C or UB only adds candidates)."""
        if self.block_rows:
            return (self,)
        rows = list(dict.fromkeys(p.bm for p in self.plans(chip) if self.fits(chip, p)))
        return tuple(replace(self, block_rows=bm) for bm in rows) or (self,)

    # ------------------------------------------------------------------ queues
    def queues(self, prog: TileProgram, p: Plan) -> Queues:
        dt = self.cube_dtype
        l1 = (4.0 * p.bm + nbytes(dt, p.bn)) * p.kl1 if self.cast else nbytes(dt, p.bm + p.bn, p.kl1)
        return Queues(
            prog.queue("l1", (AIC, "mte2"), (AIC, "mte1"), depth=2, slot={"l1": l1}),
            prog.queue("l0", (AIC, "mte1"), (AIC, "cube"), depth=2,
                       slot={"l0a": nbytes(dt, p.bm, p.bk), "l0b": nbytes(dt, p.bk, p.bn)}),
            prog.queue("l0c", (AIC, "cube"), (AIC, "fixpipe"), depth=2, slot=self.l0c_slot(p)),
            prog.queue("x", (AIV, "mte3"), (AIC, "mte2"), depth=1),
            prog.queue("c", (AIC, "fixpipe"), (AIV, "mte2"), depth=1),
            prog.queue("in", (AIV, "mte2"), (AIV, "vector"), depth=2),
            prog.queue("out", (AIV, "vector"), (AIV, "mte3"), depth=2))

    def l0c_slot(self, p: Plan) -> dict[str, float]:
        return {"l0c": 4.0 * p.bm * p.bn}

    # ------------------------------------------------------------------ the block GEMM (AIC)
    def gemm(self, c: Code, q: Queues, p: Plan, a: str, rows: Lin, a_k0: Lin, klen: int, out) -> None:
        """[bm, cols] = a[rows .., a_k0 ..] @ w[k0 .., :] over klen (env k0: the weight row of a_k0), per L0C block
        of bn columns written by `out(c, q, p, col, n, split_n)`. The first L1 tile starts the accumulation, the
        others loop."""
        nk = cdiv(klen, p.kl1)
        for col in ([lin(("nb", p.bn))] if p.nsplit > 1 else range(0, self.cols, p.bn)):
            n = p.bn if p.nsplit > 1 else min(p.bn, self.cols - col)
            self.l1_tile(c, q, p, a, rows, a_k0, col, n, ())
            if nk > 1:
                with c.loop(nk - 1, "kt"):
                    self.l1_tile(c, q, p, a, rows, a_k0, col, n, (("kt", p.kl1),))
            c.op("cube", "l0c_done")
            c.enque(q.l0c)
            out(c, q, p, col, n, p.nsplit > 1)

    def l1_tile(self, c: Code, q: Queues, p: Plan, a: str, rows: Lin, a_k0: Lin, col, n: int, kt: tuple) -> None:
        """One L1 tile: the first (kt empty) at a_k0, the looped ones one tile on per 'kt'."""
        base = 0 if not kt else p.kl1
        self.copy_in(c, q, p, Ref(a, (rows, Lin(a_k0.base + base, a_k0.terms + kt)), (p.bm, p.kl1), (self.rows, None)),
                     Ref("w", (lin(("k0", 1), *kt, base=base), col), (p.kl1, n), (lin(("kend", 1)), self.cols)))
        steps = p.kl1 // p.bk
        for s in range(steps):
            self.split_k(c, q, p, s, n, s == steps - 1)
            self.compute(c, q, p, s, n, acc=bool(kt) or s > 0)

    @stage
    def copy_in(self, c: Code, q: Queues, p: Plan, x: Ref, w: Ref) -> None:
        """MTE2: the x tile (fp32 from the cast workspace for mHC pre) and the weight tile into L1."""
        dt, adt, n = self.cube_dtype, "fp32" if self.cast else self.x_dtype, w.size[1]
        w_hit = 1.0 - 1.0 / cdiv(self.rows, p.bm)  # the weight is re-read by every row block: from L2 after the first
        c.alloc(q.l1)
        c.op("mte2", "load_x", Act("load", Ref("l1.a", (0, 0), (p.bm, p.kl1)), (x,), adt),
             bytes=nbytes(adt, p.bm, p.kl1), dtype=adt, src="gm", dst="l1", hit=1.0 if self.cast else 0.0)
        c.op("mte2", "load_w", Act("load", Ref("l1.b", (0, 0), (p.kl1, n)), (w,), dt), bytes=nbytes(dt, p.kl1, n),
             dtype=dt, src="gm", dst="l1", hit=w_hit)
        c.enque(q.l1)

    @stage
    def split_k(self, c: Code, q: Queues, p: Plan, s: int, n: int, last: bool) -> None:
        """MTE1: K step s of the L1 tile into L0A / L0B; the tile is freed after its last step."""
        dt, bm, bk = self.cube_dtype, p.bm, p.bk
        c.alloc(q.l0)
        if s == 0:
            c.deque(q.l1)
        c.op("mte1", "load_l0a", Act("copy", Ref("l0a", (0, 0), (bm, bk)), (Ref("l1.a", (0, s * bk), (bm, bk)),), dt),
             bytes=nbytes(dt, bm, bk), dtype=dt, src="l1", dst="l0a")
        c.op("mte1", "load_l0b", Act("copy", Ref("l0b", (0, 0), (bk, n)), (Ref("l1.b", (s * bk, 0), (bk, n)),), dt),
             bytes=nbytes(dt, bk, n), dtype=dt, src="l1", dst="l0b")
        c.enque(q.l0)
        if last:
            c.free(q.l1)

    @stage
    def compute(self, c: Code, q: Queues, p: Plan, s: int, n: int, acc: bool) -> None:
        """Cube: L0C (+)= L0A @ L0B; the block's first step takes an accumulator."""
        bm, bk, acc_in = p.bm, p.bk, (Ref("l0c", (0, 0), (p.bm, n)),) if acc else ()
        c.deque(q.l0)
        if not acc:
            c.alloc(q.l0c)
        c.op("cube", "mmad", Act("mmad", Ref("l0c", (0, 0), (bm, n)), acc_in + (Ref("l0a", (0, 0), (bm, bk)),
                                                                               Ref("l0b", (0, 0), (bk, n))), "fp32",
                                 (("accumulate", acc),)),
             flops=2.0 * bm * bk * n, dtype=self.cube_dtype, src="l0a", dst="l0c")
        c.free(q.l0)

    @stage
    def store_block(self, c: Code, q: Queues, p: Plan, col: int, n: int, _: bool) -> None:
        """FIXPIPE (streaming form): the block's columns to its GM workspace; the AIVs are told after the last."""
        c.deque(q.l0c)
        if col == 0:
            c.alloc(q.c)
        c.op("fixpipe", "store_c", Act("fixpipe", Ref("ws.c", (0, col), (p.bm, n)), (Ref("l0c", (0, 0), (p.bm, n)),),
                                       "fp32"), bytes=4.0 * p.bm * n, dtype="fp32", src="l0c", dst="gm", hit=1.0)
        c.free(q.l0c)
        if col + n >= self.cols:
            c.enque(q.c)

    @stage
    def store_partial(self, c: Code, q: Queues, p: Plan, col, n: int, split_n: bool) -> None:
        """FIXPIPE (split form): the K range's partial sums beside the other ranges' in GM."""
        cols = lin(("ks", self.cols), ("nb", p.bn)) if split_n else lin(("ks", self.cols), base=col)
        dst = Ref("gm.part", (lin(("r0", 1)), cols), (p.bm, n), (self.rows, None))
        c.deque(q.l0c)
        c.op("fixpipe", "store_partial", Act("fixpipe", dst, (Ref("l0c", (0, 0), (p.bm, n)),), "fp32"),
             bytes=4.0 * p.bm * n, dtype="fp32", src="l0c", dst="gm", hit=1.0)
        c.free(q.l0c)

    # ------------------------------------------------------------------ trace
    def build(self, chip: Chip) -> Trace:
        p = self.plan(chip)
        prog = TileProgram(self.name, chip, self.buffering)
        q = self.queues(prog, p)
        bands = [self.streaming(prog, q, p)] if p.ksplit == 1 and not self.phased(chip) else \
            self.split(prog, q, chip, p)
        w = self.work()
        return Trace(self.name, chip.name, self.shape, prog.groups(bands, chip.aic.count), w.cube_flops,
                     w.hbm_bytes, self.buffers(prog, chip, p),
                     {"block_rows": p.bm, "base_n": p.bn, "base_k": p.bk, "k_l1": p.kl1, "k_split": p.ksplit,
                      "epilogue_rows": p.er, "n_split": p.nsplit} | self.tiling_extra(p) | prog.tiling(),
                     dtype=self.cube_dtype)

    def tiling_extra(self, p: Plan) -> dict:
        return {}

    def phased(self, chip: Chip) -> bool:
        """Every GEMM block first, a SyncAll, then the epilogue (the split form) even when K is not split."""
        return self.pool

    def buffers(self, prog: TileProgram, chip: Chip, p: Plan) -> dict[str, float]:
        return prog.buffers() | {"ub": self.ub(chip, p)}

    def ub(self, chip: Chip, p: Plan) -> float:
        raise NotImplementedError

    @stage
    def cast_rows(self, v: Code, q: Queues, p: Plan, r0: Lin, klen: int, ss_out: Ref | None) -> None:
        """This AIV converts its half of the block's x (K range from env k0) to fp32 into the workspace the cube
        reads, summing squares for the RMS; the cube is told once its half is in."""
        half, T, a = cdiv(p.bm, 2), self.rows, v.aiv
        kc = min(cast_chunk(half), klen)
        n = cdiv(klen, kc)
        v.op("vector", "ss_init", Act("zero", Ref("ub.ss", (0, 0), (half, 1))), bytes=4.0 * half, dtype="fp32",
             src="ub", dst="ub")
        for j in range(n):
            v.alloc(q.inq)
            v.op("mte2", "load_x", Act("load", Ref("ub.x", (0, 0), (half, kc)),
                                       (Ref("x", (r0, lin(("k0", 1), base=j * kc)), (half, kc),
                                            (T, lin(("kend", 1)))),), "bf16"),
                 bytes=nbytes("bf16", half, kc), dtype="bf16", src="gm", dst="ub")
            v.enque(q.inq)
            v.deque(q.inq)
            v.alloc(q.outq)
            v.op("vector", "cast", Act("cast_ss", Ref("ub.xf", (0, 0), (half, kc + 1)),
                                       (Ref("ub.x", (0, 0), (half, kc)), Ref("ub.ss", (0, 0), (half, 1))), "fp32"),
                 flops=2.0 * half * kc, bytes=4.0 * half * kc, dtype="fp32", src="ub", dst="ub")
            v.free(q.inq)
            v.op("vector", "keep_ss", Act("copy", Ref("ub.ss", (0, 0), (half, 1)), (Ref("ub.xf", (0, kc), (half, 1)),),
                                          "fp32"), bytes=4.0 * half, dtype="fp32", src="ub", dst="ub")
            v.enque(q.outq)
            v.deque(q.outq)
            if j == 0:
                v.alloc(q.x)
            v.op("mte3", "store_xf", Act("store", Ref("ws.xf", (a * half, j * kc), (half, kc)),
                                         (Ref("ub.xf", (0, 0), (half, kc)),), "fp32"),
                 bytes=4.0 * half * kc, dtype="fp32", src="ub", dst="gm", hit=1.0)
            v.free(q.outq)
            if j == n - 1:
                v.enque(q.x)
        if ss_out is not None:
            v.op("mte3", "store_ss", Act("store", ss_out, (Ref("ub.ss", (0, 0), (half, 1)),), "fp32"),
                 bytes=4.0 * half, dtype="fp32", src="ub", dst="gm", hit=1.0)

    def cube_program(self, prog: TileProgram, q: Queues, p: Plan, a_k0: Lin, klen: int, out, **head: Lin) -> Code:
        """The AIC's block: (the cast halves awaited,) the GEMM, (the cast workspace given back)."""
        c = prog.code(AIC)
        c.addr(**head)
        if self.cast:  # the cube starts a block once both AIVs converted their halves of x
            c.deque(q.x)
            c.op("mte2", "wait_x")
        a_name, a_rows = ("ws.xf", Lin(0)) if self.cast else ("x", lin(("r0", 1)))
        self.gemm(c, q, p, a_name, a_rows, Lin(0) if self.cast else a_k0, klen, out)
        if self.cast:
            c.op("mte2", "free_x")
            c.free(q.x)
        return c

    def streaming(self, prog: TileProgram, q: Queues, p: Plan) -> Band:
        """Row blocks: (cast,) GEMM to the block workspace, epilogue on the AIVs."""
        T, K, N = self.rows, self.depth, self.cols
        half = cdiv(p.bm, 2)
        head = dict(k0=Lin(0), kend=Lin(K), r0=lin(("blk", p.bm)))
        aic = self.cube_program(prog, q, p, Lin(0), K, self.store_block, **head)
        aiv = []
        for a in range(2):
            v, r0 = prog.code(AIV, a), lin(("r0", 1), base=a * half)
            v.addr(**head)
            if self.cast:
                self.cast_rows(v, q, p, r0, K, None)
            self.epilogue(v, q, p, r0, half, Ref("ws.c", (a * half, 0), (half, N)), 1, "c")
            aiv.append(v.body())
        return Band(cdiv(T, p.bm), aic.body(), tuple(aiv))

    def split(self, prog: TileProgram, q: Queues, chip: Chip, p: Plan) -> list[Band]:
        """Split K (or, pooling, row blocks) over the cores, partial sums to GM, SyncAll, epilogue on all AIVs."""
        T, half = self.rows, cdiv(p.bm, 2)
        head = dict(ks=lin(("blk", 1), mod=p.ksplit), nb=lin(("blk", 1), div=p.ksplit, mod=p.nsplit),
                    rb=lin(("blk", 1), div=p.ksplit * p.nsplit), k0=lin(("ks", p.kr)),
                    kend=lin(("ks", p.kr), base=p.kr), r0=lin(("rb", p.bm)))
        aic = self.cube_program(prog, q, p, lin(("k0", 1)), p.kr, self.store_partial, **head)
        aiv: tuple = ((), ())  # no AIV work in the GEMM phase unless casting
        if self.cast:
            codes = [prog.code(AIV, a) for a in range(2)]
            for a, v in enumerate(codes):
                v.addr(**head)
                self.cast_rows(v, q, p, lin(("r0", 1), base=a * half), p.kr,
                               Ref("gm.ss", (lin(("r0", 1), base=a * half), lin(("ks", 1))), (half, 1), (T, None)))
            aiv = tuple(v.body() for v in codes)
        barrier = tuple(sync_all(prog, a) for a in range(2))
        return [Band(cdiv(T, p.bm) * p.ksplit * p.nsplit, aic.body(), aiv), self.after_barrier(prog, q, p, barrier)]

    def after_barrier(self, prog: TileProgram, q: Queues, p: Plan, barrier: tuple) -> Band:
        """Epilogue tiles of `er` rows over all AIVs, adding the K partials first."""
        T, N, er = self.rows, self.cols, p.er
        bodies = []
        for a in range(2):
            v, r0 = prog.code(AIV, a), lin(("blk", 2 * er), base=a * er)
            self.epilogue(v, q, p, r0, er, Ref("gm.part", (r0, 0), (er, N * p.ksplit), (T, None)), p.ksplit, "part")
            bodies.append(v.body())
        return Band(cdiv(T, 2 * er), None, tuple(bodies), lead=barrier)

    def epilogue(self, v: Code, q: Queues, p: Plan, r0: Lin, rows: int, c: Ref, parts: int, source: str) -> None:
        """This AIV on `rows` rows from r0: the GEMM result c ([rows, cols] or `parts` K partials side by side)."""
        raise NotImplementedError

    def c_copies(self, chip: Chip, rows: int, parts: int) -> int:
        """DMA instructions that bring `rows` rows of the K partials into UB (one strided copy by default)."""
        return 1

    @stage
    def load_c(self, v: Code, q: Queues, rows: int, c: Ref, parts: int, source: str) -> None:
        """The GEMM rows into ub.c (K partials summed), after the cube's hand-off in the streaming form."""
        N, stream = self.cols, source == "c"
        v.alloc(q.inq)
        if stream:
            v.deque(q.c)
        v.op("mte2", "load_c", Act("load", Ref("ub.cp", (0, 0), (rows, N * parts)), (c,), "fp32"),
             bytes=4.0 * rows * N * parts, dtype="fp32", src="gm", dst="ub", hit=1.0,
             issues=self.c_copies(v.prog.chip, rows, parts) if source == "part" else 1)
        v.enque(q.inq)
        if stream:
            v.free(q.c)
        v.deque(q.inq)
        v.op("vector", "sum_parts", Act("sum_parts", Ref("ub.c", (0, 0), (rows, N)),
                                        (Ref("ub.cp", (0, 0), (rows, N * parts)),), "fp32", (("parts", parts),)),
             flops=1.0 * rows * N * (parts - 1), bytes=4.0 * rows * N * parts, dtype="fp32", src="ub", dst="ub")
        v.free(q.inq)


def sync_all(prog: TileProgram, a: int) -> tuple[Node, ...]:
    """AIV a's SyncAll barrier before the epilogue phase."""
    v = prog.code(AIV, a)
    v.sync_all()
    return v.body()


def cast_chunk(rows: int) -> int:
    """Columns per cast step: bf16 in and fp32 out double-buffered in well under the 192 KiB UB (dav-c220)."""
    return next(k for k in (512, 256, 128, 64) if 2 * rows * k * (2 + 4) <= 160 * 1024 or k == 64)


# ------------------------------------------------------------------------------------------------------ mHC pre
@register
@dataclass(frozen=True)
class MhcPre(Projected):
    """mHC pre (HcPre, models.md §2.5): x [tokens, streams*hidden] (the n residual streams), fn [streams*hidden,
    mix] (hc_fn^T), hc [1, 3 + mix] (scales a0 a1 a2, then the base b) -> y [tokens, hidden] = sum_j pre_j X_j,
    post [tokens, streams], res [tokens, streams^2] (H_res after `sinkhorn_iters` Sinkhorn-Knopp iterations).
    mix = n (the LM head's hc_head: pre only) or (2+n)n. `eps`: hc_eps (pre + eps, the Sinkhorn's); `norm_eps`: the
    RMS of x (V4's norm_eps), both 1e-6 in V4."""

    name: ClassVar[str] = "mhc_pre"
    options: ClassVar[tuple[str, ...]] = ("eps", "norm_eps", "block_rows", "k_split", "buffering")
    limits: ClassVar[dict[str, Allowed]] = {"sinkhorn_iters": Allowed(low=0)}  # 0: the LM head's hc_head (no H_res)
    cast: ClassVar[bool] = True
    cube_dtype: ClassVar[str] = "fp32"
    tokens: int
    streams: int = 4
    hidden: int = 4096
    mix: int = 24
    sinkhorn_iters: int = 20
    eps: float = 1e-6
    norm_eps: float = 1e-6
    block_rows: int = 0  # 0 = the plan's
    k_split: int = 0  # K ranges over the cores: 0 = when row blocks are fewer than the cores
    buffering: int = 0  # depth of the double-buffered queues (0 = 2, as written)

    @property
    def rows(self) -> int:
        return self.tokens

    @property
    def depth(self) -> int:
        return self.streams * self.hidden

    @property
    def cols(self) -> int:
        return self.mix

    def eps_args(self) -> tuple[tuple[str, float], ...]:
        """hc_mix's eps arguments where they differ from the ops' default 1e-6 (so default traces keep theirs)."""
        return self.hc_eps_args() + ((("norm_eps", self.norm_eps),) if self.norm_eps != 1e-6 else ())

    def hc_eps_args(self) -> tuple[tuple[str, float], ...]:
        return (("eps", self.eps),) if self.eps != 1e-6 else ()

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

    @staticmethod
    def stepwise(chip: Chip) -> bool:
        """The second stage walks rows in steps of small dependent instructions: the A2/A3 HcPre
        (hc_pre_m_k_split_core.h). The 950's (hc_pre_m_k_split_core_arch35.h) copies the partials with one loop-mode
        DMA and computes in register-based vector functions: not counted (one instruction per op)."""
        return chip.arch == "dav-c220"

    def phased(self, chip: Chip) -> bool:
        """The A2/A3 HcPre has one template (hc_pre.cpp, tiling key 0): Part1 (cast + GEMM of every row block,
        SyncAll) then Part2 (the mixes, Sinkhorn and pre-sum), so prefill never overlaps its epilogue with the next
        block's GEMM; the 950's streams blocks."""
        return self.stepwise(chip)

    def row_factor(self, chip: Chip, parts: int) -> int:
        """Rows per step of the A3 HcPre's second stage (hc_pre_tiling.cpp, CalcMKSplitCoreMembasePart2Tiling): as
        many as fit UB with d whole — per row x (bf16, double-buffered) and its fp32 copy, y likewise, and the K
        partials of the mixes and squares (small terms rounded up); one row when even that does not fit (d split)."""
        n, d = self.streams, self.hidden
        per_row = 8 * n * d + 8 * d + (256 + 64 * n) * parts + 64 * (n + 2)
        return max(1, int(chip.aiv.buffers.ub - 1024) // per_row)

    def groups(self, rows: int, rf: int) -> list[int]:
        """The row steps of `rows` rows, rf at a time (the last one short)."""
        return [min(rf, rows - g) for g in range(0, rows, rf)]

    def mix_chain(self, r: int, parts: int) -> int:
        """Dependent vector instructions of one row step of r rows before the Sinkhorn iterations (hc_pre_m_k_split_core.h
        Part2 with hc_pre_base.h's helpers, each behind a PipeBarrier<PIPE_V>): the K partials of the squares
        (a DataCopy + K-1 Adds) and the 1/rms (GatherMask, Muls, Adds, Sqrt, Duplicate, Div), the partials of pre and
        post (a DataCopy + 2(K-1) Adds), pre and post (Brcb, Mul, Muls, Add, the sigmoid's Duplicate, Muls, Exp,
        Adds, Div, the final Adds / Muls), the partials of H_res (a DataCopy + K-1 Adds), its scale, base and
        row softmax (ReduceMax, Brcb, Sub, Exp, ReduceSum, Brcb, Div, Adds) and the first column normalisation
        (DataCopy + 3r Adds, Adds, r Divs), and the pre-sum y of the step (4r casts, Brcb, 4r Muls, DataCopy, 3r Adds,
        r casts). mix = streams (the head's pre only): squares, pre and the pre-sum."""
        if not self.full:
            return (parts + 7) + parts + 11 + (12 * r + 2)
        return (parts + 7) + (2 * parts - 1) + 11 + 10 + (parts + 14 + 4 * r) + (12 * r + 2)

    def c_copies(self, chip: Chip, rows: int, parts: int) -> int:
        """Part2 copies each row's H_res partials of every K range on its own (a 4 x 4 tile per DataCopyPad), the pre
        and post partials one copy per K range, the squares in one: per row step K(r + 2) + 1 instructions."""
        if not self.stepwise(chip):
            return 1
        return sum(parts * (r + 2) + 1 for r in self.groups(rows, self.row_factor(chip, parts)))

    def epilogue(self, v: Code, q: Queues, p: Plan, r0: Lin, rows: int, c: Ref, parts: int, source: str) -> None:
        self.load_c(v, q, rows, c, parts, source)
        self.mixes(v, p, r0, rows, source)
        kc = min(512, self.hidden)
        for c0 in range(0, self.hidden, kc):
            self.presum(v, q, r0, rows, c0, kc)

    @stage
    def mixes(self, v: Code, p: Plan, r0: Lin, rows: int, source: str) -> None:
        """pre, post and H_res of the rows from the GEMM and the RMS (the K ranges' sums of squares first, split
        form), then the Sinkhorn-Knopp iterations (the first one's columns are part of hc_mix)."""
        n, d, mix, T = self.streams, self.hidden, self.mix, self.rows
        m = Ref("ub.m", (0, 0), (rows, 2 * n + n * n))
        if source == "part":
            ssp = Ref("ub.ssp", (0, 0), (rows, p.ksplit))
            v.op("mte2", "load_ss", Act("load", ssp, (Ref("gm.ss", (r0, 0), (rows, p.ksplit), (T, None)),), "fp32"),
                 bytes=4.0 * rows * p.ksplit, dtype="fp32", src="gm", dst="ub", hit=1.0)
            v.op("vector", "sum_ss", Act("sum_parts", Ref("ub.ss", (0, 0), (rows, 1)), (ssp,), "fp32",
                                         (("parts", p.ksplit),)),
                 flops=1.0 * rows * p.ksplit, bytes=4.0 * rows * p.ksplit, dtype="fp32", src="ub", dst="ub")
        parts = p.ksplit if source == "part" else 1
        steps, stepwise = self.groups(rows, self.row_factor(v.prog.chip, parts)), self.stepwise(v.prog.chip)
        hc = Ref("ub.hc", (0, 0), (1, 3 + mix))
        v.op("mte2", "load_hc", Act("load", hc, (Ref("hc", (0, 0), (1, 3 + mix)),), "fp32"), bytes=4.0 * (3 + mix),
             dtype="fp32", src="gm", dst="ub", hit=1.0)
        v.op("vector", "hc_mix", Act("hc_mix", m, (Ref("ub.c", (0, 0), (rows, mix)), Ref("ub.ss", (0, 0), (rows, 1)),
                                                  hc), "fp32", (("streams", n), ("dim", n * d)) + self.eps_args()),
             flops=rows * (SIGMOID_FLOPS * mix + 6.0 * n * n), bytes=4.0 * rows * mix, dtype="fp32", src="ub",
             dst="ub", issues=sum(self.mix_chain(r, parts) for r in steps) if stepwise else 1)
        if self.full and self.sinkhorn_iters > 1:
            # per row step and iteration: WholeReduceSum, Adds, Brcb, Div over the rows; a DataCopy, 3r Adds, Adds
            # and r Divs over the columns (hc_pre_m_k_split_core.h's Sinkhorn loop)
            chain = {"rows": 4 * len(steps), "cols": sum(2 + 4 * r for r in steps)} if stepwise else \
                {"rows": 1, "cols": 1}
            with v.loop(self.sinkhorn_iters - 1):
                for axis in ("rows", "cols"):
                    v.op("vector", f"sinkhorn_{axis}", Act("sinkhorn", m, (m,), "fp32",
                                                           (("streams", n), ("axis", axis)) + self.hc_eps_args()),
                         flops=SINKHORN_FLOPS * rows * n * n, bytes=4.0 * rows * n * n, dtype="fp32", src="ub",
                         dst="ub", issues=chain[axis])

    @stage
    def presum(self, v: Code, q: Queues, r0: Lin, rows: int, c0: int, kc: int) -> None:
        """y = sum_j pre_j X_j over columns c0 .. c0+kc, streaming x again (L2 hits: the cast phase read these rows
        moments before); post and H_res go out with the first chunk."""
        n, d, stop = self.streams, self.hidden, (self.rows, None)
        y, x, m = Ref("ub.y", (0, 0), (rows, kc)), Ref("ub.x", (0, 0), (rows, kc)), Ref("ub.m", (0, 0),
                                                                                        (rows, 2 * n + n * n))
        v.alloc(q.outq)
        v.op("vector", "y_init", Act("zero", y), bytes=4.0 * rows * kc, dtype="fp32", src="ub", dst="ub")
        for j in range(n):
            v.alloc(q.inq)
            v.op("mte2", "load_x", Act("load", x, (Ref("x", (r0, j * d + c0), (rows, kc), stop),), "bf16"),
                 bytes=nbytes("bf16", rows, kc), dtype="bf16", src="gm", dst="ub", hit=1.0)
            v.enque(q.inq)
            v.deque(q.inq)
            v.op("vector", "presum", Act("presum", y, (y, x, m), "fp32", (("stream", j),)), flops=2.0 * rows * kc,
                 bytes=4.0 * rows * kc, dtype="fp32", src="ub", dst="ub")
            v.free(q.inq)
        v.enque(q.outq)
        v.deque(q.outq)
        v.op("mte3", "store_y", Act("store", Ref("y", (r0, c0), (rows, kc), stop), (y,), "bf16"),
             bytes=nbytes("bf16", rows, kc), dtype="bf16", src="ub", dst="gm")
        v.free(q.outq)
        if c0 == 0:
            v.op("mte3", "store_post", Act("store", Ref("post", (r0, 0), (rows, n), stop),
                                           (Ref("ub.m", (0, n), (rows, n)),), "fp32"),
                 bytes=4.0 * rows * n, dtype="fp32", src="ub", dst="gm")
            v.op("mte3", "store_res", Act("store", Ref("res", (r0, 0), (rows, n * n), stop),
                                          (Ref("ub.m", (0, 2 * n), (rows, n * n)),), "fp32"),
                 bytes=4.0 * rows * n * n, dtype="fp32", src="ub", dst="gm")


# ------------------------------------------------------------------------------------------------------ MoE gate
SCORES = ("sigmoid", "sqrtsoftplus")
GROUP_SCORES = ("top2", "max")  # a group's rank: sum of its two best biased scores, or its best (no bias)
GATE_DTYPES = ("bf16", "fp32")  # the GEMM's operands: bf16, or fp32 as DeepSeek's Gate (linear(x.float(), w.float()))


@register
@dataclass(frozen=True)
class MoeGate(Projected):
    """MoE routing (models.md §1.2.1, §2.6): logits = x [m, k] @ w [k, n]; s = sigmoid (V3) or sqrt(softplus) (V4);
    idx = top-k of s + bias, limited to the best `limit` of `groups` expert groups (`group_score` top2: the sum of a
    group's two best, DeepSeek's Gate with its correction bias; max: its best, the Gate without a bias)
    — or, hash layers, idx = the token's fixed row of the tid2eid table (hash_idx [m, topk]); weights =
    s[idx] / sum * route_scale. bias [1, n] -> weights [m, topk], indices [m, topk]. `dtype` fp32 runs the GEMM on
    fp32 x and weights (the reference's linear(x.float(), weight.float())) at the cube's fp32 rate."""

    name: ClassVar[str] = "moe_gate"
    options: ClassVar[tuple[str, ...]] = ("score", "limit", "route_scale", "group_score", "dtype", "block_rows",
                                          "k_split", "buffering")
    m: int
    k: int
    n: int
    topk: int = 8
    hash: int = 0
    groups: int = 1
    score: str = "sigmoid"
    limit: int = 0  # groups kept; 0 = half of them
    route_scale: float = 1.0
    group_score: str = "top2"
    dtype: str = "bf16"
    block_rows: int = 0
    k_split: int = 0
    buffering: int = 0

    @property
    def cube_dtype(self) -> str:  # type: ignore[override]
        return self.dtype

    @property
    def x_dtype(self) -> str:  # type: ignore[override]
        return self.dtype

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
        if self.group_score not in GROUP_SCORES:
            raise NpusimError(f"moe_gate: group_score must be one of {', '.join(GROUP_SCORES)}, got "
                              f"{self.group_score}", field="group_score")
        if self.dtype not in GATE_DTYPES:
            raise NpusimError(f"moe_gate: dtype must be one of {', '.join(GATE_DTYPES)}, got {self.dtype}",
                              field="dtype")
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

    @stage
    def epilogue(self, v: Code, q: Queues, p: Plan, r0: Lin, rows: int, c: Ref, parts: int, source: str) -> None:
        T, n, k = self.rows, self.n, self.topk
        g = Ref("ub.g", (0, 0), (rows, 2 * k))
        self.load_c(v, q, rows, c, parts, source)
        extra: tuple[Ref, ...] = ()
        if self.hash:
            extra = (Ref("ub.h", (0, 0), (rows, k)),)
            v.op("mte2", "load_hash", Act("load", extra[0], (Ref("hash_idx", (r0, 0), (rows, k), (T, k)),), "int32"),
                 bytes=4.0 * rows * k, dtype="int32", src="gm", dst="ub")
        v.op("mte2", "load_bias", Act("load", Ref("ub.bias", (0, 0), (1, n)), (Ref("bias", (0, 0), (1, n)),), "fp32"),
             bytes=4.0 * n, dtype="fp32", src="gm", dst="ub", hit=1.0)
        v.alloc(q.outq)
        v.op("vector", "gate", Act("gate", g, (Ref("ub.c", (0, 0), (rows, n)), Ref("ub.bias", (0, 0), (1, n))) + extra,
                                   "fp32", (("topk", k), ("groups", self.groups),
                                            ("limit", self.limit or max(1, self.groups // 2)), ("score", self.score),
                                            ("route_scale", self.route_scale))
                                   + ((("group_score", self.group_score),) if self.group_score != "top2" else ())),
             flops=rows * self.epilogue_flops(), bytes=4.0 * rows * n, dtype="fp32", src="ub", dst="ub")
        v.enque(q.outq)
        v.deque(q.outq)
        v.op("mte3", "store_weights", Act("store", Ref("weights", (r0, 0), (rows, k), (T, k)),
                                          (Ref("ub.g", (0, 0), (rows, k)),), "fp32"),
             bytes=4.0 * rows * k, dtype="fp32", src="ub", dst="gm")
        v.op("mte3", "store_indices", Act("store", Ref("indices", (r0, 0), (rows, k), (T, k)),
                                          (Ref("ub.g", (0, k), (rows, k)),), "int32"),
             bytes=4.0 * rows * k, dtype="int32", src="ub", dst="gm")
        v.free(q.outq)


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
    options: ClassVar[tuple[str, ...]] = ("rope", "block_rows", "buffering")
    m: int
    k: int
    n: int
    ratio: int = 4
    overlap: int = 2
    entries: int = 0  # 0 = m // ratio
    rope: int = 64
    block_rows: int = 0
    buffering: int = 0
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

    def candidates(self, chip: Chip) -> tuple[Kernel, ...]:
        """The A3 base blocks are the kernel's own (`plan`): nothing to choose."""
        return (self,)

    def plan(self, chip: Chip) -> Plan:
        """A3 base blocks (models.md §3.6): 256 rows x 128 columns for ratio 128, 128 x 256 for ratio 4; L0 depth
        and L1 tile as deep as the buffers a tiler fills allow (`tiler_buffers`; one L0C accumulator: it drains once
        per N block)."""
        if self.block_rows:
            return super().plan(chip)
        bm, bn = (256, 128) if self.ratio > 4 else (128, 256)
        p = replace(self, block_rows=min(bm, 16 * cdiv(self.m, 16))).plan(chip)
        dt, b = self.cube_dtype, tiler_buffers(chip)
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

    def l0c_slot(self, p: Plan) -> dict[str, float]:
        """One accumulator (the block's L0C is written out once per N block), reported in `buffers`; known issue:
        the L0C queue still runs two deep, so FIXPIPE's write-out overlaps the next N block's accumulation as if a
        second accumulator were there (kept so predictions do not move in the tile-program rewrite)."""
        return {}

    def buffers(self, prog: TileProgram, chip: Chip, p: Plan) -> dict[str, float]:
        return super().buffers(prog, chip, p) | {"l0c": 4.0 * p.bm * p.bn}

    def tiling_extra(self, p: Plan) -> dict:
        return {"entries": self.count, "pool_channels": self.chunk}

    def after_barrier(self, prog: TileProgram, q: Queues, p: Plan, barrier: tuple) -> Band:
        """One compressed entry per AIV step: per channel chunk its rows' C and Z (and, overlapping, the previous
        block's a-half), pooled; then RMSNorm and RoPE over the whole entry."""
        r, co, d = self.ratio, self.overlap, self.d
        bodies = []
        for a in range(2):
            v = prog.code(AIV, a)
            v.op("mte2", "load_ape", Act("load", Ref("ub.ape", (0, 0), (r, co * d)), (Ref("ape", (0, 0), (r, co * d)),),
                                         "fp32"), bytes=4.0 * r * co * d, dtype="fp32", src="gm", dst="ub", hit=1.0)
            for c0 in range(0, d, self.chunk):
                self.pool_chunk(v, q, c0)
            self.norm_rope(v, q)
            bodies.append(v.body())
        return Band(cdiv(self.count, 2), None, tuple(bodies), lead=barrier)

    @stage
    def pool_chunk(self, v: Code, q: Queues, c0: int) -> None:
        """Channels c0 .. c0+chunk of the entry: C and Z of its rows (and of the previous block's, overlapping)."""
        r, co, d, T, dc, a = self.ratio, self.overlap, self.d, self.rows, self.chunk, v.aiv
        cur = lin(("blk", 2 * r), base=a * r)  # the entry's own rows
        prev = lin(("blk", 2 * r), base=a * r - r, mod=max(T, r))  # the block before (wraps at entry 0: masked)
        srcs = [(prev, c0, 2 * d + c0), (cur, d + c0, 3 * d + c0)] if co == 2 else [(cur, c0, d + c0)]
        tiles = []
        v.alloc(q.inq)
        for i, (rows, cc, zc) in enumerate(srcs):
            for what, col in (("c", cc), ("z", zc)):
                tiles.append(Ref(f"ub.{what}{i}", (0, 0), (r, dc)))
                v.op("mte2", f"load_{what}", Act("load", tiles[-1], (Ref("gm.part", (rows, col), (r, dc), (T, None)),),
                                                 "fp32"), bytes=4.0 * r * dc, dtype="fp32", src="gm", dst="ub",
                     hit=1.0)
        v.enque(q.inq)
        v.deque(q.inq)
        v.op("vector", "pool", Act("pool", Ref("ub.e", (0, c0), (1, dc)), tuple(tiles) + (Ref("ub.ape", (0, 0),
                                                                                            (r, co * d)),),
                                   "fp32", (("entry", lin(("blk", 2), base=a)), ("c0", c0), ("d", d))),
             flops=5.0 * co * r * dc, bytes=4.0 * co * r * dc, dtype="fp32", src="ub", dst="ub")
        v.free(q.inq)

    @stage
    def norm_rope(self, v: Code, q: Queues) -> None:
        """RMSNorm over the entry's d channels and RoPE on its last `rope` at the entry's first position."""
        d, E, h = self.d, self.count, self.rope // 2
        e = lin(("blk", 2), base=v.aiv)
        v.op("mte2", "load_norm", Act("load", Ref("ub.nw", (0, 0), (1, d)), (Ref("norm", (0, 0), (1, d)),), "fp32"),
             bytes=4.0 * d, dtype="fp32", src="gm", dst="ub", hit=1.0)
        v.op("mte2", "load_rope", Act("load", Ref("ub.cs", (0, 0), (1, 2 * h)),
                                      (Ref("cossin", (e, 0), (1, 2 * h), (E, 2 * h)),), "fp32"),
             bytes=8.0 * h, dtype="fp32", src="gm", dst="ub")
        v.alloc(q.outq)
        v.op("vector", "norm_rope", Act("norm_rope", Ref("ub.o", (0, 0), (1, d)),
                                        (Ref("ub.e", (0, 0), (1, d)), Ref("ub.nw", (0, 0), (1, d)),
                                         Ref("ub.cs", (0, 0), (1, 2 * h))), "bf16", (("rope", self.rope),)),
             flops=4.0 * d + 3.0 * self.rope, bytes=4.0 * d, dtype="fp32", src="ub", dst="ub")
        v.enque(q.outq)
        v.deque(q.outq)
        v.op("mte3", "store_entry", Act("store", Ref("out", (e, 0), (1, d), (E, d)), (Ref("ub.o", (0, 0), (1, d)),),
                                        "bf16"), bytes=nbytes("bf16", d), dtype="bf16", src="ub", dst="gm")
        v.free(q.outq)
