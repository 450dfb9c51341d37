"""Flash attention over each query token's key set: Sparse Flash Attention, dense flash attention, V4 shared-KV.

One mechanism (models.md §3.5): a block of query rows (Huawei's SFA basic block 256 x 512: 2 tokens x 128 heads by
512 selected keys) streams key tiles of `block_n`. Per tile the AIC computes S = Q K^T (C1, L0 blocks (128, 96) x
(96, 128), FIXPIPE to a GM workspace); the AIVs run the online-softmax step (V1: running max and sum, P = exp(S - m)
in bf16); the AIC computes O~ = P V (C2, (128, 128) x (128, 128) blocks); the AIVs rescale the accumulator by
exp(m_old - m_new) and add O~ (V2: the rescale is its own instruction, so a tiling that drops it fails
numerically). The AIC preloads — C1 of tile k+1 is issued before C2 of tile k — so the cube works while the vectors
run the softmax. L1 holds the row group's Q, one 128-row chunk of P and a triple-buffered ring of K (128 keys x 288
dims) and V (256 keys x 128 dims) chunks.

The kernels differ only in a query token's key set:
- gathered (SFA: the indexer's top-k; V4: window ++ compressed entries): the AIVs gather the selected rows into a
  per-core workspace (two vector cores issue the discrete copies at twice the cube's rate, models.md §3.5); a row
  group (the rows sharing key tiles) is one token's heads.
- contiguous (dense flash attention, causal): the AIC loads key tiles straight from GM; all tokens of a block share
  them and the causal mask is applied per row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import ClassVar

import numpy as np

from npusim.errors import NpusimError
from npusim.kernels.base import Band, Kernel, Work, addr, cdiv, distribute, ins, nbytes, need_cube, register
from npusim.kernels.tile import Act, Lin, Ref, lin
from npusim.kernels.trace import Loop, Node, Trace
from npusim.spec.chip import BYTES_PER_ELEMENT, Chip

KC, VK, VC = 128, 256, 128  # keys per K chunk, keys per V chunk, V columns per chunk (models.md §3.5)
GATHER_ROWS = 32  # rows per vector-core gather copy (double-buffered in UB)
SOFTMAX_FLOPS = 6  # vector FLOPs per score: scale, mask, max, subtract, exp, sum (estimate)


def _rate(pipe, chip: Chip) -> float:
    return pipe.bytes_per_cycle * chip.clock


def plus(i: Lin, factor: int, *terms: tuple[str, int], base: int = 0) -> Lin:
    """factor * i + base + terms: an element offset of tile index i."""
    return Lin(i.base * factor + base, tuple((v, c * factor) for v, c in i.terms) + terms)


@dataclass(frozen=True)
class Plan:
    """Block geometry: `hb` heads x `tpb` tokens per block; `groups` row groups of `rows` rows sharing key tiles."""

    hb: int
    tpb: int
    hsplit: int
    groups: int
    rows: int
    chunk: int  # L0 row chunk
    dw: int  # d_qk columns per K chunk
    bk: int  # C1 L0 depth
    vc: int  # V columns per chunk
    vr: int  # AIV rows per UB chunk
    ub: float
    splits: int = 1  # key ranges per block (split-KV / flash-decoding); > 1 adds the combine phase


class Attention(Kernel):
    """Shared mechanism; subclasses give the shape fields, `gathered`, `columns(p)` and `visible(p)`."""

    gathered: ClassVar[bool] = True
    with_sink: ClassVar[bool] = False

    # ------------------------------------------------------------------ what a subclass says about its key set
    @property
    def dims(self) -> tuple[int, int]:
        return self.d_qk, self.d_v

    @property
    def kv_rows(self) -> int:
        """Rows of the kv array per sequence (gathered kernels may index past `keys`, e.g. compressed entries)."""
        return self.keys

    @property
    def width(self) -> int:
        """Index columns per token (gathered)."""
        raise NotImplementedError

    def columns(self, p: np.ndarray) -> np.ndarray:
        """Key columns a query at position p walks (selected slots incl. -1 padding, or the causal range)."""
        raise NotImplementedError

    def visible(self, p: np.ndarray) -> np.ndarray:
        """Keys a query at position p actually attends to (the FLOPs)."""
        return self.columns(p)

    @property
    def kvh(self) -> int:
        return getattr(self, "kv_heads", 1)

    @property
    def mask_causal(self) -> bool:
        return bool(self.causal) and not self.pairs

    def positions(self) -> np.ndarray:
        """Position of each query token in its sequence: the last `tokens` of `keys`."""
        return np.arange(self.tokens) + self.keys - self.tokens

    def per_token_columns(self) -> np.ndarray:
        if self.pairs:  # the op graph's uniform split of its query-key pairs
            return np.full(self.tokens, cdiv(self.pairs, self.batch * self.tokens))
        if self.tokens > self.keys:
            raise NpusimError(f"{self.name}: tokens={self.tokens} > keys={self.keys}; give 'pairs' for a batch of "
                              "sequences or set batch", field="shape")
        return self.columns(self.positions())

    def total_pairs(self) -> float:
        if self.pairs:
            return float(self.pairs)
        return float(self.batch * self.visible(self.positions()).sum())

    # ------------------------------------------------------------------ roofline
    def work(self) -> Work:
        dq, dv = self.dims
        heads, dt = self.heads, self.dtype
        pairs = self.total_pairs()
        qo = self.batch * self.tokens * heads * (nbytes(dt, dq) + nbytes("bf16", dv))
        if self.gathered:  # each selected row once at least; repeats may come from L2
            kv = min(pairs, self.batch * self.kv_rows) * nbytes(dt, dq) + 4.0 * self.batch * self.tokens * self.width
        else:
            kv = self.batch * self.kvh * self.keys * nbytes(dt, dq + (dv if self.kvh > 1 else 0))
        return Work(2.0 * pairs * heads * (dq + dv), qo + kv, vector_flops=SOFTMAX_FLOPS * pairs * heads,
                    cube_dtype=dt)

    # ------------------------------------------------------------------ tiling
    def plan(self, chip: Chip) -> Plan:
        """The block geometry; split-KV when the blocks (sequence x head-block x token-block) are fewer than the cores.

        Decode has few tokens per sequence, so without a key split most cores idle. Split-KV gives each core a key
        range of a block and merges the partial results afterwards (flash-decoding). `kv_splits` 0 chooses the
        block (a token's heads, or half or a quarter of them) and the number of ranges that minimise an estimate of
        the waves of work plus the combine; it needs every block to walk the same key tiles (uniform decode).
        """
        base = self.geometry(chip, self.block_m)
        tiles = self.tiles(base)
        if self.kv_splits == 1 or tiles.min() != tiles.max():
            return base
        n = int(tiles[0])
        if self.kv_splits:
            return replace(base, splits=min(self.kv_splits, n))
        if self.blocks(base) >= chip.aic.count:
            return base
        hg = self.heads // self.kvh
        sizes = sorted({m for m in (self.block_m, hg, hg // 2, hg // 4)
                        if 16 <= m <= max(self.block_m, hg) and (m % hg == 0 or hg % m == 0)})
        options = [replace(self.geometry(chip, m), splits=s) for m in sizes for s in range(1, n + 1)]
        return min(options, key=lambda p: (self.estimate(chip, p, n), p.splits))

    def blocks(self, p: Plan) -> int:
        return self.batch * self.kvh * p.hsplit * cdiv(self.tokens, p.tpb)

    def tiles(self, p: Plan) -> np.ndarray:
        """Key tiles each token block walks (the most any of its tokens needs)."""
        cols = self.per_token_columns()
        nq = cdiv(self.tokens, p.tpb)
        padded = np.zeros(nq * p.tpb, dtype=np.int64)
        padded[:self.tokens] = cols
        return np.maximum(1, -(-padded.reshape(nq, p.tpb).max(1) // self.block_n))

    def estimate(self, chip: Chip, p: Plan, n: int) -> float:
        """Seconds of a split plan (to choose one, not to time it): the longest of the waves of (block, key range)
        items — each as long as its cube work or its key loads (gathers by the two AIVs, else the AIC's MTE2) —, the
        L2 traffic (key rows once per head block, the C<->V workspaces, the partials) and the HBM traffic; plus the
        combine reading every range's partial output on all vector cores."""
        dq, dv = self.dims
        b, bn, tps = BYTES_PER_ELEMENT[self.dtype], self.block_n, cdiv(n, p.splits)
        ranges, tiles = cdiv(n, tps), p.groups * tps
        aiv = _rate(chip.aiv.pipes["mte2"], chip)
        cube = 2.0 * tiles * p.rows * bn * (dq + dv) / (chip.peak_cube_flops(self.dtype) / chip.aic.count)
        if self.gathered:  # rows gathered to the workspace, read back as K and as V
            feed, tile_kv = tiles * bn * (b * dq + 4.0) / (2 * aiv), bn * b * (2 * dq + dv)
        else:
            feed, tile_kv = tiles * bn * b * (dq + dv) / _rate(chip.aic.pipes["mte2"], chip), bn * b * (dq + dv)
        tile_ws = p.rows * (2.0 * bn * (4 + b) + 4 * 4.0 * dv)  # S, P, O~ and the running output: written, read
        items = self.blocks(p) * ranges
        rows = self.batch * self.tokens * self.heads
        partials = 2 * 4.0 * rows * dv * ranges if ranges > 1 else 0.0
        l2 = (items * tiles * (tile_kv + tile_ws) + partials) / (chip.l2.read_bandwidth * chip.efficiency.l2)
        hbm = self.work().hbm_bytes / (chip.hbm.bandwidth * chip.efficiency.hbm)
        return max(cdiv(items, chip.aic.count) * max(cube, feed), l2, hbm) + partials / (chip.aiv.count * aiv)

    def geometry(self, chip: Chip, bm: int) -> Plan:
        dq, dv = self.dims
        hg = self.heads // self.kvh
        if self.heads % self.kvh:
            raise NpusimError(f"{self.name}: heads={self.heads} is not a multiple of kv_heads={self.kvh}",
                              field="shape")
        bn = self.block_n
        if bn % VK:
            raise NpusimError(f"{self.name} block_n={bn} must be a multiple of {VK}", field="tiling.block_n")
        hb = min(hg, bm)
        if hg % hb or (hb == hg and bm % hg):
            raise NpusimError(f"{self.name} block_m={bm} must divide or be a multiple of the {hg} heads per KV head",
                              field="tiling.block_m")
        tpb = bm // hg if hb == hg else 1
        groups, rows = (tpb, hb) if self.gathered else (1, tpb * hb)
        halves = cdiv(dq, 288)
        dw = dq // halves
        bk = next((b for b in (96, 128, 64, 32, 16) if dw % b == 0), 0)
        vc = min(VC, dv)
        if dq % halves or not bk or dv % vc:
            raise NpusimError(f"{self.name}: d_qk={dq} / d_v={dv} do not split into cube blocks "
                              "(d_qk halves a multiple of 16, d_v a multiple of 128)", field="shape")
        ra = cdiv(rows, 2)
        fixed = (2 * nbytes(self.dtype, GATHER_ROWS, dq) if self.gathered else 0) + 4.0 * bn + 2 * 4.0 * 3 * ra
        per_row = 2 * 4.0 * bn + 2 * 2.0 * bn + 4 * 4.0 * dv
        vr = next((v for v in (32, 16, 8, 4, 2, 1) if v <= ra and fixed + per_row * v <= chip.aiv.buffers.ub), 1)
        return Plan(hb, tpb, hg // hb, groups, rows, min(128, rows), dw, bk, vc, vr, fixed + per_row * vr)

    def buffers(self, p: Plan) -> dict[str, float]:
        dq, _ = self.dims
        dt, c, bn = self.dtype, p.chunk, self.block_n
        return {"l1": nbytes(dt, p.rows, dq) + nbytes(dt, c, bn) + 3 * max(nbytes(dt, KC, p.dw), nbytes(dt, VK, p.vc)),
                "l0a": 2 * nbytes(dt, c, max(p.bk, KC)), "l0b": 2 * nbytes(dt, KC, max(p.bk, KC)),
                "l0c": 2 * 4.0 * c * KC, "ub": p.ub}

    def build(self, chip: Chip) -> Trace:
        need_cube(chip, self.dtype)
        p = self.plan(chip)
        dq, dv = self.dims
        dt, bn, T, S, B, KVH = self.dtype, self.block_n, self.tokens, self.keys, self.batch, self.kvh
        hg, c, R = self.heads // KVH, p.chunk, p.rows
        rq, ra, nch = cdiv(R, c), cdiv(R, 2), cdiv(cdiv(R, 2), p.vr)
        halves, dsteps = dq // p.dw, p.dw // p.bk
        scale = self.scale or dq ** -0.5
        g = self.gathered
        kv_bytes = B * KVH * self.kv_rows * nbytes(dt, dq)
        fits = kv_bytes <= chip.l2.size  # then rows read again (other blocks, other tokens' selections) hit L2
        hit_kv = 1 - 1 / max(1, cdiv(T, p.tpb) * p.hsplit) if fits else 0.0
        reuse = max(0.0, 1 - B * self.kv_rows / self.total_pairs()) if fits else 0.0  # other tokens chose the row
        # head blocks of one token gather the same rows at about the same time: all but the first read hit L2
        hit_gather = 1 - (1 - reuse) / p.hsplit
        # C<->V workspaces (gathered rows, S, P, O~, the running output) are written and read back at once: they
        # stay in the write-back L2 while all cores' workspaces fit in half of it (estimate: the rest caches KV)
        ws = (2 * nbytes(dt, bn, dq) if g else 0) + 2 * R * bn * (4.0 + BYTES_PER_ELEMENT[dt]) + 3 * 4.0 * R * dv
        ws_hit = 1.0 if ws * chip.aic.count <= chip.l2.size / 2 else 0.0
        rstop = (lin(("bk", T * hg), base=T * hg), dq)  # q rows of this (batch, kv head)
        ostop = (rstop[0], dv)
        kvstop = (lin(("bk", S), base=S), dq)
        istop = (lin(("bk", T), base=T), self.width if g else 0)

        # ---------------------------------------------------------------- AIC: C1 (S = Q K^T) and C2 (O~ = P V)
        @lru_cache(maxsize=None)
        def c1(slot: int, kt: Lin) -> tuple[Node, ...]:
            body: list[Node] = []
            for kc in range(bn // KC):
                for h in range(halves):
                    if g:
                        src = Ref(f"ws.kv{slot}", (kc * KC, h * p.dw), (KC, p.dw))
                    else:
                        src = Ref("k", (plus(kt, bn, ("kvrow", 1), base=kc * KC), h * p.dw), (KC, p.dw), kvstop)
                    first = kc == 0 and h == 0
                    body.append(ins("mte2", "load_k", Act("load", Ref(f"l1.k{h}", (0, 0), (KC, p.dw)), (src,), dt),
                                    bytes=nbytes(dt, KC, p.dw), dtype=dt, src="gm", dst="l1", hit=1.0 if g else hit_kv,
                                    wait=("k.free",) + (("kv.full0", "kv.full1") if g and first else ()),
                                    set=("k.full",)))
                for r in range(rq):
                    for h in range(halves):
                        for s in range(dsteps):
                            step, last = h * dsteps + s, h * dsteps + s == halves * dsteps - 1
                            col = h * p.dw + s * p.bk
                            body += [
                                ins("mte1", "load_l0a", Act("copy", Ref("l0a", (0, 0), (c, p.bk)),
                                                            (Ref("l1.q", (r * c, col), (c, p.bk)),), dt),
                                    bytes=nbytes(dt, c, p.bk), dtype=dt, src="l1", dst="l0a", wait=("l0.free",)),
                                ins("mte1", "load_l0b", Act("copy", Ref("l0b", (0, 0), (KC, p.bk)),
                                                            (Ref(f"l1.k{h}", (0, s * p.bk), (KC, p.bk)),), dt),
                                    bytes=nbytes(dt, KC, p.bk), dtype=dt, src="l1", dst="l0b",
                                    wait=("k.full",) if r == 0 and s == 0 else (),
                                    set=("l0.full",) + (("k.free",) if r == rq - 1 and s == dsteps - 1 else ())),
                                ins("cube", "mmad", Act("mmad", Ref("l0c", (0, 0), (c, KC)),
                                                        ((Ref("l0c", (0, 0), (c, KC)),) if step else ())
                                                        + (Ref("l0a", (0, 0), (c, p.bk)), Ref("l0b", (0, 0), (KC, p.bk))),
                                                        "fp32", (("transpose_b", True), ("accumulate", step > 0))),
                                    flops=2.0 * c * KC * p.bk, dtype=dt, src="l0a", dst="l0c",
                                    wait=("l0.full",) + (("l0c.free",) if step == 0 else ()),
                                    set=("l0.free",) + (("l0c.full",) if last else ()))]
                    edge_in, edge_out = kc == 0 and r == 0, kc == bn // KC - 1 and r == rq - 1
                    body.append(ins("fixpipe", "store_s", Act("fixpipe", Ref(f"ws.s{slot}", (r * c, kc * KC), (c, KC)),
                                                              (Ref("l0c", (0, 0), (c, KC)),), "fp32"),
                                    bytes=4.0 * c * KC, dtype="fp32", src="l0c", dst="gm", hit=ws_hit,
                                    wait=("l0c.full",) + (("s.free0", "s.free1") if edge_in else ()),
                                    set=("l0c.free",) + (("s.full0", "s.full1") if edge_out else ())))
            return tuple(body)

        @lru_cache(maxsize=None)
        def c2(slot: int, kt: Lin) -> tuple[Node, ...]:
            body: list[Node] = []
            nkh, ndv = bn // VK, dv // p.vc
            for r in range(rq):
                for kh in range(nkh):
                    body.append(ins("mte2", "load_p", Act("load", Ref("l1.p", (0, kh * VK), (c, VK)),
                                                          (Ref(f"ws.p{slot}", (r * c, kh * VK), (c, VK)),), dt),
                                    bytes=nbytes(dt, c, VK), dtype=dt, src="gm", dst="l1", hit=1.0,
                                    wait=(("pl1.free",) if kh == 0 else ()) + (("p.full0", "p.full1")
                                                                               if r == 0 and kh == 0 else ()),
                                    set=(("pl1.full",) if kh == nkh - 1 else ()) + (("p.free0", "p.free1")
                                                                                    if r == rq - 1 and kh == nkh - 1
                                                                                    else ())))
                for d in range(ndv):
                    for kh in range(nkh):
                        if g:
                            src = Ref(f"ws.kv{slot}", (kh * VK, d * p.vc), (VK, p.vc))
                        else:
                            src = Ref("v", (plus(kt, bn, ("kvrow", 1), base=kh * VK), d * p.vc), (VK, p.vc),
                                      (kvstop[0], dv))
                        release = g and r == rq - 1 and d == ndv - 1 and kh == nkh - 1
                        body.append(ins("mte2", "load_v", Act("load", Ref("l1.v", (0, 0), (VK, p.vc)), (src,), dt),
                                        bytes=nbytes(dt, VK, p.vc), dtype=dt, src="gm", dst="l1",
                                        hit=1.0 if g else hit_kv, wait=("k.free",),
                                        set=("k.full",) + (("kv.free0", "kv.free1") if release else ())))
                        for s in range(VK // KC):
                            step = kh * (VK // KC) + s
                            last = step == nkh * (VK // KC) - 1
                            body += [
                                ins("mte1", "load_l0a", Act("copy", Ref("l0a", (0, 0), (c, KC)),
                                                            (Ref("l1.p", (0, step * KC), (c, KC)),), dt),
                                    bytes=nbytes(dt, c, KC), dtype=dt, src="l1", dst="l0a",
                                    wait=(("pl1.full",) if d == 0 and step == 0 else ()) + ("l0.free",)),
                                ins("mte1", "load_l0b", Act("copy", Ref("l0b", (0, 0), (KC, p.vc)),
                                                            (Ref("l1.v", (s * KC, 0), (KC, p.vc)),), dt),
                                    bytes=nbytes(dt, KC, p.vc), dtype=dt, src="l1", dst="l0b",
                                    wait=("k.full",) if s == 0 else (),
                                    set=("l0.full",) + (("k.free",) if s == VK // KC - 1 else ())
                                    + (("pl1.free",) if d == ndv - 1 and last else ())),
                                ins("cube", "mmad", Act("mmad", Ref("l0c", (0, 0), (c, p.vc)),
                                                        ((Ref("l0c", (0, 0), (c, p.vc)),) if step else ())
                                                        + (Ref("l0a", (0, 0), (c, KC)), Ref("l0b", (0, 0), (KC, p.vc))),
                                                        "fp32", (("accumulate", step > 0),)),
                                    flops=2.0 * c * KC * p.vc, dtype=dt, src="l0a", dst="l0c",
                                    wait=("l0.full",) + (("l0c.free",) if step == 0 else ()),
                                    set=("l0.free",) + (("l0c.full",) if last else ()))]
                    edge_in, edge_out = r == 0 and d == 0, r == rq - 1 and d == ndv - 1
                    body.append(ins("fixpipe", "store_o", Act("fixpipe", Ref(f"ws.o{slot}", (r * c, d * p.vc),
                                                                             (c, p.vc)),
                                                              (Ref("l0c", (0, 0), (c, p.vc)),), "fp32"),
                                    bytes=4.0 * c * p.vc, dtype="fp32", src="l0c", dst="gm", hit=ws_hit,
                                    wait=("l0c.full",) + (("o.free0", "o.free1") if edge_in else ()),
                                    set=("l0c.free",) + (("o.full0", "o.full1") if edge_out else ())))
            return tuple(body)

        # ---------------------------------------------------------------- AIV a: gather, V1 softmax, V2 rescale
        def rows_of(a: int, j: int) -> int:
            return a * ra + j * p.vr

        @lru_cache(maxsize=None)
        def gather(a: int, slot: int, kt: Lin, o: int) -> tuple[Node, ...]:
            body: list[Node] = []
            half, n = bn // 2, bn // 2 // GATHER_ROWS
            for j in range(n):
                col = plus(kt, bn, base=a * half + j * GATHER_ROWS)
                body += [
                    ins("mte2", "gather", Act("gather", Ref("ub.g", (0, 0), (GATHER_ROWS, dq)),
                                              (Ref("indices", (lin((f"irow{o}", 1)), col), (1, GATHER_ROWS), istop),
                                               Ref("kv", (0, 0), (-1, -1))), dt,
                                              (("fill", -1), ("base", lin(("bk", self.kv_rows))))),
                        bytes=nbytes(dt, GATHER_ROWS, dq) + 4.0 * GATHER_ROWS, dtype=dt, src="gm", dst="ub",
                        hit=hit_gather, wait=(f"ub.free{a}",) + ((f"kv.free{a}",) if j == 0 else ()), set=(f"ub.full{a}",)),
                    ins("mte3", "store_kv", Act("store", Ref(f"ws.kv{slot}", (a * half + j * GATHER_ROWS, 0),
                                                             (GATHER_ROWS, dq)),
                                                (Ref("ub.g", (0, 0), (GATHER_ROWS, dq)),), dt),
                        bytes=nbytes(dt, GATHER_ROWS, dq), dtype=dt, src="ub", dst="gm", hit=ws_hit,
                        wait=(f"ub.full{a}",),
                        set=(f"ub.free{a}",) + ((f"kv.full{a}",) if j == n - 1 else ()))]
            return tuple(body)

        def mask_args(a: int, j: int, o: int) -> tuple:
            return (("scale", scale), ("qpos", lin((f"qpos{o}", 1))), ("row", rows_of(a, j)), ("hb", p.hb),
                    ("causal", self.mask_causal))

        @lru_cache(maxsize=None)
        def softmax(a: int, slot: int, kt: Lin, o: int, first: bool) -> tuple[Node, ...]:
            """V1 of one key tile of the group `o` groups ahead; its first tile starts the running max and sum."""
            pos = Ref("ub.pos", (0, 0), (1, bn))
            if g:
                body: list[Node] = [ins("mte2", "load_idx", Act("load", pos, (Ref("indices", (lin((f"irow{o}", 1)),
                                                                                          plus(kt, bn)), (1, bn),
                                                                                     istop),), "int32",
                                                                (("fill", -1),)),
                                        bytes=4.0 * bn, dtype="int32", src="gm", dst="ub")]
            else:
                body = [ins("vector", "iota", Act("iota", pos, (), "int32", (("kpos", plus(kt, bn)), ("keys", S))),
                            bytes=4.0 * bn, dtype="int32", src="ub", dst="ub")]
            for j in range(nch):
                s_ub, p_ub = Ref("ub.s", (0, 0), (p.vr, bn)), Ref("ub.p", (0, 0), (p.vr, bn))
                st = Ref(f"ub.st{slot}", (j * p.vr, 0), (p.vr, 3))
                body += [
                    ins("mte2", "load_s", Act("load", s_ub, (Ref(f"ws.s{slot}", (rows_of(a, j), 0), (p.vr, bn)),),
                                              "fp32"),
                        bytes=4.0 * p.vr * bn, dtype="fp32", src="gm", dst="ub", hit=1.0,
                        wait=(f"sb.free{a}",) + ((f"s.full{a}",) if j == 0 else ()),
                        set=(f"sb.full{a}",) + ((f"s.free{a}",) if j == nch - 1 else ())),
                    ins("vector", "softmax_state", Act("softmax_state", st, (pos, s_ub) + (
                        () if first else (Ref(f"ub.st{1 - slot}", (j * p.vr, 0), (p.vr, 3)),)), "fp32",
                                                       mask_args(a, j, o)),
                        flops=4.0 * p.vr * bn, bytes=4.0 * p.vr * bn, dtype="fp32", src="ub", dst="ub",
                        wait=(f"sb.full{a}",)),
                    ins("vector", "softmax_exp", Act("softmax_exp", p_ub, (pos, s_ub, st), dt, mask_args(a, j, o)),
                        flops=2.0 * p.vr * bn, bytes=4.0 * p.vr * bn, dtype="fp32", src="ub", dst="ub",
                        wait=(f"pb.free{a}",), set=(f"sb.free{a}", f"pb.full{a}")),
                    ins("mte3", "store_p", Act("store", Ref(f"ws.p{slot}", (rows_of(a, j), 0), (p.vr, bn)), (p_ub,), dt),
                        bytes=nbytes(dt, p.vr, bn), dtype=dt, src="ub", dst="gm", hit=ws_hit,
                        wait=(f"pb.full{a}",) + ((f"p.free{a}",) if j == 0 else ()),
                        set=(f"pb.free{a}",) + ((f"p.full{a}",) if j == nch - 1 else ()))]
            return tuple(body)

        acc_ub, o_ub = Ref("ub.acc", (0, 0), (p.vr, dv)), Ref("ub.o", (0, 0), (p.vr, dv))

        def acc_ws(a: int, j: int) -> Ref:
            return Ref("ws.acc", (rows_of(a, j), 0), (p.vr, dv))

        def store_acc(a: int, j: int) -> Node:
            return ins("mte3", "store_acc", Act("store", acc_ws(a, j), (acc_ub,), "fp32"), bytes=4.0 * p.vr * dv,
                       dtype="fp32", src="ub", dst="gm", hit=ws_hit, wait=(f"ab.done{a}",), set=(f"ab.free{a}",))

        @lru_cache(maxsize=None)
        def accumulate(a: int, slot: int, first: bool) -> tuple[Node, ...]:
            """V2: acc = acc * alpha + O~ (the rescale is its own instruction); a group's first tile just keeps O~."""
            body: list[Node] = []
            for j in range(nch):
                st = Ref(f"ub.st{slot}", (j * p.vr, 0), (p.vr, 3))
                o_ws = Ref(f"ws.o{slot}", (rows_of(a, j), 0), (p.vr, dv))
                o_wait, o_set = (f"o.full{a}",) if j == 0 else (), (f"o.free{a}",) if j == nch - 1 else ()
                if first:
                    body += [ins("mte2", "load_o", Act("load", acc_ub, (o_ws,), "fp32"), bytes=4.0 * p.vr * dv,
                                 dtype="fp32", src="gm", dst="ub", hit=1.0, wait=(f"ab.free{a}",) + o_wait,
                                 set=(f"ab.done{a}",) + o_set), store_acc(a, j)]
                    continue
                body += [
                    ins("mte2", "load_acc", Act("load", acc_ub, (acc_ws(a, j),), "fp32"), bytes=4.0 * p.vr * dv,
                        dtype="fp32", src="gm", dst="ub", hit=1.0, wait=(f"ab.free{a}",) + o_wait),
                    ins("mte2", "load_o", Act("load", o_ub, (o_ws,), "fp32"), bytes=4.0 * p.vr * dv, dtype="fp32",
                        src="gm", dst="ub", hit=1.0, set=(f"ab.full{a}",) + o_set),
                    ins("vector", "rescale", Act("rescale", acc_ub, (acc_ub, st), "fp32"), flops=1.0 * p.vr * dv,
                        bytes=4.0 * p.vr * dv, dtype="fp32", src="ub", dst="ub", wait=(f"ab.full{a}",)),
                    ins("vector", "accumulate", Act("add", acc_ub, (acc_ub, o_ub), "fp32"), flops=1.0 * p.vr * dv,
                        bytes=4.0 * p.vr * dv, dtype="fp32", src="ub", dst="ub", set=(f"ab.done{a}",)),
                    store_acc(a, j)]
            return tuple(body)

        @lru_cache(maxsize=None)
        def finalize(a: int, slot: int) -> tuple[Node, ...]:
            body: list[Node] = []
            for j in range(nch):
                st = Ref(f"ub.st{slot}", (j * p.vr, 0), (p.vr, 3))
                sink = (Ref("sink", (0, lin(("hk", p.hb), base=rows_of(a, j))), (1, p.vr)),) if self.with_sink else ()
                out = Ref("out", (lin(("grow0", 1), base=rows_of(a, j)), 0), (p.vr, dv), ostop)
                body += [ins("mte2", "load_acc", Act("load", acc_ub, (acc_ws(a, j),), "fp32"), bytes=4.0 * p.vr * dv,
                             dtype="fp32", src="gm", dst="ub", hit=1.0, wait=(f"ab.free{a}",), set=(f"ab.full{a}",)),
                         ins("vector", "finalize", Act("finalize", Ref("ub.out", (0, 0), (p.vr, dv)),
                                                       (acc_ub, st) + sink, "bf16"),
                             flops=2.0 * p.vr * dv, bytes=4.0 * p.vr * dv, dtype="fp32", src="ub", dst="ub",
                             wait=(f"ab.full{a}",), set=(f"ab.done{a}",)),
                         ins("mte3", "store_out", Act("store", out, (Ref("ub.out", (0, 0), (p.vr, dv)),), "bf16"),
                             bytes=nbytes("bf16", p.vr, dv), dtype="bf16", src="ub", dst="gm",
                             wait=(f"ab.done{a}",), set=(f"ab.free{a}",))]
            return tuple(body)

        # ---------------------------------------------------------------- split-KV: partials, barrier, combine
        Rtot = B * KVH * T * hg  # q rows of the launch, the row order of out and of the partials
        part_hit = 1.0 if 4.0 * Rtot * p.splits * (dv + 1) <= chip.l2.size else 0.0  # partials stay in L2

        @lru_cache(maxsize=None)
        def partial(a: int, slot: int) -> tuple[Node, ...]:
            """This key range's normalised output and log-sum-exp (m + ln l) per row, to the GM partials."""
            body: list[Node] = []
            for j in range(nch):
                st = Ref(f"ub.st{slot}", (j * p.vr, 0), (p.vr, 3))
                row = lin(("grow0", 1), base=rows_of(a, j))
                o_ub, lse_ub = Ref("ub.out", (0, 0), (p.vr, dv)), Ref("ub.lse", (0, 0), (p.vr, 1))
                body += [ins("mte2", "load_acc", Act("load", acc_ub, (acc_ws(a, j),), "fp32"), bytes=4.0 * p.vr * dv,
                             dtype="fp32", src="gm", dst="ub", hit=1.0, wait=(f"ab.free{a}",), set=(f"ab.full{a}",)),
                         ins("vector", "partial", Act("partial", o_ub, (acc_ub, st), "fp32"), flops=1.0 * p.vr * dv,
                             bytes=4.0 * p.vr * dv, dtype="fp32", src="ub", dst="ub", wait=(f"ab.full{a}",)),
                         ins("vector", "lse", Act("lse", lse_ub, (st,), "fp32"), flops=2.0 * p.vr, bytes=12.0 * p.vr,
                             dtype="fp32", src="ub", dst="ub", set=(f"ab.done{a}",)),
                         ins("mte3", "store_partial", Act("store", Ref("gm.part_o", (row, lin(("si", dv))), (p.vr, dv),
                                                                       (ostop[0], None)), (o_ub,), "fp32"),
                             bytes=4.0 * p.vr * dv, dtype="fp32", src="ub", dst="gm", hit=part_hit,
                             wait=(f"ab.done{a}",)),
                         ins("mte3", "store_lse", Act("store", Ref("gm.part_lse", (row, lin(("si", 1))), (p.vr, 1),
                                                                   (ostop[0], None)), (lse_ub,), "fp32"),
                             bytes=4.0 * p.vr, dtype="fp32", src="ub", dst="gm", hit=part_hit, set=(f"ab.free{a}",))]
            return tuple(body)

        def barrier(a: int) -> tuple[Node, ...]:
            """AscendC SyncAll between the phases: each vector core bumps a GM counter once its partials are out
            (MTE3, after its last store) and polls it before the combine reads; the engine and the functional path
            both run `sync_all` as a barrier over all cores, so the wait for the slowest core is timed."""
            return (ins("mte3", "sync_all", bytes=32.0, dtype="int32", src="ub", dst="gm", hit=1.0, set=(f"sync{a}",)),
                    ins("mte2", "sync_poll", bytes=32.0, dtype="int32", src="gm", dst="ub", hit=1.0,
                        wait=(f"sync{a}",)))

        def combine(a: int, ranges: int, cr: int) -> tuple[Node, ...]:
            """cr rows: weights w_s = e^(lse_s - M) / (sum_s e^(lse_s - M) [+ e^(sink - M)]), out = sum_s w_s o_s."""
            r0 = lin(("blk", 2 * cr), base=a * cr)
            stop = (Rtot, None)
            lse, wts, acc = Ref("ub.lse", (0, 0), (cr, ranges)), Ref("ub.w", (0, 0), (cr, ranges)), \
                Ref("ub.cacc", (0, 0), (cr, dv))
            sink = (Ref("sink", (0, lin(("blk", 2 * cr), base=a * cr, mod=hg)), (1, cr)),) if self.with_sink else ()
            body: list[Node] = [
                ins("mte2", "load_lse", Act("load", lse, (Ref("gm.part_lse", (r0, 0), (cr, ranges), stop),), "fp32"),
                    bytes=4.0 * cr * ranges, dtype="fp32", src="gm", dst="ub", hit=part_hit, wait=(f"cl.free{a}",),
                    set=(f"cl.full{a}",)),
                ins("vector", "merge_weights", Act("merge_weights", wts, (lse,) + sink, "fp32"),
                    flops=4.0 * cr * ranges, bytes=8.0 * cr * ranges, dtype="fp32", src="ub", dst="ub",
                    wait=(f"cl.full{a}", f"co.free{a}"), set=(f"cl.free{a}",)),
                ins("vector", "zero", Act("zero", acc), bytes=4.0 * cr * dv, dtype="fp32", dst="ub")]
            for r in range(ranges):
                o = Ref(f"ub.co{r % 2}", (0, 0), (cr, dv))
                body += [ins("mte2", "load_partial", Act("load", o, (Ref("gm.part_o", (r0, r * dv), (cr, dv), stop),),
                                                         "fp32"),
                             bytes=4.0 * cr * dv, dtype="fp32", src="gm", dst="ub", hit=part_hit,
                             wait=(f"cb.free{a}",), set=(f"cb.full{a}",)),
                         ins("vector", "merge", Act("axpy", acc, (acc, wts, o), "fp32", (("col", r),)),
                             flops=2.0 * cr * dv, bytes=8.0 * cr * dv, dtype="fp32", src="ub", dst="ub",
                             wait=(f"cb.full{a}",), set=(f"cb.free{a}",) + ((f"co.full{a}",) if r == ranges - 1 else ()))]
            body.append(ins("mte3", "store_out", Act("store", Ref("out", (r0, 0), (cr, dv), (Rtot, dv)), (acc,), "bf16"),
                            bytes=nbytes("bf16", cr, dv), dtype="bf16", src="ub", dst="gm", wait=(f"co.full{a}",),
                            set=(f"co.free{a}",)))
            return tuple(body)

        # ---------------------------------------------------------------- a block's stream of (group, key tile)
        # The tiles of all groups of a block form one stream u = gi * n + k, and the preload runs along it across
        # group boundaries: the AIC issues C1 one tile ahead of C2 (the next group's Q is loaded into the Q/P slots
        # once this group's last C1 is done, models.md §3.5), the AIVs gather two tiles ahead and run V1 one tile
        # ahead of V2, so the cube does not drain at every token. Buffer slots alternate along the stream.
        K0 = ("k0", 1)  # key tiles are numbered from the first tile of the block's key range
        G = p.groups
        gat = gather if g else (lambda a, slot, kt, o: ())
        end = partial if p.splits > 1 else finalize

        def at(k: int, n: int) -> Lin:
            """Key tile k of n; tiles near the end relative to the band's 'klast' so bands share instructions."""
            return lin(K0, base=k) if k < 3 else lin(("klast", 1), K0, base=k - n + 1)

        def bind(gi: Lin) -> Node:
            """Rows, token, query position and index row of the group and of the two after it."""
            b: dict[str, Lin] = {"gi": gi}
            for o in range(3):
                b |= {f"gtok{o}": lin(("t0", 1), ("gi", 1), base=o), f"grow{o}": lin(("row0", 1), ("gi", p.hb),
                                                                                    base=o * p.hb),
                      f"qpos{o}": lin((f"gtok{o}", 1), base=S - T), f"irow{o}": lin(("bk", T), (f"gtok{o}", 1))}
            return addr(**b)

        def stretch(count: int, j0: int, n: int, make, var: str) -> tuple[Node, ...]:
            """Iterations j0 .. j0+count-1 of a uniform run, unrolled by two so slots stay static; make(j, tile)
            gets the static j (its parity) and tile(d), the Lin of key tile j + d."""
            out: tuple[Node, ...] = ()
            if count <= 0:
                return out
            if count // 2:
                out += (Loop(count // 2, make(j0, lambda d: lin((var, 2), K0, base=j0 + d))
                             + make(j0 + 1, lambda d: lin((var, 2), K0, base=j0 + 1 + d)), var),)
            if count % 2:
                j = j0 + count - 1
                out += make(j, lambda d: at(j + d, n))
            return out

        def load_q(o: int) -> tuple[Node, ...]:
            q = Ref("q", (lin((f"grow{o}", 1)), 0), (R, dq), rstop)
            return (ins("mte2", "load_q", Act("load", Ref("l1.q", (0, 0), (R, dq)), (q,), dt), bytes=nbytes(dt, R, dq),
                        dtype=dt, src="gm", dst="l1", wait=("q.free",), set=("q.full",)),
                    ins("mte1", "wait_q", wait=("q.full",)))

        def aic_group(n: int, gp: int, ahead: int) -> tuple[Node, ...]:
            """C2 of the group's tiles with C1 one tile ahead, into the next group when there is one (ahead > 0)."""
            sl = lambda j: (gp * n + j) % 2  # noqa: E731
            body = stretch(n - 2, 0, n, lambda j, t: c1(sl(j + 1), t(1)) + c2(sl(j), t(0)), "kp")
            if n >= 2:
                body += c1(sl(n - 1), at(n - 1, n))
            body += (ins("mte1", "release_q", set=("q.free",)),)
            if n >= 2:
                body += c2(sl(n - 2), at(n - 2, n))
            if ahead:
                body += load_q(1) + c1(sl(n), at(0, n))
            return body + c2(sl(n - 1), at(n - 1, n))

        def aiv_group(a: int, n: int, gp: int, ahead: int) -> tuple[Node, ...]:
            """V2 of the group's tiles, V1 one tile and the gathers two tiles ahead (into the next `ahead` groups)."""
            sl = lambda j: (gp * n + j) % 2  # noqa: E731

            def step(j: int) -> tuple[Node, ...]:
                out: tuple[Node, ...] = ()
                o, k = divmod(j + 2, n)
                if o <= ahead:
                    out += gat(a, sl(j + 2), at(k, n), o)
                o, k = divmod(j + 1, n)
                if o <= ahead:
                    out += softmax(a, sl(j + 1), at(k, n), o, k == 0)
                out += accumulate(a, sl(j), j == 0)
                return out + (end(a, sl(j)) if j == n - 1 else ())

            body = step(0) + stretch(n - 3, 1, n, lambda j, t: gat(a, sl(j + 2), t(2), 0)
                                     + softmax(a, sl(j + 1), t(1), 0, False) + accumulate(a, sl(j), False), "kp")
            for j in range(max(1, n - 2), n):
                body += step(j)
            return body

        def stream(n: int, prologue: tuple[Node, ...], group) -> tuple[Node, ...]:
            """The prologue, the groups in a loop (two per iteration when n is odd, so slots repeat), the last two
            peeled (nothing runs ahead past the block's last group)."""
            out = (bind(Lin(0)),) + prologue
            unroll = 1 + n % 2
            looped = max(0, G - 2) // unroll * unroll
            if looped:
                body: tuple[Node, ...] = ()
                for e in range(unroll):
                    body += (bind(lin(("gl", unroll), base=e)),) + group(n, e, 2)
                out += (Loop(looped // unroll, body, "gl"),)
            for gi in range(looped, G):
                out += (bind(Lin(gi)),) + group(n, gi, min(2, G - 1 - gi))
            return out

        def aic_block(n: int) -> tuple[Node, ...]:
            return stream(n, load_q(0) + c1(0, at(0, n)), aic_group)

        def aiv_block(a: int, n: int) -> tuple[Node, ...]:
            o, k = divmod(1, n)
            second = gat(a, 1, at(k, n), o) if o < G else ()
            return stream(n, gat(a, 0, at(0, n), 0) + second + softmax(a, 0, at(0, n), 0, True),
                          lambda n_, gp, ahead: aiv_group(a, n_, gp, ahead))

        # ---------------------------------------------------------------- bands of blocks with equal tile counts
        tiles = self.tiles(p)
        nq = tiles.size
        edges = np.flatnonzero(np.diff(tiles)) + 1
        starts = np.concatenate([[0], edges])
        counts = np.diff(np.concatenate([starts, [nq]]))
        runs = []  # (tiles per block, blocks, band constants, head) of each run of equal blocks
        for tb0, ntb in zip(starts.tolist(), counts.tolist()):
            n = int(tiles[tb0])
            tps = cdiv(n, p.splits)  # tiles per key range: full ranges, then the shorter last one
            for s0, ns, k in ((0, n // tps, tps), (n // tps, 1, n % tps)):
                if not ns or not k:
                    continue
                head = addr(sj=lin(("blk", 1), mod=ns), si=lin(("sj", 1), ("s0", 1)), k0=lin(("si", tps)),
                            bq=lin(("blk", 1), div=ns), hk=lin(("bq", 1), mod=p.hsplit),
                            tq=lin(("bq", 1), div=p.hsplit, mod=ntb), bk=lin(("bq", 1), div=p.hsplit * ntb),
                            t0=lin(("first", p.tpb), ("tq", p.tpb)), row0=lin(("bk", T * hg), ("t0", hg), ("hk", p.hb)),
                            kvrow=lin(("bk", S)))
                runs.append((k, B * KVH * p.hsplit * ntb * ns, (("first", tb0), ("s0", s0), ("klast", k - 1)), head))

        def half(run, offset: int, block) -> tuple[Node, ...]:
            """Block u + offset of a run inside a unit (u: the unit's index, kept in 'u')."""
            k, _, constants, head = run
            return (addr(**dict(constants), blk=lin(("u", 1), base=offset)), head) + block(k)

        def unit(heavy, light, offset: int) -> Band:
            """Units of two causal-ramp blocks whose tiles add up to a full block's: the heavy one, then the light."""
            body = lambda block: (addr(u=lin(("blk", 1))),) + half(heavy, 0, block) + half(light, offset, block)  # noqa: E731
            return Band(light[1] - offset, body(aic_block), tuple(body(lambda k, a=a: aiv_block(a, k)) for a in range(2)))

        # The causal ramp (tokens with fewer keys than a full block's) is dealt as units of two blocks of k and
        # full - k tiles, as the indexer deals its triangle, so every core gets the same ramp work; dealt band by
        # band, the cores that drew each band's leftover blocks reach the full band out of phase, in as many folded
        # groups as there are leftover patterns, and their transient settles only after tens of blocks.
        full, ks = runs[-1][0], [run[0] for run in runs]
        ramp = {run[0]: run for run in runs[:-1]} if p.splits == 1 and full == max(ks) and len(set(ks)) == len(ks) \
            else {}
        bands, paired = [], set()
        for k in sorted(ramp, reverse=True):
            light = ramp.get(full - k)
            if k in paired or light is None or light[1] != ramp[k][1] or (light is ramp[k] and light[1] % 2):
                continue
            bands.append(unit(ramp[k], light, light[1] // 2 if light is ramp[k] else 0))
            paired |= {k, full - k}
        for k, blocks, constants, head in runs:
            if k not in paired:
                bands.append(Band(blocks, (head,) + aic_block(k), tuple((head,) + aiv_block(a, k) for a in range(2)),
                                  constants))
        ranges = cdiv(int(tiles[0]), cdiv(int(tiles[0]), p.splits)) if p.splits > 1 else 1
        ub_combine = cr = 0
        if ranges > 1:
            cr = next((r for r in (32, 16, 8, 4, 2) if (hg % r == 0 or not self.with_sink) and cdiv(Rtot, 2 * r) >= chip.aic.count
                       and 4.0 * r * (2 * ranges + 3 * dv) <= chip.aiv.buffers.ub), 1)
            ub_combine = 4.0 * cr * (2 * ranges + 3 * dv)
            bands.append(Band(cdiv(Rtot, 2 * cr), None, tuple(combine(a, ranges, cr) for a in range(2)),
                              lead=tuple(barrier(a) for a in range(2))))
        nab = min(2, nch)
        flags = {"q.free": 1, "q.full": 0, "k.free": 3, "k.full": 0, "pl1.free": 1, "pl1.full": 0, "l0.free": 2,
                 "l0.full": 0, "l0c.free": 2, "l0c.full": 0}
        for a in range(2):
            flags |= {f"{f}{a}": v for f, v in (("kv.free", 2), ("kv.full", 0), ("s.free", 2), ("s.full", 0),
                                                  ("p.free", 2), ("p.full", 0), ("o.free", 2), ("o.full", 0),
                                                  ("ub.free", 2), ("ub.full", 0), ("sb.free", 2), ("sb.full", 0),
                                                  ("pb.free", 2), ("pb.full", 0), ("ab.free", nab), ("ab.full", 0),
                                                  ("ab.done", 0), ("cl.free", 1), ("cl.full", 0),
                                                  ("cb.free", 2), ("cb.full", 0), ("co.free", 1), ("co.full", 0),
                                                  ("sync", 0))}
        w = self.work()
        buffers = self.buffers(p)
        buffers["ub"] = max(buffers["ub"], ub_combine)
        return Trace(self.name, chip.name, self.shape, distribute(bands, chip.aic.count, flags), w.cube_flops,
                     w.hbm_bytes, buffers,
                     {"block": (p.tpb * p.hb, bn), "row_group": R, "key_set": "gathered" if g else "contiguous",
                      "l0_c1": ((c, p.bk), (p.bk, KC)), "l0_c2": ((c, KC), (KC, p.vc)), "kv_ring": 3,
                      "aiv_rows": p.vr, "bands": len(bands), "kv_splits": ranges, "combine_rows": cr,
                      "scale": round(scale, 6)}, dtype=dt)


@register
@dataclass(frozen=True)
class SparseFlashAttention(Attention):
    """Absorbed-MLA attention of each token over its top-k selected latent rows (V3.2 DSA, models.md §1.4):
    q [batch*tokens*heads, d_qk], kv [batch*keys, d_qk] (V = first d_v columns), indices [batch*tokens, topk]
    (-1 = none) -> out [batch*tokens*heads, d_v]."""

    name: ClassVar[str] = "sparse_flash_attention"
    options: ClassVar[tuple[str, ...]] = ("dtype", "causal", "block_m", "block_n", "scale", "kv_splits")
    tokens: int
    keys: int
    heads: int = 128
    d_qk: int = 576
    d_v: int = 512
    topk: int = 2048
    pairs: int = 0  # total query-key pairs (op graph); 0 = derive from positions
    batch: int = 1
    causal: int = 1
    dtype: str = "bf16"
    block_m: int = 256
    block_n: int = 512
    scale: float = 0.0  # 0 = d_qk^-0.5
    kv_splits: int = 0  # key ranges per block: 0 = split-KV when blocks < cores, 1 = never

    @property
    def width(self) -> int:
        return self.topk

    def columns(self, p: np.ndarray) -> np.ndarray:
        return np.minimum(self.topk, p + 1) if self.causal else np.full(p.shape, min(self.topk, self.keys))


@register
@dataclass(frozen=True)
class FlashAttention(Attention):
    """Dense attention (V3.1 MHA prefill, absorbed dense decode): q [batch*kv_heads*tokens*(heads/kv_heads), d_qk],
    k [batch*kv_heads*keys, d_qk], v [batch*kv_heads*keys, d_v] -> out rows like q. Causal: queries are the last
    `tokens` positions of `keys`."""

    name: ClassVar[str] = "flash_attention"
    options: ClassVar[tuple[str, ...]] = ("dtype", "causal", "block_m", "block_n", "scale", "kv_splits")
    gathered: ClassVar[bool] = False
    tokens: int
    keys: int
    heads: int = 128
    d_qk: int = 192
    d_v: int = 128
    kv_heads: int = 1  # heads sharing keys: 1 = MQA (absorbed MLA), heads = MHA
    pairs: int = 0
    batch: int = 1
    causal: int = 1
    dtype: str = "bf16"
    block_m: int = 128
    block_n: int = 512
    scale: float = 0.0
    kv_splits: int = 0

    @property
    def width(self) -> int:
        return 0

    def columns(self, p: np.ndarray) -> np.ndarray:
        return p + 1 if self.causal else np.full(p.shape, self.keys)


@register
@dataclass(frozen=True)
class V4Attention(Attention):
    """DeepSeek-V4 shared-KV attention with a per-head sink (models.md §2.2, §2.4): each token attends to its
    window of raw rows and to compressed entries (HCA: all, CSA: the indexer's top-k). kv [batch*(keys +
    keys//ratio), head_dim] = raw rows then compressed entries; indices [batch*tokens, window + topk (or
    keys//ratio)] index into it (-1 = none); sink [1, heads]."""

    name: ClassVar[str] = "v4_attention"
    options: ClassVar[tuple[str, ...]] = ("dtype", "block_m", "block_n", "scale", "kv_splits")
    tokens: int
    keys: int
    heads: int = 64
    head_dim: int = 512
    window: int = 128
    ratio: int = 0  # 0 = window only (SWA), 4 = CSA (top-k), 128 = HCA (all entries)
    topk: int = 0
    pairs: int = 0
    sink: int = 1  # 1 = a learnable per-head sink joins the softmax denominator
    batch: int = 1
    dtype: str = "bf16"
    block_m: int = 256  # SAS A3 basic block (256, 512), models.md §3.6
    block_n: int = 512
    scale: float = 0.0
    kv_splits: int = 0
    causal: ClassVar[int] = 0  # the index set is causal by construction

    @property
    def dims(self) -> tuple[int, int]:
        return self.head_dim, self.head_dim

    @property
    def with_sink(self) -> bool:
        return bool(self.sink)

    @property
    def entries(self) -> int:
        return self.keys // self.ratio if self.ratio else 0

    @property
    def kv_rows(self) -> int:
        return self.keys + self.entries

    @property
    def width(self) -> int:
        return self.window + (self.topk or self.entries)

    def compressed(self, p: np.ndarray) -> np.ndarray:
        if not self.ratio:
            return np.zeros_like(p)
        done = (p + 1) // self.ratio
        return np.minimum(self.topk, done) if self.topk else done

    def columns(self, p: np.ndarray) -> np.ndarray:
        return self.window + self.compressed(p)

    def visible(self, p: np.ndarray) -> np.ndarray:
        return np.minimum(self.window, p + 1) + self.compressed(p)
