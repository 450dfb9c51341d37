"""Lightning Indexer: I[t,s] = sum_j w[t,j] ReLU(q[t,j] . k[s]) and its exact top-k per token (models.md §1.3).

Huawei's tiling (models.md §3.4): a 512 x 512 basic block = 512 query rows (512/heads tokens x heads) x 512 keys;
Q resident in L1 (128 KB), K triple-buffered in 256-key halves (192 KB), L0 blocks 128 x 128; ReLU in FIXPIPE on
the way to a GM workspace; each AIV takes half the block's tokens: weighted head-sum, causal mask, and a running
top-k merge whose cost follows the sort/merge model (A2/A3) or radix select (950).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from npusim.errors import NpusimError
from npusim.kernels.base import Band, Kernel, Work, addr, cdiv, distribute, ins, nbytes, need_cube, register
from npusim.kernels.tile import Act, Ref, lin
from npusim.kernels.trace import Loop, Node, Trace
from npusim.spec.chip import Chip

LI_FLAGS = {"q.free": 1, "k.free": 3, "l0.free": 2, "l0.full": 0, "l0c.free": 2, "l0c.full": 0,
            "c2v0": 0, "c2v1": 0, "ws.free0": 2, "ws.free1": 2, "ub.free": 2}


def topk_cycles(chip: Chip, keys: int, k: int) -> tuple[float, float]:
    """(cycles per key, fixed cycles) of an exact top-k over `keys` per row, models.md §3.4:
    A2/A3 VBS32 + VMS4 merges (1.36 Sk + 3.32 k + ceil(max(log2 k - 5, 0)/2) Sk)/2; 950 radix select (Sk/256)*111 + 192."""
    if chip.family == "950":
        return 111 / 256, 192.0
    return (1.36 + math.ceil(max(math.log2(max(k, 1)) - 5, 0) / 2)) / 2, 3.32 * k / 2


def causal_bands(tokens: int, keys: int, per_block: int, key_tile: int, causal: bool) -> list[tuple[int, int, int]]:
    """(first query block, blocks, key tiles) runs: query blocks needing the same number of key tiles.
    Queries are the last `tokens` positions of `keys` (prefill chunk or decode step)."""
    nq, full = cdiv(tokens, per_block), cdiv(keys, key_tile)
    out: list[list[int]] = []
    for qb in range(nq):
        last = keys - tokens + min((qb + 1) * per_block, tokens) - 1
        c = min(full, last // key_tile + 1) if causal else full
        if out and out[-1][2] == c:
            out[-1][1] += 1
        else:
            out.append([qb, 1, c])
    return [tuple(b) for b in out]


@register
@dataclass(frozen=True)
class LightningIndexer(Kernel):
    """q [batch*tokens*heads, dim], k [batch*keys, dim], weights [batch*tokens, heads] ->
    scores, indices [batch*tokens, topk] (index within the sequence, -1 where fewer keys are visible)."""

    name: ClassVar[str] = "lightning_indexer"
    options: ClassVar[tuple[str, ...]] = ("dtype", "causal", "block_m", "block_n")
    tokens: int
    keys: int
    heads: int = 64
    dim: int = 128
    topk: int = 2048
    batch: int = 1
    causal: int = 1
    dtype: str = "bf16"
    block_m: int = 512  # query rows per block (models.md §3.4)
    block_n: int = 512  # keys per block

    def work(self) -> Work:
        pairs = self.batch * (self.tokens * self.keys - (self.tokens * (self.tokens - 1) / 2 if self.causal else 0))
        io = self.batch * (nbytes(self.dtype, self.tokens * self.heads + self.keys, self.dim)
                           + 4.0 * self.tokens * self.heads + 8.0 * self.tokens * self.topk)
        return Work(2.0 * pairs * self.heads * self.dim, io, vector_flops=2.0 * pairs * self.heads, cube_dtype=self.dtype)

    def build(self, chip: Chip) -> Trace:
        need_cube(chip, self.dtype)
        H, D, T, S, K, B = self.heads, self.dim, self.tokens, self.keys, self.topk, self.batch
        bm, bn, c = self.block_m, self.block_n, 128  # L0 blocks 128 x 128 (models.md §3.4)
        tpb = max(1, bm // H)
        rows = tpb * H
        if rows % 256 or tpb % 2:
            raise NpusimError(f"lightning_indexer block_m={bm} with {H} heads gives {rows} rows: need a multiple of "
                              "256 rows and an even number of tokens (two vector cores, 128-row L0 blocks)",
                              field="tiling.block_m")
        tpa = tpb // 2
        dt = self.dtype
        kh = bn // 2
        vflops = chip.aiv.vector.flop_per_cycle["fp32"]
        per_key, fixed = topk_cycles(chip, S, K)
        hit_k = 1 - 1 / max(1, cdiv(T, tpb)) if nbytes(dt, S * D) * B <= chip.l2.size else 0.0
        # the C->V score workspace (2 slots of rows x bn fp32 per core) is written and read back at once: it stays
        # in L2 when all cores' slots fit there
        ws_hit = 1.0 if 2 * 4.0 * rows * bn * chip.aic.count <= chip.l2.size else 0.0
        # block coordinates: blk -> (batch bi, query block qb); env 'first' is the band's first query block
        head = addr(bi=lin(("blk", 1), mod=B), qq=lin(("blk", 1), div=B), qb=lin(("first", 1), ("qq", 1)),
                    tok0=lin(("qb", tpb)), row0=lin(("bi", T * H), ("qb", rows)), kb=lin(("bi", S)))
        qstop, kstop = lin(("bi", T * H), base=T * H), lin(("bi", S), base=S)

        nr = rows // c  # 128-row chunks of the block; the first half belongs to AIV0, the second to AIV1

        def aic_tile(slot: int, kt: str) -> tuple[Node, ...]:
            body: list[Node] = []
            for h in range(2):
                body.append(ins("mte2", "load_k", Act("load", Ref(f"l1.k{h}", (0, 0), (kh, D)),
                                                      (Ref("k", (lin(("kb", 1), (kt, bn), base=h * kh), 0), (kh, D),
                                                           (kstop, D)),), dt),
                                bytes=nbytes(dt, kh, D), dtype=dt, src="gm", dst="l1", wait=("k.free",),
                                set=("k.full",), hit=hit_k))
            for r in range(nr):
                a = r * 2 // nr
                for j in range(bn // c):
                    body += [
                        ins("mte1", "load_l0a", Act("copy", Ref("l0a", (0, 0), (c, D)),
                                                    (Ref("l1.q", (r * c, 0), (c, D)),), dt),
                            bytes=nbytes(dt, c, D), dtype=dt, src="l1", dst="l0a",
                            wait=(("k.full",) if r == 0 and j % 2 == 0 else ()) + ("l0.free",)),
                        ins("mte1", "load_l0b", Act("copy", Ref("l0b", (0, 0), (c, D)),
                                                    (Ref(f"l1.k{j // 2}", ((j % 2) * c, 0), (c, D)),), dt),
                            bytes=nbytes(dt, c, D), dtype=dt, src="l1", dst="l0b",
                            set=("l0.full",) + (("k.free",) if r == nr - 1 and j % 2 == 1 else ())),
                        ins("cube", "mmad", Act("mmad", Ref("l0c", (0, 0), (c, c)),
                                                (Ref("l0a", (0, 0), (c, D)), Ref("l0b", (0, 0), (c, D))), "fp32",
                                                (("transpose_b", True), ("accumulate", False))),
                            flops=2.0 * c * c * D, dtype=dt, src="l0a", dst="l0c", wait=("l0.full", "l0c.free"),
                            set=("l0.free", "l0c.full")),
                        ins("fixpipe", "relu_out", Act("fixpipe", Ref(f"ws.s{slot}", (r * c, j * c), (c, c)),
                                                       (Ref("l0c", (0, 0), (c, c)),), "fp32", (("relu", True),)),
                            bytes=4.0 * c * c, dtype="fp32", src="l0c", dst="gm", hit=ws_hit,
                            wait=("l0c.full",) + ((f"ws.free{a}",) if r == a * nr // 2 and j == 0 else ()),
                            set=("l0c.free",) + ((f"c2v{a}",) if r == (a + 1) * nr // 2 - 1 and j == bn // c - 1
                                                 else ()))]
            return tuple(body)

        def aiv_tile(a: int, slot: int, kt: str) -> tuple[Node, ...]:
            kc = 128  # keys per UB chunk: heads x 128 fp32 = 32 KB, double-buffered
            chunk = (
                ins("mte2", "load_s", Act("load", Ref("ub.s", (0, 0), (H, kc)),
                                          (Ref(f"ws.s{slot}", (lin(("tk", H), base=a * tpa * H), lin(("kc", kc))),
                                               (H, kc)),), "fp32"),
                    bytes=4.0 * H * kc, dtype="fp32", src="gm", dst="ub", wait=("ub.free",), set=("ub.full",),
                    hit=ws_hit),
                ins("vector", "headsum", Act("headsum", Ref("ub.i", (0, lin(("kc", kc))), (1, kc)),
                                             (Ref("ub.s", (0, 0), (H, kc)), Ref("ub.w", (lin(("tk", 1)), 0), (1, H))),
                                             "fp32", (("qpos", lin(("tok0", 1), ("tk", 1), base=a * tpa + S - T)),
                                                      ("kpos", lin((kt, bn), ("kc", kc))), ("keys", S),
                                                      ("causal", bool(self.causal)))),
                    flops=2.0 * H * kc, bytes=4.0 * H * kc, dtype="fp32", src="ub", dst="ub", wait=("ub.full",),
                    set=("ub.free",)))
            per_tok = (Loop(bn // kc, chunk, "kc"),
                       ins("vector", "topk_merge", Act("topk_merge", Ref("ub.top", (lin(("tk", 2)), 0), (2, K)),
                                                       (Ref("ub.top", (lin(("tk", 2)), 0), (2, K)),
                                                        Ref("ub.i", (0, 0), (1, bn))), "fp32",
                                                       (("kpos", lin((kt, bn))),)),
                           flops=per_key * bn * vflops, bytes=4.0 * bn, dtype="fp32", src="ub", dst="ub"))
            return (ins("mte2", "wait", wait=(f"c2v{a}",)), Loop(tpa, per_tok, "tk"),
                    ins("mte2", "release", set=(f"ws.free{a}",)))

        def pair_tail(make) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
            return make(0, "kp2") + make(1, "kp2b"), make(0, "klast")

        aic_pair, aic_tail = pair_tail(lambda s, v: aic_tile(s, v))
        aiv_pt = [pair_tail(lambda s, v, a=a: aiv_tile(a, s, v)) for a in range(2)]
        kvars = addr(kp2b=lin(("kp", 2), base=1))  # the odd tile index of a pair
        aic_pair = (ins("scalar", "addr", Act("let", args=(("kp2", lin(("kp", 2))),))), kvars) + aic_pair
        aiv_pair = [(ins("scalar", "addr", Act("let", args=(("kp2", lin(("kp", 2))),))), kvars) + p for p, _ in aiv_pt]

        aic_pro = (head, ins("mte2", "load_q", Act("load", Ref("l1.q", (0, 0), (rows, D)),
                                                   (Ref("q", (lin(("row0", 1)), 0), (rows, D), (qstop, D)),), dt),
                             bytes=nbytes(dt, rows, D), dtype=dt, src="gm", dst="l1", wait=("q.free",),
                             set=("q.full",)),
               ins("mte1", "wait", wait=("q.full",)))
        aic_epi = (ins("cube", "sync", set=("q.free",)),)

        def aiv_pro(a: int) -> tuple[Node, ...]:
            return (head,
                    ins("mte2", "load_w", Act("load", Ref("ub.w", (0, 0), (tpa, H)),
                                              (Ref("w", (lin(("bi", T), ("tok0", 1), base=a * tpa), 0), (tpa, H),
                                                   (lin(("bi", T), base=T), H)),), "fp32"),
                        bytes=4.0 * tpa * H, dtype="fp32", src="gm", dst="ub"),
                    ins("vector", "topk_init", Act("topk_init", Ref("ub.top", (0, 0), (2 * tpa, K))),
                        bytes=8.0 * tpa * K, dtype="fp32", dst="ub"))

        def aiv_epi(a: int) -> tuple[Node, ...]:
            row = lin(("bi", T), ("tok0", 1), ("tk", 1), base=a * tpa)
            stop = (lin(("bi", T), base=T), K)
            store = (ins("vector", "topk_final", flops=fixed * vflops, dtype="fp32", src="ub", dst="ub"),
                     ins("mte3", "store", Act("store", Ref("scores", (row, 0), (1, K), stop),
                                              (Ref("ub.top", (lin(("tk", 2)), 0), (1, K)),), "fp32"),
                         bytes=4.0 * K, dtype="fp32", src="ub", dst="gm"),
                     ins("mte3", "store", Act("store", Ref("indices", (row, 0), (1, K), stop),
                                              (Ref("ub.top", (lin(("tk", 2), base=1), 0), (1, K)),), "fp32"),
                         bytes=4.0 * K, dtype="int32", src="ub", dst="gm"))
            return (Loop(tpa, store, "tk"),)

        bands = []
        for first, n, tiles in causal_bands(T, S, tpb, bn, bool(self.causal)):
            pairs = tiles // 2
            odd = tiles % 2
            loop_c = (Loop(pairs, aic_pair, "kp"),) if pairs else ()
            aic = aic_pro + loop_c + (aic_tail if odd else ()) + aic_epi
            aiv = tuple(aiv_pro(a) + ((Loop(pairs, aiv_pair[a], "kp"),) if pairs else ())
                        + (aiv_pt[a][1] if odd else ()) + aiv_epi(a) for a in range(2))
            bands.append(Band(n * B, aic, aiv, (("first", first), ("klast", tiles - 1))))
        groups = distribute(bands, chip.aic.count, LI_FLAGS)
        w = self.work()
        buffers = {"l1": nbytes(dt, rows, D) + 3 * nbytes(dt, kh, D), "l0a": 2 * nbytes(dt, c, D),
                   "l0b": 2 * nbytes(dt, c, D), "l0c": 2 * 4.0 * c * c,
                   "ub": 2 * 4.0 * H * 128 + 4.0 * tpa * H + 8.0 * tpa * K + 4.0 * bn}
        return Trace(self.name, chip.name, self.shape, groups, w.cube_flops, w.hbm_bytes, buffers,
                     {"block_m": rows, "block_n": bn, "tokens_per_block": tpb, "l0_block": (c, c, D),
                      "k_buffers": 3, "bands": len(bands), "topk": "radix select" if chip.family == "950"
                      else "VBS32+VMS4 sort/merge"}, dtype=dt)
