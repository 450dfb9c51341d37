"""Lightning Indexer: I[t,s] = sum_j w[t,j] ReLU(q[t,j] . k[s]) and its exact top-k per token (models.md §1.3).

Huawei's tiling with the head reduction on the cube ("Mat-Duce", models.md §3.4): a basic block of `block_m` query
rows (block_m / heads tokens x heads) by `block_n` keys. The AIC keeps Q resident in L1 and triple-buffers K in
half-tile slices; per L0 chunk (c_m rows = whole tokens, c_n keys) C1 = Q K^T goes to L0C, FIXPIPE applies ReLU
(and the INT8/FP8 dequant, DEQF16) on its way into L1 as fp16 S', and a second cube matmul P = W~ S' over the heads
(W~ block-diagonal: each token's head weights, with the per-token-head query scales folded in) leaves only the
head-summed [tokens x keys] scores. Those go through a small GM/L2 workspace to the two AIVs, which apply the key
scale (quantised variants) and the causal mask and merge them into a running exact top-k, whose cost follows the
sort/merge model (A2/A3) or radix select (950).

How the launch is cut into units of equal work, each one loop of key-tile steps:
  * decode and short prefills (few query blocks): smaller blocks, and each block's keys split into ranges over the
    cores (as many as pay for their merge); each range yields a partial top-k in GM, and after an all-core barrier
    (SyncAll) one vector core per token merges the ranges;
  * causal prefill: query blocks qb and nq-1-qb share a unit (their key tiles sum to a constant), so the causal
    triangle is one loop of identical units, Q of both resident; each step selects its query block and key tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from npusim.errors import NpusimError
from npusim.kernels.base import (Band, Kernel, Work, addr, capacity, cdiv, distribute, ins, nbytes, need_cube,
                                 pingpong, register, scaled)
from npusim.kernels.tile import Act, Lin, Ref, lin
from npusim.kernels.trace import Node, Trace
from npusim.spec.chip import Chip

QUANTISED = ("int8", "fp8")  # q and k with per-(token, head) and per-key scales (models.md §1.3, §3.4)
DEQ = 2.0 ** -10  # DEQF16: S' = fp16(S / 1024) for the quantised variants (models.md §3.4); 1024 folded into W~
SCORE_DT = "fp16"  # S' and W~ in L1, the dtype of the head-reduction matmul (models.md §3.4 DEQF16)
PREFILL_ROWS = 512  # query rows of Huawei's basic block (models.md §3.4)
LAG = 2  # key chunks by which the head reduction trails C1 (FIXPIPE and MTE1 bring S' into L0B meanwhile)
ELEMENT = {"bf16": "bf16", "fp16": "fp16", "int8": "int8", "fp8": "fp8e4m3"}  # functional format of q and k


def topk_cycles(chip: Chip, k: int, presorted: bool = False) -> tuple[float, float]:
    """(cycles per candidate key, fixed cycles per row) of an exact top-k, models.md §3.4: A2/A3 VBS32 + VMS4
    (1.36 Sk + 3.32 k + ceil(max(log2 k - 5, 0)/2) Sk)/2; 950 radix select (Sk/256)*111 + 192. Candidates that come
    as sorted k-lists (a merge of partial top-ks) skip the VMS4 levels that build k-runs (estimate: the 1.36 term
    stays, the run-building term goes)."""
    if chip.family == "950":
        return 111 / 256, 192.0
    runs = 0 if presorted else math.ceil(max(math.log2(max(k, 1)) - 5, 0) / 2)
    return (1.36 + runs) / 2, 3.32 * k / 2


@dataclass(frozen=True)
class Plan:
    """How one launch is cut. Blocks of `tb` tokens (rows = tb x heads) by `bn` keys per step; L0 chunks of `tpc`
    whole tokens (c_m rows) by c_n keys; `nr` row chunks, the first `split` of them for AIV0; key ranges `splits`
    per query block (each `tps` tiles); `paired`: causal units of two query blocks."""

    tb: int
    rows: int
    tpc: int
    c_m: int
    c_n: int
    nr: int
    split: int
    bn: int
    nq: int
    full: int
    splits: int
    tps: int
    paired: bool

    @property
    def parts(self) -> int:
        return 2 if self.paired else 1

    def tokens_of(self, a: int) -> tuple[int, int]:
        """(first token, tokens) of AIV a in a block."""
        first = 0 if a == 0 else self.split * self.tpc
        return first, (self.split if a == 0 else self.nr - self.split) * self.tpc


@register
@dataclass(frozen=True)
class LightningIndexer(Kernel):
    """q [batch*tokens*heads, dim], k [batch*keys, dim], w [batch*tokens, heads] fp16 head weights W~ (the quantised
    variants with the query scales and 1024 folded in; laid out block-diagonally in L1), ks [1, batch*keys] key
    scales (int8 / fp8 only) -> scores, indices [batch*tokens, topk] (index within the sequence, -1 where fewer keys
    are visible)."""

    name: ClassVar[str] = "lightning_indexer"
    options: ClassVar[tuple[str, ...]] = ("dtype", "causal", "block_m", "block_n", "splits")
    tokens: int
    keys: int
    heads: int = 64
    dim: int = 128
    topk: int = 2048
    batch: int = 1
    causal: int = 1
    dtype: str = "bf16"  # q/k: bf16, or int8 / fp8 with scales (the cube dtype of C1)
    block_m: int = 0  # query rows per block (0 = the tiler's choice: PREFILL_ROWS, fewer for decode)
    block_n: int = 512  # keys per block
    splits: int = 0  # key ranges per query block (0 = the tiler's choice)

    @property
    def quantised(self) -> bool:
        return self.dtype in QUANTISED

    def pairs(self) -> float:
        return self.batch * (self.tokens * self.keys - (self.tokens * (self.tokens - 1) / 2 if self.causal else 0))

    def work(self) -> Work:
        T, S, H, D, B = self.tokens, self.keys, self.heads, self.dim, self.batch
        io = B * (nbytes(self.dtype, T * H + S, D) + nbytes(SCORE_DT, T, H) + 8.0 * T * self.topk
                  + (4.0 * S if self.quantised else 0.0))
        return Work(2.0 * self.pairs() * H * (D + 1), io, vector_flops=2.0 * self.pairs(), cube_dtype=self.dtype)

    # ------------------------------------------------------------------------------------------------ the plan
    def plan(self, chip: Chip) -> Plan:
        """Huawei's 512-row block (block_m / heads tokens) for prefill; with too few query blocks to fill the cores,
        the block size and the key ranges per block that `estimate` finds fastest (explicit sizes win)."""
        H, T, bn = self.heads, self.tokens, self.block_n
        tpb = (self.block_m or PREFILL_ROWS) // H
        if tpb < 1 or (self.block_m or PREFILL_ROWS) % H or bn % 2 or bn < 32:
            raise NpusimError(f"lightning_indexer block_m={self.block_m} must hold whole tokens of {H} heads and "
                              f"block_n={bn} must be an even number of keys >= 32", field="tiling.block_m")
        if H > 128:
            raise NpusimError(f"lightning_indexer: {H} heads do not fit a 128-row L0 chunk", field="heads")
        tb = min(tpb, T)
        if self.block_m and self.splits:
            return self.layout(chip, tb, self.splits)
        few = self.batch * cdiv(T, tb) < chip.aic.count  # decode: smaller blocks and key ranges fill the cores
        sizes = sorted({cdiv(tb, 2 ** i) for i in range(tb.bit_length())}) if few and not self.block_m else [tb]
        options = [(b, s) for b in sizes
                   for s in ([self.splits] if self.splits else range(1, self.max_splits(chip, b) + 1))]
        return self.layout(chip, *min(options, key=lambda o: self.estimate(chip, *o)))

    def max_splits(self, chip: Chip, tb: int) -> int:
        units = self.batch * cdiv(self.tokens, tb)
        return 1 if units >= chip.aic.count else max(1, min(cdiv(self.keys, self.block_n), 4 * chip.aic.count // units))

    def layout(self, chip: Chip, tb: int, splits: int) -> Plan:
        H, T, S, bn = self.heads, self.tokens, self.keys, self.block_n
        tpc = max(t for t in range(1, 128 // H + 1) if tb % t == 0 and (tb // t >= 2 or tb == 1))
        c_m, nr = tpc * H, tb // tpc
        nq, full = cdiv(T, tb), cdiv(S, bn)
        paired = bool(self.causal) and self.batch * (nq // 2) >= chip.aic.count
        tps = cdiv(full, 1 if paired else splits)
        if not paired and self.causal and len({cdiv(self.tiles(q, tb, full), tps) for q in range(nq)}) > 1:
            tps = full  # causal query blocks with different range counts are not split (their merges would differ)
        cap = capacity(chip)
        plans = [Plan(tb, tb * H, tpc, c_m, c_n, nr, cdiv(nr, 2), bn, nq, full, cdiv(full, tps), tps, paired)
                 for c_n in (128, 64, 32, 16) if (bn // 2) % c_n == 0]
        return next((p for p in plans if all(v <= cap[lv] for lv, v in self.buffers(p).items())), plans[-1])

    def buffers(self, p: Plan) -> dict[str, float]:
        """Bytes per core of each level: Q (both parts of a causal pair) and the block-diagonal W~ resident in L1
        beside K in three half-tile slots and two S' chunks; L0A Q and two W~ chunks; L0B two K and two S' chunks;
        L0C two S chunks and two P accumulators; UB the scores, key scales and the running top-k of each part."""
        dt, D, K, c_m, c_n, bn = self.dtype, self.dim, self.topk, p.c_m, p.c_n, p.bn
        na = max(p.tokens_of(a)[1] for a in range(2))
        return {"l1": p.parts * (nbytes(dt, p.rows, D) + nbytes(SCORE_DT, p.nr * 16, c_m)) + 3 * nbytes(dt, bn // 2, D)
                + 2 * nbytes(SCORE_DT, c_m, c_n),
                "l0a": nbytes(dt, c_m, D) + 2 * nbytes(SCORE_DT, 16, c_m),
                "l0b": 2 * (nbytes(dt, c_n, D) + nbytes(SCORE_DT, c_m, c_n)),
                "l0c": 2 * 4.0 * c_m * c_n + 2 * 4.0 * 16 * bn,
                "ub": max(4.0 * na * bn * 3 + (8.0 * bn if self.quantised else 0.0) + 8.0 * p.parts * na * K,
                          24.0 * K)}

    def tiles(self, qb: int, tb: int, full: int) -> int:
        """Key tiles query block qb needs (queries are the last `tokens` positions of `keys`)."""
        if not self.causal:
            return full
        return min(full, (self.keys - self.tokens + min((qb + 1) * tb, self.tokens) - 1) // self.block_n + 1)

    def estimate(self, chip: Chip, tb: int, splits: int) -> float:
        """Seconds for blocks of `tb` tokens and `splits` key ranges: the units' key-tile steps in waves over the
        cores, a step taking the slowest of its cube work (C1 and the 16-row head reduction), its top-k on the
        busier vector core and its K tile (per-core MTE2 rate, the wave's share of HBM and L2), then the merge of
        the ranges on one vector core. An estimate for ranking; the engine times the trace."""
        H, D, bn, cube = self.heads, self.dim, self.block_n, chip.aic.cube.flop_per_cycle
        eff, clock, cores = chip.efficiency, chip.clock, chip.aic.count
        nq, full = cdiv(self.tokens, tb), cdiv(self.keys, bn)
        units = self.batch * nq * splits
        per_key, fixed = topk_cycles(chip, self.topk)
        merge_key, _ = topk_cycles(chip, self.topk, presorted=True)
        rows = tb * H
        step_cube = (2.0 * rows * bn * D / cube[self.dtype] + 2.0 * 16 * rows * bn / cube[SCORE_DT]) / (
            clock * eff.cube)
        step_vec = cdiv(tb, 2) * per_key * bn / (clock * eff.vector)
        k_step, hit = nbytes(self.dtype, bn, D), 1 - 1 / nq
        mte2 = chip.aic.pipes["mte2"]
        n = min(units, cores)
        step_mem = max(k_step / (mte2.routes.get("gm>l1", mte2.bytes_per_cycle) * clock),
                       n * k_step * (1 - hit) / (chip.hbm.bandwidth * eff.hbm),
                       n * k_step * hit / (chip.l2.read_bandwidth * eff.l2))
        stream = cdiv(units, cores) * cdiv(full, splits) * max(step_cube, step_vec, step_mem)
        merge = (merge_key * splits * self.topk + fixed) / (clock * eff.vector) if splits > 1 else 0.0
        return stream + merge

    # ------------------------------------------------------------------------------------------------ the units
    def units(self, p: Plan) -> list[tuple[int, int, dict[str, Lin]]]:
        """(blocks, steps C, unit bindings) per band of equal units. Bindings are in terms of 'blk' (the unit's index
        in its band): bi (sequence), qb0 (query block of part 0), dq (part 1's query block - qb0), s0 (steps of part
        0), k0 (first key tile), si (key range)."""
        B, tb, bn, nq, off = self.batch, p.tb, p.bn, p.nq, self.keys - self.tokens
        if p.paired:  # unit u: the long block nq-1-u, then the short block u; steps padded to the longest pair
            npair = nq // 2

            def tiles_f(q: int) -> int:  # the causal count, unclipped (a tile past the sequence end is all masked)
                return (off + (q + 1) * tb - 1) // bn + 1

            C = max(tiles_f(nq - 1 - u) + tiles_f(u) for u in range(npair))
            out = [(B * npair, C, {"u": lin(("blk", 1), mod=npair), "bi": lin(("blk", 1), div=npair),
                                   "qb0": lin(("u", -1), base=nq - 1), "dq": lin(("u", 2), base=1 - nq),
                                   "s0": lin(("u", -tb), base=off + tb * nq - 1 + bn, div=bn),
                                   "k0": Lin(0), "si": Lin(0)})]
            if nq % 2:
                mid = nq // 2
                out.append((B, tiles_f(mid), {"bi": lin(("blk", 1)), "qb0": Lin(mid), "dq": Lin(0),
                                              "s0": Lin(tiles_f(mid)), "k0": Lin(0), "si": Lin(0)}))
            return out
        runs: list[list[int]] = []  # (first query block, blocks, tiles) of equal tile counts
        for q in range(nq):
            t = self.tiles(q, tb, p.full)
            if runs and runs[-1][2] == t:
                runs[-1][1] += 1
            else:
                runs.append([q, 1, t])
        out = []
        for first, n, t in runs:
            whole, rem = divmod(t, p.tps)
            if whole:  # full key ranges: blk -> (sequence, query block, range)
                out.append((B * n * whole, p.tps, {
                    "si": lin(("blk", 1), mod=whole), "q": lin(("blk", 1), div=whole), "qq": lin(("q", 1), mod=n),
                    "qb0": lin(("qq", 1), base=first), "bi": lin(("q", 1), div=n), "dq": Lin(0), "s0": Lin(p.tps),
                    "k0": lin(("si", p.tps))}))
            if rem:  # the shorter last range
                out.append((B * n, rem, {
                    "si": Lin(whole), "qq": lin(("blk", 1), mod=n), "qb0": lin(("qq", 1), base=first),
                    "bi": lin(("blk", 1), div=n), "dq": Lin(0), "s0": Lin(rem), "k0": Lin(whole * p.tps)}))
        return out

    # ------------------------------------------------------------------------------------------------ the trace
    def build(self, chip: Chip) -> Trace:
        need_cube(chip, self.dtype)
        p = self.plan(chip)
        H, D, T, S, K, B = self.heads, self.dim, self.tokens, self.keys, self.topk, self.batch
        dt, bn, c_m, c_n, tpc, nr, rows, tb = self.dtype, p.bn, p.c_m, p.c_n, p.tpc, p.nr, p.rows, p.tb
        fe = ELEMENT.get(dt, dt)
        kh, nj = bn // 2, bn // c_n  # K arrives in two halves per step; nj key chunks per step
        jh = kh // c_n  # key chunks per half
        vflops = chip.aiv.vector.flop_per_cycle["fp32"]
        per_key, fixed = topk_cycles(chip, K)
        merge_key, _ = topk_cycles(chip, K, presorted=True)
        off, R, quant = S - T, B * T, self.quantised
        ws_hit = 1.0  # the C->V score workspace: two slots of tb x bn fp32 per core, written and read at once (L2)
        # K is re-read by every query block of its sequence: from L2 after the first read when a sequence's keys fit
        # there, else only by the query blocks in flight together
        loads = sum(self.tiles(q, tb, p.full) for q in range(p.nq))
        hit_k = 1 - p.full / loads if nbytes(dt, S, D) <= chip.l2.size / 2 else 1 - 1 / min(p.nq, chip.aic.count)
        kstop = lin(("bi", S), base=S)
        deq = DEQ if self.quantised else 1.0

        def step_vars(C: int, paired: bool, j: Lin) -> Node:
            """sel: which part this step serves; kt: its key tile; qb: its query block."""
            sel = lin(("j", 1), ("s0", -1), base=C, div=C) if paired else Lin(0)
            return addr(j=j, sel=sel, kt=lin(("k0", 1), ("j", 1), (("sel", "s0"), -1)),
                        qb=lin(("qb0", 1), (("sel", "dq"), 1)))

        # ------------------------------------------------------------------ AIC
        def load_qw(r: int) -> list[Node]:
            """Row chunk r's queries (kept in L0A for all its key chunks) and its block-diagonal head weights."""
            return [
                ins("mte1", "load_q", Act("copy", Ref("l0a.q", (0, 0), (c_m, D)),
                                          (Ref("l1.q", (lin(("sel", rows), base=r * c_m), 0), (c_m, D)),), fe),
                    bytes=nbytes(dt, c_m, D), dtype=dt, src="l1", dst="l0a", wait=("qa.free",), set=("qa.full",)),
                ins("mte1", "load_w", Act("copy", Ref(f"l0a.w{r % 2}", (0, 0), (16, c_m)),
                                          (Ref("l1.w", (lin(("sel", nr * 16), base=r * 16), 0), (16, c_m)),), SCORE_DT),
                    bytes=nbytes(SCORE_DT, 16, c_m), dtype=SCORE_DT, src="l1", dst="l0a", wait=("wa.free",),
                    set=("wa.full",))]

        def c1(g: int) -> list[Node]:
            """Chunk g = (row chunk r, key chunk j): K slice into L0B, S = Q K^T into L0C."""
            r, j = divmod(g, nj)
            h, first, last = j // jh, j % jh == 0, j % jh == jh - 1
            k = Ref(f"l0b.k{g % 2}", (0, 0), (c_n, D))
            return [
                ins("mte1", "load_k", Act("copy", k, (Ref(f"l1.k{h}", ((j % jh) * c_n, 0), (c_n, D)),), fe),
                    bytes=nbytes(dt, c_n, D), dtype=dt, src="l1", dst="l0b",
                    wait=(("k.full",) if r == 0 and first else ()) + ("kb.free",),
                    set=("kb.full",) + (("k.free",) if r == nr - 1 and last else ())),
                ins("cube", "mmad", Act("mmad", Ref(f"l0c.s{g % 2}", (0, 0), (c_m, c_n)),
                                        (Ref("l0a.q", (0, 0), (c_m, D)), k), "fp32",
                                        (("transpose_b", True), ("accumulate", False))),
                    flops=2.0 * c_m * c_n * D, dtype=dt, src="l0a", dst="l0c",
                    wait=("qa.full",) * (j == 0) + ("kb.full", "s.free"),
                    set=("kb.free", "s.full") + ("qa.free",) * (j == nj - 1))]

        def relu(g: int) -> Node:
            """FIXPIPE: ReLU (and DEQF16 for the quantised variants) on the way from L0C into L1 as fp16 S'."""
            return ins("fixpipe", "relu_l1", Act("fixpipe", Ref(f"l1.s{g % 2}", (0, 0), (c_m, c_n)),
                                                 (Ref(f"l0c.s{g % 2}", (0, 0), (c_m, c_n)),), SCORE_DT,
                                                 (("relu", True), ("scale", deq))),
                       bytes=nbytes(SCORE_DT, c_m, c_n), dtype=SCORE_DT, src="l0c", dst="l1",
                       wait=("s.full", "s1.free"), set=("s.free", "s1.full"))

        def c2(g: int, slot: int) -> list[Node]:
            """The head reduction of chunk g: P[:, keys of j] = W~_r S' (16 x c_m times c_m x c_n); after a row
            chunk's last key chunk its P rows go to the workspace of the AIV that owns them."""
            r, j = divmod(g, nj)
            sp = Ref(f"l0b.s{g % 2}", (0, 0), (c_m, c_n))
            body = [
                ins("mte1", "load_s", Act("copy", sp, (Ref(f"l1.s{g % 2}", (0, 0), (c_m, c_n)),), SCORE_DT),
                    bytes=nbytes(SCORE_DT, c_m, c_n), dtype=SCORE_DT, src="l1", dst="l0b",
                    wait=("s1.full", "sb.free"), set=("s1.free", "sb.full")),
                ins("cube", "mmad_heads", Act("mmad", Ref(f"l0c.p{r % 2}", (0, j * c_n), (16, c_n)),
                                              (Ref(f"l0a.w{r % 2}", (0, 0), (16, c_m)), sp), "fp32",
                                              (("accumulate", False),)),
                    flops=2.0 * 16 * c_m * c_n, dtype=SCORE_DT, src="l0a", dst="l0c",
                    wait=("sb.full",) + ("wa.full", "pc.free") * (j == 0),
                    set=("sb.free",) + ("wa.free", "pc.full") * (j == nj - 1))]
            if j == nj - 1:
                a = 0 if r < p.split else 1
                first_r, last_r = r in (0, p.split), r in (p.split - 1, nr - 1)
                body.append(ins("fixpipe", "scores_out", Act("fixpipe", Ref(f"ws.p{slot}", (r * tpc, 0), (tpc, bn)),
                                                             (Ref(f"l0c.p{r % 2}", (0, 0), (tpc, bn)),), "fp32"),
                                bytes=4.0 * tpc * bn, dtype="fp32", src="l0c", dst="gm", hit=ws_hit,
                                wait=("pc.full",) + (f"ws.free{a}.{slot}",) * first_r,
                                set=("pc.free",) + (f"c2v{a}.{slot}",) * last_r))
            return body

        def chunks(slot: int) -> list[Node]:
            """The step's nr x nj chunks as one stream, the head reduction LAG chunks behind C1 (across row chunks
            too), so FIXPIPE and MTE1 have S' in L0B before the cube wants it."""
            body: list[Node] = []
            n = nr * nj
            for g in range(n + LAG):
                if g < n:
                    body += (load_qw(g // nj) if g % nj == 0 else []) + c1(g)
                if g >= LAG:
                    body += c2(g - LAG, slot)
                if g < n:
                    body.append(relu(g))
            return body

        def aic_step(C: int, paired: bool, slot: int, j: Lin) -> tuple[Node, ...]:
            body: list[Node] = [step_vars(C, paired, j)]
            for h in range(2):
                body.append(ins("mte2", "load_k", Act("load", Ref(f"l1.k{h}", (0, 0), (kh, D)),
                                                      (Ref("k", (lin(("bi", S), ("kt", bn), base=h * kh), 0), (kh, D),
                                                           (kstop, D)),), fe),
                                bytes=nbytes(dt, kh, D), dtype=dt, src="gm", dst="l1", hit=hit_k,
                                wait=("k.free",), set=("k.full",)))
            return tuple(body + chunks(slot))

        def aic_unit(C: int, paired: bool) -> tuple[Node, ...]:
            parts = 2 if paired else 1
            pro: list[Node] = []
            for q in range(parts):
                pro += [ins("mte2", "load_q", Act("load", Ref("l1.q", (q * rows, 0), (rows, D)),
                                                  (Ref("q", (lin(("bi", T * H), ("qb0", rows), ("dq", q * rows)), 0),
                                                       (rows, D), (lin(("bi", T * H), base=T * H), D)),), fe),
                            bytes=nbytes(dt, rows, D), dtype=dt, src="gm", dst="l1", wait=("q.free",) * (q == 0)),
                        ins("mte2", "load_w", Act("headdiag", Ref("l1.w", (q * nr * 16, 0), (nr * 16, c_m)),
                                                  (Ref("w", (lin(("bi", T), ("qb0", tb), ("dq", q * tb)), 0), (tb, H),
                                                       (lin(("bi", T), base=T), H)),), SCORE_DT, (("tpc", tpc),)),
                            bytes=nbytes(SCORE_DT, tb, H), dtype=SCORE_DT, src="gm", dst="l1",
                            set=("q.full",) * (q == parts - 1))]
            pro.append(ins("mte1", "wait_q", wait=("q.full",)))
            steps = pingpong(C, lambda slot, j: aic_step(C, paired, slot, j), "jp")
            return tuple(pro) + steps + (ins("cube", "release_q", set=("q.free",)),)

        # ------------------------------------------------------------------ AIV
        def aiv_step(a: int, C: int, paired: bool, slot: int, j: Lin) -> tuple[Node, ...]:
            f, n = p.tokens_of(a)
            pb = Ref(f"ub.p{slot}", (0, 0), (n, bn))
            ks = (Ref(f"ub.ks{slot}", (0, 0), (1, bn)),) if quant else ()
            kpos = lin(("kt", bn))
            body: list[Node] = [
                step_vars(C, paired, j),
                ins("mte2", "load_scores", Act("load", pb, (Ref(f"ws.p{slot}", (f, 0), (n, bn)),), "fp32"),
                    bytes=4.0 * n * bn, dtype="fp32", src="gm", dst="ub", hit=ws_hit,
                    wait=(f"c2v{a}.{slot}", f"ub.free{a}"), set=(f"ws.free{a}.{slot}", f"ub.full{a}"))]
            if quant:
                src = Ref("ks", (0, lin(("bi", S), ("kt", bn))), (1, bn), (None, kstop))
                body.append(ins("mte2", "load_key_scales", Act("load", ks[0], (src,), "fp32"),
                                bytes=4.0 * bn, dtype="fp32", src="gm", dst="ub", hit=hit_k))
            ui = Ref("ub.i", (0, 0), (n, bn))
            top = Ref("ub.top", (lin(("sel", 2 * n)), 0), (2 * n, K))
            body += [
                ins("vector", "scores", Act("li_scores", ui, (pb,) + ks, "fp32",
                                            (("qpos", lin(("qb", tb), base=off + f)), ("kpos", kpos), ("keys", S),
                                             ("causal", bool(self.causal)))),
                    flops=2.0 * n * bn, bytes=4.0 * n * bn, dtype="fp32", src="ub", dst="ub",
                    wait=(f"ub.full{a}",), set=(f"ub.free{a}",)),
                ins("vector", "topk_merge", Act("topk_merge", top, (top, ui), "fp32", (("kpos", kpos),)),
                    flops=per_key * bn * n * vflops, bytes=4.0 * n * bn, dtype="fp32", src="ub", dst="ub")]
            return tuple(body)

        def aiv_unit(a: int, C: int, paired: bool) -> tuple[Node, ...]:
            f, n = p.tokens_of(a)
            if not n:
                return ()
            parts = 2 if paired else 1
            body: tuple[Node, ...] = tuple(ins("vector", "topk_init", Act("topk_init", Ref("ub.top", (2 * n * q, 0),
                                                                                           (2 * n, K))),
                                               bytes=8.0 * n * K, dtype="fp32", dst="ub", wait=(f"top.free{a}",))
                                           for q in range(parts))
            body += pingpong(C, lambda slot, j: aiv_step(a, C, paired, slot, j), "jp")
            for q in range(parts):
                vals, idx = Ref("ub.top", (2 * n * q, 0), (n, K)), Ref("ub.top", (2 * n * q + n, 0), (n, K))
                body += (ins("vector", "topk_final", flops=fixed * n * vflops, dtype="fp32", src="ub", dst="ub",
                             set=(f"top.full{a}",)),)
                if p.splits > 1:  # this key range's top-k, to the partials the merge reads
                    outs = tuple((Ref("gm.li_part", (lin(("si", 2 * R), ("bi", T), ("qb0", tb), base=v * R + f), 0),
                                      (n, K), (lin(("si", 2 * R), ("bi", T), base=v * R + T), K)), ref)
                                 for v, ref in enumerate((vals, idx)))
                else:
                    row = lin(("bi", T), ("qb0", tb), ("dq", q * tb), base=f)
                    stop = (lin(("bi", T), base=T), K)
                    outs = ((Ref("scores", (row, 0), (n, K), stop), vals),
                            (Ref("indices", (row, 0), (n, K), stop), idx))
                body += tuple(ins("mte3", "store", Act("store", o, (i,), "fp32"), bytes=4.0 * n * K, dtype="fp32",
                                  src="ub", dst="gm", hit=1.0 if p.splits > 1 else 0.0,
                                  wait=(f"top.full{a}",) * (v == 0), set=(f"top.free{a}",) * (v == 1))
                              for v, (o, i) in enumerate(outs))
            return body

        # ------------------------------------------------------------------ merge of the key ranges (splits > 1)
        def barrier(a: int) -> tuple[Node, ...]:
            """AscendC SyncAll: the vector core bumps a GM counter once its partials are out and polls it."""
            return (ins("mte3", "sync_all", bytes=32.0, dtype="int32", src="ub", dst="gm", hit=1.0, set=(f"sync{a}",)),
                    ins("mte2", "sync_poll", bytes=32.0, dtype="int32", src="gm", dst="ub", hit=1.0,
                        wait=(f"sync{a}",)))

        def merge(a: int) -> tuple[Node, ...]:
            """Token row 2 blk + a: its ranges' top-k lists merged into one (values and indices from the partials)."""
            state = Ref("ub.mt", (0, 0), (2, K))

            def part_row(i: Lin, base: int) -> Lin:  # rows of the partials: (2 range + 0/1) R + token row
                at = scaled(i, 2 * R, base)
                return Lin(at.base, at.terms + (("row", 1),))

            def one(slot: int, i: Lin) -> tuple[Node, ...]:
                part = Ref(f"ub.m{slot}", (0, 0), (2, K))
                return tuple(
                    ins("mte2", "load_part", Act("load", Ref(f"ub.m{slot}", (v, 0), (1, K)),
                                                 (Ref("gm.li_part", (part_row(i, v * R), 0), (1, K)),), "fp32"),
                        bytes=4.0 * K, dtype="fp32", src="gm", dst="ub", hit=1.0,
                        wait=(f"m.free{a}",) * (v == 0), set=(f"m.full{a}",) * (v == 1)) for v in range(2)) + (
                    ins("vector", "topk_union", Act("topk_union", state, (state, part), "fp32"),
                        flops=merge_key * K * vflops, bytes=8.0 * K, dtype="fp32", src="ub", dst="ub",
                        wait=(f"m.full{a}",), set=(f"m.free{a}",)),)

            stop = (R, K)
            return ((addr(row=lin(("blk", 2), base=a)),
                     ins("vector", "topk_init", Act("topk_init", state), bytes=8.0 * K, dtype="fp32", dst="ub",
                         wait=(f"top.free{a}",)))
                    + pingpong(p.splits, one, "ri")
                    + (ins("vector", "topk_final", flops=fixed * vflops, dtype="fp32", src="ub", dst="ub",
                           set=(f"top.full{a}",)),
                       ins("mte3", "store", Act("store", Ref("scores", (lin(("row", 1)), 0), (1, K), stop),
                                                (Ref("ub.mt", (0, 0), (1, K)),), "fp32"),
                           bytes=4.0 * K, dtype="fp32", src="ub", dst="gm", wait=(f"top.full{a}",)),
                       ins("mte3", "store", Act("store", Ref("indices", (lin(("row", 1)), 0), (1, K), stop),
                                                (Ref("ub.mt", (1, 0), (1, K)),), "fp32"),
                           bytes=4.0 * K, dtype="fp32", src="ub", dst="gm", set=(f"top.free{a}",))))

        bands = []
        for blocks, C, bind in self.units(p):
            paired = p.paired and "u" in bind
            head = addr(**bind)
            bands.append(Band(blocks, (head,) + aic_unit(C, paired),
                              tuple(((head,) + body) if body else () for body in
                                    (aiv_unit(a, C, paired) for a in range(2)))))
        if p.splits > 1:
            bands.append(Band(cdiv(R, 2), None, (merge(0), merge(1)), lead=(barrier(0), barrier(1))))
        flags = {"q.free": 1, "q.full": 0, "k.free": 3, "k.full": 0, "qa.free": 1, "qa.full": 0, "wa.free": 2,
                 "wa.full": 0, "kb.free": 2, "kb.full": 0, "sb.free": 2, "sb.full": 0, "s.free": 2, "s.full": 0,
                 "s1.free": 2, "s1.full": 0, "pc.free": 2, "pc.full": 0}
        for a in range(2):
            flags |= {f"ws.free{a}.0": 1, f"ws.free{a}.1": 1, f"c2v{a}.0": 0, f"c2v{a}.1": 0, f"ub.free{a}": 2,
                      f"ub.full{a}": 0, f"m.free{a}": 2, f"m.full{a}": 0, f"sync{a}": 0, f"top.free{a}": 2,
                      f"top.full{a}": 0}
        groups = distribute(bands, chip.aic.count, flags)
        w = self.work()
        return Trace(self.name, chip.name, self.shape, groups, w.cube_flops, w.hbm_bytes, self.buffers(p),
                     {"block_m": rows, "block_n": bn, "tokens_per_block": tb, "l0_chunk": (c_m, c_n, D),
                      "k_buffers": 3, "head_reduction": "cube (Mat-Duce)", "units": "paired causal" if p.paired
                      else f"{p.splits} key ranges", "bands": len(bands),
                      "topk": "radix select" if chip.family == "950" else "VBS32+VMS4 sort/merge"}, dtype=dt)
