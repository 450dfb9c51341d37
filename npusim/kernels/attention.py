"""Flash attention over each query token's key set: Sparse Flash Attention, dense flash attention, V4 shared-KV.

One mechanism (models.md §3.5): a block of query rows (the AscendC SFA's basic block: one token's 128 heads — its
tiling sets mBaseSize to gSize, the heads sharing a KV head — by 512 selected keys) streams key tiles of `block_n`. Per tile the AIC computes S = Q K^T (C1, L0 blocks (128, 96) x
(96, 128), FIXPIPE to a GM workspace); the AIVs run the online-softmax step (V1: running max and sum, P = exp(S - m)
in bf16); the AIC computes O~ = P V (C2, (128, 128) x (128, 128) blocks); the AIVs rescale the accumulator by
exp(m_old - m_new) and add O~ (V2: the rescale is its own instruction, so a tiling that drops it fails
numerically). The AIC preloads — C1 of tile k+1 is issued before C2 of tile k — so the cube works while the vectors
run the softmax. L1 holds the row group's Q, one 128-row chunk of P and a triple-buffered ring of K (128 keys x 288
dims) and V (256 keys x 128 dims) chunks.

The kernels differ only in a query token's key set, walked as `KeyTile`s:
- gathered (SFA: the indexer's top-k; V4 CSA: the top-k compressed entries): the AIVs gather the selected rows into
  a per-core workspace (two vector cores issue the discrete copies at twice the cube's rate, models.md §3.5); a row
  group (the rows sharing key tiles) is one token's heads.
- contiguous (dense flash attention, causal; V4 HCA: every completed compressed entry): the AIC loads key tiles
  straight from GM; for flash attention all tokens of a block share them and the causal mask is applied per row.
- a window ahead of the key set (V4: each token's last `window` raw rows, one key tile read contiguously by the
  AIC, as the AscendC SparseAttnSharedkv's SWA part); a token's tiles then hold the keys it has, not a padded
  block_n.

Where V is the first d_v columns of the K rows (absorbed MLA's latent, V4's shared KV) C2 loads its V chunks from GM
again, as ops-transformer's IncreFlashAttention MLA reloads V into its KV ring (IfaMatmulFullQuant::ComputeMm2), and L2
serves them: its block's C1 has just read those rows. A decode launch holds `batch` sequences, each with its own keys.

Decode with fewer blocks than cores splits each block's keys into ranges (split-KV, flash-decoding): every range
writes its normalised output and log-sum-exp, and after a SyncAll the vector cores combine them. The causal ramp of
a prefill is dealt as units of two blocks whose key tiles add up to a full block's (when the blocks outnumber the
cores: in one wave a unit would put two blocks on one core).

Written on the tile-program layer (npusim.kernels.program): `FlashProgram` declares the queues (`Queues`: Q, the
K/V ring, P, L0 and L0C on the AIC; the gathered rows, S, P and O~ between the AIC and its AIVs through GM; each
AIV's UB buffers) and writes the stages C1 / C2 (AIC) and gather / V1 / V2 / finalize / partial / combine (AIV) as
its methods, each built once per (slot, key tile, group offset) and spliced along a block's stream. A plan's
`buffering` is the depth of the double-buffered queues (depth 1 deadlocks: the stream releases its slots in pairs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from npusim.errors import NpusimError
from npusim.kernels.base import Allowed, Band, Kernel, Work, cdiv, nbytes, need_cube, register
from npusim.kernels.program import AIC, AIV, AIVS, Code, Queue, TileProgram, stage
from npusim.kernels.tile import Act, Lin, Ref, lin
from npusim.kernels.trace import Node, Trace
from npusim.spec.chip import BYTES_PER_ELEMENT, Chip

KC, VK, VC = 128, 256, 128  # keys per K chunk, keys per V chunk, V columns per chunk (models.md §3.5)
GATHER_ROWS = 32  # rows a vector core gathers into UB before one copy-out (the AscendC SFA's 32-row merge buffer)
SOFTMAX_FLOPS = 6  # vector FLOPs per score: scale, mask, max, subtract, exp, sum (estimate)
AIV_ROWS = (32, 16, 8, 4, 2, 1)  # rows of an AIV's UB chunk the tiler considers, most first
SHORTLIST = 3  # split plans the tuner (npusim.engine.tune) times


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
    """Shared mechanism; subclasses give the shape fields, `gathered`, `columns(p)` and `visible(p)`, and for a key
    set with a window part its `window_keys`."""

    gathered: ClassVar[bool] = True  # the key set (past the window) is gathered through index columns by the AIVs
    kv_arrays: ClassVar[tuple[str, str]] = ("kv", "kv")  # the GM arrays K and V rows are read from
    with_sink: ClassVar[bool] = False
    pair_copies: ClassVar[int] = 1  # DMA instructions per pair of gathered rows (two rows per copy, a gap between)
    sized: ClassVar[bool] = False  # a token's last key tile holds the keys left (in KC chunks), not a padded block_n
    window_keys: ClassVar[int] = 0  # raw rows before each query read contiguously ahead of its key set (V4)
    split_heads: ClassVar[bool] = True  # split-KV may also split a token's heads over blocks
    limits: ClassVar[dict[str, Allowed]] = {"causal": Allowed(choices=(0, 1)), "sink": Allowed(choices=(0, 1)),
                                            "kv_splits": Allowed(low=0)}  # 0: the tiler's split

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
    def v_in_k(self) -> bool:
        """V is the first d_v columns of the K rows (MLA's latent, V4's shared KV): C2 re-reads rows its block's C1
        has just loaded, so a V chunk read from GM comes from L2."""
        return self.kv_arrays[0] == self.kv_arrays[1]

    @property
    def per_token(self) -> bool:
        """Every token has its own key set (gathered, or a window of its own): a row group is one token's heads."""
        return self.gathered or bool(self.window_keys)

    @property
    def main_row0(self) -> int:
        """Row of a sequence's kv array where a contiguous key set starts (V4: the compressed entries follow the raw
        rows)."""
        return 0

    def main_limit(self, qpos: Lin) -> Lin | int:
        """One past the last valid row of a contiguous key set for the query at `qpos`."""
        return self.keys

    @property
    def head_major(self) -> bool:
        """Q and out rows ordered (head, token) within a KV head (BNSD): a block is block_m tokens of one head."""
        return getattr(self, "layout", "BSND") == "BNSD"

    @property
    def key_set(self) -> str:
        return ("window + " if self.window_keys else "") + ("gathered" if self.gathered else "contiguous")

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
        if self.pairs:  # the op graph's uniform split of its query-key pairs (past the window)
            return np.full(self.tokens, max(0, cdiv(self.pairs, self.batch * self.tokens) - self.window_keys))
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
        if self.per_token:  # each selected row once at least; repeats may come from L2; the index columns read
            index = 4.0 * self.batch * self.tokens * (self.width - self.window_keys) if self.gathered else 0.0
            kv = min(pairs, self.batch * self.kv_rows) * nbytes(dt, dq) + index
        else:
            kv = self.batch * self.kvh * self.keys * nbytes(dt, dq + (dv if self.kvh > 1 else 0))
        return Work(2.0 * pairs * heads * (dq + dv), qo + kv, vector_flops=SOFTMAX_FLOPS * pairs * heads,
                    cube_dtype=dt)

    # ------------------------------------------------------------------ tiling
    def plan(self, chip: Chip) -> Plan:
        """The block geometry; split-KV when the blocks (sequence x head-block x token-block) are fewer than the cores.

        Decode has few tokens per sequence, so without a key split most cores idle. Split-KV gives each core a key
        range of a block and merges the partial results afterwards (flash-decoding). `kv_splits` 0 chooses the
        block (a token's heads, or, where the kernel splits heads, half or a quarter of them) and the number of
        ranges that minimise an estimate of the waves of work plus the combine; it needs every block to walk the same
        key tiles (uniform decode).
        """
        ranked = self.split_options(chip)
        return ranked[0][2] if ranked else self.fixed_plan(chip)

    def fixed_plan(self, chip: Chip) -> Plan:
        """The plan when there is no split to search: the block of `block_rows`, split `kv_splits` ways if given."""
        base = self.geometry(chip, self.block_rows(chip))
        walks, tiles = self.walks(base), self.tiles(base)
        if self.kv_splits in (0, 1) or len(set(walks)) > 1:
            return base
        return replace(base, splits=min(self.kv_splits, int(tiles[0])))

    def split_options(self, chip: Chip) -> list[tuple[int, int, Plan]]:
        """(block rows, key ranges, plan) of the split-KV search, best first by `estimate` (the SHORTLIST best, for the
        tuner to time); empty when there is nothing to choose."""
        bm = self.block_rows(chip)
        base = self.geometry(chip, bm)
        walks, tiles = self.walks(base), self.tiles(base)
        if self.kv_splits or len(set(walks)) > 1 or self.blocks(base) >= chip.aic.count:
            return []
        n = int(tiles[0])
        hg = self.heads // self.kvh
        heads = (hg, hg // 2, hg // 4) if self.split_heads and not self.head_major else ()
        sizes = sorted({m for m in (bm,) + heads if 16 <= m <= max(bm, hg) and (m % hg == 0 or hg % m == 0)}
                       | ({bm} if self.head_major else set()))
        options = [(m, s, replace(self.geometry(chip, m), splits=s)) for m in sizes for s in range(1, n + 1)]
        scored = sorted(((self.estimate(chip, p, n), s, m, p) for m, s, p in options), key=lambda o: o[:3])
        return [(m, s, p) for e, s, m, p in scored[:SHORTLIST]]

    def candidates(self, chip: Chip) -> tuple[Kernel, ...]:
        """The split plans `split_options` shortlists (block rows and key ranges explicit), then each with fewer
        rows per AIV chunk: the fixed ladder 32, 16, 8 ... from the most that fit UB down to a quarter of a row
        group's half (a larger chunk leaves the AIV's load, softmax and store less to overlap)."""
        picks = [replace(self, block_m=m, kv_splits=s) for m, s, _ in self.split_options(chip)] or [self]
        if self.aiv_rows:
            return tuple(picks)
        out = list(picks)
        for pick in picks:
            p = pick.plan(chip)
            least = min(32, cdiv(p.rows, 2)) / 4
            out += [replace(pick, aiv_rows=v) for v in AIV_ROWS if least <= v < p.vr]
        return tuple(out)

    def block_rows(self, chip: Chip) -> int:
        """Query rows of a block: block_m, or with block_m 0 a core's share of a sequence's tokens (a token's heads
        each), streamed through one pipeline as the AscendC SAS streams the contiguous range its metadata deals a
        core."""
        if self.block_m:
            return self.block_m
        hg = self.heads // self.kvh
        return hg * cdiv(self.tokens, max(1, chip.aic.count // (self.batch * self.kvh)))

    def blocks(self, p: Plan) -> int:
        return self.batch * self.kvh * p.hsplit * cdiv(self.tokens, p.tpb)

    def tiles(self, p: Plan) -> np.ndarray:
        """Key tiles each token block walks."""
        return np.array([len(w) for w in self.walks(p)])

    def walks(self, p: Plan) -> list[tuple[int, ...]]:
        """The keys of each key tile a token block walks (the most any of its tokens needs): the window's tile, then
        the key set's, block_n keys each (a sized last tile holds the keys left, in KC chunks)."""
        cols = self.per_token_columns()
        nq = cdiv(self.tokens, p.tpb)
        padded = np.zeros(nq * p.tpb, dtype=np.int64)
        padded[:self.tokens] = cols
        bn, window = self.block_n, (cdiv(self.window_keys, KC) * KC,) if self.window_keys else ()
        out = []
        for most in padded.reshape(nq, p.tpb).max(1).tolist():
            full, rest = divmod(most, bn)
            if self.sized and most <= bn:  # a key set of one tile: a tile of its keys; longer ones walk full tiles
                keys = (cdiv(most, KC) * KC,) if most else ()
            else:
                keys = (bn,) * max(0 if window else 1, cdiv(most, bn))
            out.append(window + keys)
        return out

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
        hb = 1 if self.head_major else min(hg, bm)
        if not self.head_major and hg % hb:  # a block of at least hg rows holds whole tokens' heads (bm // hg of
            # them: 10 tokens of a 12-head group in 128 rows, Qwen3-Coder / GLM-4.5 under attention TP)
            raise NpusimError(f"{self.name} block_m={bm} must divide the {hg} heads per KV head or hold at least "
                              f"them", field="tiling.block_m")
        # a block never walks tokens that are not there
        tpb = min(bm, self.tokens) if self.head_major else min(bm // hg, self.tokens) if hb == hg else 1
        groups, rows = (tpb, hb) if self.per_token else (1, tpb * hb)
        if self.window_keys > bn:
            raise NpusimError(f"{self.name}: window={self.window_keys} must fit one key tile (block_n={bn})",
                              field="tiling.block_n")
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
        vr = self.aiv_rows or next((v for v in AIV_ROWS if v <= ra and fixed + per_row * v <= chip.aiv.buffers.ub), 1)
        return Plan(hb, tpb, hg // hb, groups, rows, min(128, rows), dw, bk, vc, vr, fixed + per_row * vr)

    def kv_chunk(self, p: Plan) -> float:
        """Bytes of one buffer of the L1 ring holding K chunks (C1) and V chunks (C2)."""
        return max(nbytes(self.dtype, KC, p.dw), nbytes(self.dtype, VK, p.vc))

    def build(self, chip: Chip) -> Trace:
        need_cube(chip, self.dtype)
        p = self.plan(chip)
        f = FlashProgram(self, chip, p)
        bands = f.bands()
        combine = f.combine_band()
        if combine:
            bands.append(combine)
        w = self.work()
        buffers = f.prog.buffers() | {"ub": max(p.ub, f.ub_combine)}
        return Trace(self.name, chip.name, self.shape, f.prog.groups(bands, chip.aic.count), w.cube_flops,
                     w.hbm_bytes, buffers,
                     {"block": (p.tpb * p.hb, self.block_n), "row_group": p.rows, "key_set": self.key_set,
                      "l0_c1": ((p.chunk, p.bk), (p.bk, KC)),
                      "l0_c2": ((p.chunk, KC), (KC, p.vc)), "kv_ring": 3, "aiv_rows": p.vr, "bands": len(bands),
                      "kv_splits": f.ranges, "combine_rows": f.cr, "scale": round(f.scale, 6)} | f.prog.tiling(),
                     dtype=self.dtype)


@dataclass(frozen=True)
class Queues:
    """An attention launch's queues. On the AIC: Q rows in L1 (q), the L1 ring of K and V chunks (k, three deep),
    one P chunk in L1 (pl1), L0A/L0B blocks (l0), L0C accumulators (l0c). Through the core's GM workspaces: the
    gathered rows (kv, AIVs -> AIC), S (s) and O~ (o) to the AIVs, P back (p). On each AIV: the gather's UB rows
    (ub), the S chunk (sb) and P chunk (pb) of the softmax, the accumulator (acc: load -> rescale -> store), and the
    combine's weights (cl), partial outputs (cb) and result (co)."""

    q: Queue
    k: Queue
    pl1: Queue
    l0: Queue
    l0c: Queue
    kv: Queue
    s: Queue
    p: Queue
    o: Queue
    ub: Queue
    sb: Queue
    pb: Queue
    acc: Queue
    cl: Queue
    cb: Queue
    co: Queue


@dataclass(frozen=True)
class Run:
    """Blocks of a band walking the key tiles of `walk` (their keys): how many, the band's constants and the block
    head's bindings."""

    walk: tuple[int, ...]
    blocks: int
    constants: tuple[tuple[str, int], ...]
    head: dict[str, Lin]
    window: bool = False  # the walk starts with the group's window (its first key range)

    @property
    def tiles(self) -> int:
        return len(self.walk)


@dataclass(frozen=True)
class KeyTile:
    """A key tile of a row group's walk: `keys` keys, the group's window (raw rows read contiguously) or tile kt of
    its key set (gathered through the index columns, or contiguous), of the group `o` groups on."""

    kt: Lin
    keys: int
    window: bool
    gathered: bool
    o: int
    ws: int = 0  # the gathered rows' workspace slot (gathered tiles alternate between two)


K0 = ("k0", 1)  # key tiles are numbered from the first tile of the block's key range


def at(k: int, n: int) -> Lin:
    """Key tile k of n; tiles near the end relative to the band's 'klast' so bands share instructions."""
    return lin(K0, base=k) if k < 3 else lin(("klast", 1), K0, base=k - n + 1)


class FlashProgram:
    """The tile program of one attention launch (see the module docstring): the stages C1 / C2 on the AIC, gather /
    V1 / V2 / finalize (or the split-KV partial) on each AIV, the combine after a SyncAll, and the stream of
    (row group, key tile) items that preloads across them; then the bands of blocks."""

    def __init__(self, k: Attention, chip: Chip, p: Plan):
        self.k, self.chip, self.p = k, chip, p
        self.dq, self.dv = k.dims
        self.dt, self.bn, self.g = k.dtype, k.block_n, k.gathered
        T, S, B, KVH = k.tokens, k.keys, k.batch, k.kvh
        self.hg, self.R, self.c = k.heads // KVH, p.rows, p.chunk
        self.rq, self.ra = cdiv(p.rows, p.chunk), cdiv(p.rows, 2)
        self.nch = cdiv(self.ra, p.vr)
        self.halves, self.dsteps = self.dq // p.dw, p.dw // p.bk
        self.scale = k.scale or self.dq ** -0.5
        self.rtot = B * KVH * T * self.hg  # q rows of the launch, the row order of out and of the partials
        self.hits(chip)
        # q rows of this (batch, kv head), or of this head when its rows are head-major
        self.rstop = (lin(("bk", T * self.hg), ("hk", T), base=T) if k.head_major else
                      lin(("bk", T * self.hg), base=T * self.hg), self.dq)
        self.ostop = (self.rstop[0], self.dv)
        self.kvstop = (lin(("bk", k.kv_rows), base=k.kv_rows), self.dq)
        self.shift = 1 if k.window_keys else 0  # a group's window tile comes before its key set's tiles
        self.wt = self.shift  # window tiles at the start of the walk being written (0 past the first key range)
        self.istop = (lin(("bk", T), base=T), k.width if self.g else 0)
        tiles = int(k.tiles(p)[0])
        self.ranges = cdiv(tiles, cdiv(tiles, p.splits)) if p.splits > 1 else 1
        self.cr = self.combine_rows() if self.ranges > 1 else 0
        self.ub_combine = 4.0 * self.cr * (2 * self.ranges + 3 * self.dv) if self.ranges > 1 else 0
        self.prog = TileProgram(k.name, chip, k.buffering)
        self.q = self.queues()

    def hits(self, chip: Chip) -> None:
        """The fractions of reads served by L2 (the tiler knows the reuse)."""
        k, p, dt, bn, dq = self.k, self.p, self.dt, self.bn, self.dq
        fits = k.batch * k.kvh * k.kv_rows * nbytes(dt, dq) <= chip.l2.size  # then rows read again hit L2
        self.hit_kv = 1 - 1 / max(1, cdiv(k.tokens, p.tpb) * p.hsplit) if fits else 0.0  # other blocks' reads
        reuse = max(0.0, 1 - k.batch * k.kv_rows / k.total_pairs()) if fits else 0.0  # other tokens chose the row
        # head blocks of one token gather the same rows at about the same time: all but the first read hit L2
        self.hit_gather = 1 - (1 - reuse) / p.hsplit
        # C<->V workspaces (gathered rows, S, P, O~, the running output) are written and read back at once: they
        # stay in the write-back L2 while all cores' workspaces fit in half of it (estimate: the rest caches KV)
        ws = ((2 * nbytes(dt, bn, dq) if self.g else 0) + 2 * self.R * bn * (4.0 + BYTES_PER_ELEMENT[dt])
              + 3 * 4.0 * self.R * self.dv)
        self.ws_hit = 1.0 if ws * chip.aic.count <= chip.l2.size / 2 else 0.0
        self.part_hit = 1.0 if 4.0 * self.rtot * p.splits * (self.dv + 1) <= chip.l2.size else 0.0  # partials in L2

    def combine_rows(self) -> int:
        """Rows per combine tile: enough tiles for every core, a sink's head period respected, in UB."""
        ub, hg, dv, ranges = self.chip.aiv.buffers.ub, self.hg, self.dv, self.ranges
        return next((r for r in (32, 16, 8, 4, 2) if (hg % r == 0 or not self.k.with_sink)
                     and cdiv(self.rtot, 2 * r) >= self.chip.aic.count
                     and 4.0 * r * (2 * ranges + 3 * dv) <= ub), 1)

    def queues(self) -> Queues:
        prog, p, dt, kc = self.prog, self.p, self.dt, self.k.kv_chunk(self.p)
        aic, aiv = lambda pipe: (AIC, pipe), lambda pipe: (AIV, pipe)  # noqa: E731
        return Queues(
            prog.queue("q", aic("mte2"), aic("mte1"), depth=1, slot={"l1": nbytes(dt, p.rows, self.dq)}),
            prog.queue("k", aic("mte2"), aic("mte1"), depth=3, slot={"l1": kc}),
            prog.queue("pl1", aic("mte2"), aic("mte1"), depth=1, slot={"l1": nbytes(dt, p.chunk, self.bn)}),
            prog.queue("l0", aic("mte1"), aic("cube"), depth=2,
                       slot={"l0a": nbytes(dt, p.chunk, max(p.bk, KC)), "l0b": nbytes(dt, KC, max(p.bk, KC))}),
            prog.queue("l0c", aic("cube"), aic("fixpipe"), depth=2, slot={"l0c": 4.0 * p.chunk * KC}),
            prog.queue("kv", aiv("mte3"), aic("mte2"), depth=2), prog.queue("s", aic("fixpipe"), aiv("mte2"), depth=2),
            prog.queue("p", aiv("mte3"), aic("mte2"), depth=2), prog.queue("o", aic("fixpipe"), aiv("mte2"), depth=2),
            prog.queue("ub", aiv("mte2"), aiv("mte3"), depth=2), prog.queue("sb", aiv("mte2"), aiv("vector"), depth=2),
            prog.queue("pb", aiv("vector"), aiv("mte3"), depth=2),
            prog.queue("acc", aiv("mte2"), aiv("vector"), aiv("mte3"), depth=min(2, self.nch)),
            prog.queue("cl", aiv("mte2"), aiv("vector"), depth=1), prog.queue("cb", aiv("mte2"), aiv("vector"), depth=2),
            prog.queue("co", aiv("vector"), aiv("mte3"), depth=1))

    # ---------------------------------------------------------------- AIC: C1 (S = Q K^T) and C2 (O~ = P V)
    @stage
    def load_q(self, c: Code, o: int) -> None:
        """The Q rows of the group `o` groups on into L1 (the Q/P slots are free once the last C1 of the group
        before is done)."""
        dt, R, dq, q = self.dt, self.R, self.dq, self.q.q
        c.alloc(q)
        c.op("mte2", "load_q", Act("load", Ref("l1.q", (0, 0), (R, dq)),
                                   (Ref("q", (lin((f"grow{o}", 1)), 0), (R, dq), self.rstop),), dt),
             bytes=nbytes(dt, R, dq), dtype=dt, src="gm", dst="l1")
        c.enque(q)
        c.deque(q)
        c.op("mte1", "wait_q")

    @stage
    def release_q(self, c: Code) -> None:
        c.op("mte1", "release_q")
        c.free(self.q.q)

    @stage
    def c1(self, c: Code, slot: int, t: KeyTile) -> None:
        """S = Q K^T for key tile t: per 128-key chunk, its K halves into L1, the rows' chunks through L0 into an
        L0C accumulator, FIXPIPE to the S workspace (the AIVs are told after the tile's last chunk)."""
        p, c_, nkc = self.p, self.c, t.keys // KC
        for kc in range(nkc):
            for h in range(self.halves):
                self.load_k(c, slot, t, kc, h)
            for r in range(self.rq):
                for h in range(self.halves):
                    for s in range(self.dsteps):
                        step = h * self.dsteps + s
                        col = h * p.dw + s * p.bk
                        self.split(c, Ref("l1.q", (r * c_, col), (c_, p.bk)), Ref(f"l1.k{h}", (0, s * p.bk),
                                                                                   (KC, p.bk)),
                                   (c_, p.bk), (KC, p.bk), take_k=r == 0 and s == 0,
                                   give_k=r == self.rq - 1 and s == self.dsteps - 1)
                        self.mmad(c, (c_, p.bk), (KC, p.bk), KC, step, step == self.halves * self.dsteps - 1,
                                  (("transpose_b", True),))
                self.store(c, "store_s", Ref(f"ws.s{slot}", (r * c_, kc * KC), (c_, KC)), self.q.s,
                           kc == 0 and r == 0, kc == nkc - 1 and r == self.rq - 1)

    def rows(self, t: KeyTile, array: str, off: int, col: int, size: tuple[int, int], dim: int) -> Ref:
        """Key rows of tile t from its row `off` on, read straight from GM: the token's window (the raw rows ending
        at its position) or key tile kt of a contiguous key set."""
        k = self.k
        if t.window:
            start = lin(("kvrow", 1), (f"qpos{t.o}", 1), base=off - k.window_keys + 1 - k.main_row0)
            stop: Lin = lin(("bk", k.kv_rows), base=k.keys)
        else:
            start, stop = plus(t.kt, self.bn, ("kvrow", 1), base=off), self.kvstop[0]
        return Ref(array, (start, col), size, (stop, dim))

    def read_hit(self, t: KeyTile) -> float:
        """L2 share of a key tile read straight from GM (a window's or a contiguous key set's rows)."""
        return self.hit_gather if self.k.per_token else self.hit_kv

    @stage
    def load_k(self, c: Code, slot: int, t: KeyTile, kc: int, h: int) -> None:
        """Half h of K chunk kc into L1: from the gathered rows' workspace (after both AIVs filled it) or GM."""
        p, dt = self.p, self.dt
        if t.gathered:
            src = Ref(f"ws.kv{t.ws}", (kc * KC, h * p.dw), (KC, p.dw))
        else:
            src = self.rows(t, self.k.kv_arrays[0], kc * KC, h * p.dw, (KC, p.dw), self.dq)
        c.alloc(self.q.k)
        if t.gathered and kc == 0 and h == 0:
            c.deque(self.q.kv)
        c.op("mte2", "load_k", Act("load", Ref(f"l1.k{h}", (0, 0), (KC, p.dw)), (src,), dt),
             bytes=nbytes(dt, KC, p.dw), dtype=dt, src="gm", dst="l1", hit=1.0 if t.gathered else self.read_hit(t))
        c.enque(self.q.k)

    @stage
    def split(self, c: Code, a: Ref, b: Ref, ashape: tuple[int, int], bshape: tuple[int, int], take_k: bool,
              give_k: bool, take_p: bool = False, give_p: bool = False) -> None:
        """MTE1: a block of the left operand (Q or P, from L1) into L0A and one of the right (K or V) into L0B."""
        dt, q = self.dt, self.q
        if take_p:
            c.deque(q.pl1)
        c.alloc(q.l0)
        c.op("mte1", "load_l0a", Act("copy", Ref("l0a", (0, 0), ashape), (a,), dt), bytes=nbytes(dt, *ashape),
             dtype=dt, src="l1", dst="l0a")
        if take_k:
            c.deque(q.k)
        c.op("mte1", "load_l0b", Act("copy", Ref("l0b", (0, 0), bshape), (b,), dt), bytes=nbytes(dt, *bshape),
             dtype=dt, src="l1", dst="l0b")
        c.enque(q.l0)
        if give_k:
            c.free(q.k)
        if give_p:
            c.free(q.pl1)

    @stage
    def mmad(self, c: Code, ashape: tuple[int, int], bshape: tuple[int, int], n: int, step: int, last: bool,
             params: tuple = ()) -> None:
        """Cube: the L0C accumulator (c x n) (+)= L0A @ L0B; the first step takes an accumulator, the last hands it
        to FIXPIPE."""
        q, acc = self.q, Ref("l0c", (0, 0), (self.c, n))
        c.deque(q.l0)
        if step == 0:
            c.alloc(q.l0c)
        c.op("cube", "mmad", Act("mmad", acc, ((acc,) if step else ()) + (Ref("l0a", (0, 0), ashape),
                                                                           Ref("l0b", (0, 0), bshape)), "fp32",
                                 params + (("accumulate", step > 0),)),
             flops=2.0 * self.c * n * ashape[1], dtype=self.dt, src="l0a", dst="l0c")
        c.free(q.l0)
        if last:
            c.enque(q.l0c)

    @stage
    def store(self, c: Code, name: str, dst: Ref, ws: Queue, first: bool, last: bool) -> None:
        """FIXPIPE: the accumulator to a GM workspace slot taken on the tile's first store, handed to the AIVs on
        its last."""
        c.deque(self.q.l0c)
        if first:
            c.alloc(ws)
        c.op("fixpipe", name, Act("fixpipe", dst, (Ref("l0c", (0, 0), dst.size),), "fp32"),
             bytes=4.0 * dst.size[0] * dst.size[1], dtype="fp32", src="l0c", dst="gm", hit=self.ws_hit)
        c.free(self.q.l0c)
        if last:
            c.enque(ws)

    @stage
    def c2(self, c: Code, slot: int, t: KeyTile) -> None:
        """O~ = P V for key tile t: per row chunk, P from the AIVs into L1, then per V column chunk the tile's V
        chunks through the ring (from the gathered rows' workspace, freed after the last, or GM) and L0."""
        p, c_, ndv, vk = self.p, self.c, self.dv // self.p.vc, min(VK, t.keys)
        nkh, sub = t.keys // vk, vk // KC
        for r in range(self.rq):
            for kh in range(nkh):
                self.load_p(c, slot, r, kh, nkh, vk)
            for d in range(ndv):
                for kh in range(nkh):
                    self.load_v(c, slot, t, d, kh, t.gathered and r == self.rq - 1 and d == ndv - 1 and kh == nkh - 1)
                    for s in range(sub):
                        step = kh * sub + s
                        last = step == nkh * sub - 1
                        self.split(c, Ref("l1.p", (0, step * KC), (c_, KC)), Ref("l1.v", (s * KC, 0), (KC, p.vc)),
                                   (c_, KC), (KC, p.vc), take_k=s == 0, give_k=s == sub - 1,
                                   take_p=d == 0 and step == 0, give_p=d == ndv - 1 and last)
                        self.mmad(c, (c_, KC), (KC, p.vc), p.vc, step, last)
                self.store(c, "store_o", Ref(f"ws.o{slot}", (r * c_, d * p.vc), (c_, p.vc)), self.q.o,
                           r == 0 and d == 0, r == self.rq - 1 and d == ndv - 1)

    @stage
    def load_p(self, c: Code, slot: int, r: int, kh: int, nkh: int, vk: int) -> None:
        """vk columns of row chunk r of P from the AIVs' workspace into L1."""
        dt, c_, q = self.dt, self.c, self.q
        if kh == 0:
            c.alloc(q.pl1)
        if r == 0 and kh == 0:
            c.deque(q.p)
        c.op("mte2", "load_p", Act("load", Ref("l1.p", (0, kh * vk), (c_, vk)),
                                   (Ref(f"ws.p{slot}", (r * c_, kh * vk), (c_, vk)),), dt),
             bytes=nbytes(dt, c_, vk), dtype=dt, src="gm", dst="l1", hit=1.0)
        if kh == nkh - 1:
            c.enque(q.pl1)
        if r == self.rq - 1 and kh == nkh - 1:
            c.free(q.p)

    @stage
    def load_v(self, c: Code, slot: int, t: KeyTile, d: int, kh: int, release: bool) -> None:
        """A V chunk (up to VK keys x vc columns) into the L1 ring; the gathered rows' workspace is freed after the
        last."""
        p, dt, vk = self.p, self.dt, min(VK, t.keys)
        if t.gathered:
            src = Ref(f"ws.kv{t.ws}", (kh * vk, d * p.vc), (vk, p.vc))
        else:
            src = self.rows(t, self.k.kv_arrays[1], kh * vk, d * p.vc, (vk, p.vc), self.dv)
        c.alloc(self.q.k)
        c.op("mte2", "load_v", Act("load", Ref("l1.v", (0, 0), (vk, p.vc)), (src,), dt),
             bytes=nbytes(dt, vk, p.vc), dtype=dt, src="gm", dst="l1",
             hit=1.0 if t.gathered or self.k.v_in_k else self.read_hit(t))
        c.enque(self.q.k)
        if release:
            c.free(self.q.kv)

    # ---------------------------------------------------------------- AIV: gather, V1 softmax, V2 rescale
    def rows_of(self, a: int, j: int) -> int:
        return a * self.ra + j * self.p.vr

    @stage
    def gather(self, c: Code, slot: int, t: KeyTile) -> None:
        """This AIV's half of key tile t's selected rows, GATHER_ROWS per merge into UB (one DMA instruction per
        pair of rows, or two), into the gathered rows' workspace; the AIC is told after the last."""
        dt, dq, a, q = self.dt, self.dq, c.aiv, self.q
        half = t.keys // 2
        n = half // GATHER_ROWS
        ub = Ref("ub.g", (0, 0), (GATHER_ROWS, dq))
        for j in range(n):
            col = plus(t.kt, self.bn, base=self.k.window_keys + a * half + j * GATHER_ROWS)
            c.alloc(q.ub)
            if j == 0:
                c.alloc(q.kv)
            c.op("mte2", "gather", Act("gather", ub, (Ref("indices", (lin((f"irow{t.o}", 1)), col), (1, GATHER_ROWS),
                                                          self.istop), Ref("kv", (0, 0), (-1, -1))), dt,
                                       (("fill", -1), ("base", lin(("bk", self.k.kv_rows))))),
                 bytes=nbytes(dt, GATHER_ROWS, dq) + 4.0 * GATHER_ROWS, dtype=dt, src="gm", dst="ub",
                 hit=self.hit_gather, issues=GATHER_ROWS // 2 * self.k.pair_copies)
            c.enque(q.ub)
            c.deque(q.ub)
            c.op("mte3", "store_kv", Act("store", Ref(f"ws.kv{t.ws}", (a * half + j * GATHER_ROWS, 0),
                                                      (GATHER_ROWS, dq)), (ub,), dt),
                 bytes=nbytes(dt, GATHER_ROWS, dq), dtype=dt, src="ub", dst="gm", hit=self.ws_hit)
            c.free(q.ub)
            if j == n - 1:
                c.enque(q.kv)

    def mask_args(self, a: int, j: int, o: int) -> tuple:
        return (("scale", self.scale), ("qpos", lin((f"qpos{o}", 1))), ("row", self.rows_of(a, j)),
                ("hb", self.p.hb), ("causal", self.k.mask_causal))

    def positions(self, c: Code, t: KeyTile, pos: Ref) -> None:
        """The positions of tile t's keys for the mask (-1: no key): the selected indices, or an iota over a
        window or a contiguous range (past its valid rows -1)."""
        bn, k = self.bn, self.k
        if t.gathered:
            c.op("mte2", "load_idx", Act("load", pos, (Ref("indices", (lin((f"irow{t.o}", 1)),
                                                                       plus(t.kt, bn, base=k.window_keys)),
                                                           (1, t.keys), self.istop),), "int32", (("fill", -1),)),
                 bytes=4.0 * t.keys, dtype="int32", src="gm", dst="ub")
            return
        if t.window:
            first, limit = lin((f"qpos{t.o}", 1), base=1 - k.window_keys), k.keys
        else:
            first, limit = plus(t.kt, bn, base=k.main_row0), k.main_limit(lin((f"qpos{t.o}", 1)))
        c.op("vector", "iota", Act("iota", pos, (), "int32", (("kpos", first), ("keys", limit))),
             bytes=4.0 * t.keys, dtype="int32", src="ub", dst="ub")

    @stage
    def softmax(self, c: Code, slot: int, t: KeyTile, first: bool) -> None:
        """V1 of key tile t: the keys' positions, then per chunk of rows S in, the running max and sum (started by
        the group's first tile), P = exp(S - m) out."""
        n, vr, a, q, o = t.keys, self.p.vr, c.aiv, self.q, t.o
        pos = Ref("ub.pos", (0, 0), (1, n))
        self.positions(c, t, pos)
        s_ub, p_ub = Ref("ub.s", (0, 0), (vr, n)), Ref("ub.p", (0, 0), (vr, n))
        for j in range(self.nch):
            st = Ref(f"ub.st{slot}", (j * vr, 0), (vr, 3))
            prev = () if first else (Ref(f"ub.st{1 - slot}", (j * vr, 0), (vr, 3)),)
            c.alloc(q.sb)
            if j == 0:
                c.deque(q.s)
            c.op("mte2", "load_s", Act("load", s_ub, (Ref(f"ws.s{slot}", (self.rows_of(a, j), 0), (vr, n)),),
                                       "fp32"), bytes=4.0 * vr * n, dtype="fp32", src="gm", dst="ub", hit=1.0)
            c.enque(q.sb)
            if j == self.nch - 1:
                c.free(q.s)
            c.deque(q.sb)
            c.op("vector", "softmax_state", Act("softmax_state", st, (pos, s_ub) + prev, "fp32",
                                                self.mask_args(a, j, o)),
                 flops=4.0 * vr * n, bytes=4.0 * vr * n, dtype="fp32", src="ub", dst="ub")
            c.alloc(q.pb)
            c.op("vector", "softmax_exp", Act("softmax_exp", p_ub, (pos, s_ub, st), self.dt, self.mask_args(a, j, o)),
                 flops=2.0 * vr * n, bytes=4.0 * vr * n, dtype="fp32", src="ub", dst="ub")
            c.free(q.sb)
            c.enque(q.pb)
            self.store_p(c, slot, j, p_ub)

    @stage
    def store_p(self, c: Code, slot: int, j: int, p_ub: Ref) -> None:
        """A chunk of P to the workspace the AIC reads; the AIC is told after the last."""
        vr, q, n = self.p.vr, self.q, p_ub.size[1]
        c.deque(q.pb)
        if j == 0:
            c.alloc(q.p)
        c.op("mte3", "store_p", Act("store", Ref(f"ws.p{slot}", (self.rows_of(c.aiv, j), 0), (vr, n)), (p_ub,),
                                    self.dt), bytes=nbytes(self.dt, vr, n), dtype=self.dt, src="ub", dst="gm",
             hit=self.ws_hit)
        c.free(q.pb)
        if j == self.nch - 1:
            c.enque(q.p)

    def acc_ws(self, a: int, j: int) -> Ref:
        return Ref("ws.acc", (self.rows_of(a, j), 0), (self.p.vr, self.dv))

    @stage
    def accumulate(self, c: Code, slot: int, first: bool) -> None:
        """V2: acc = acc * alpha + O~ per chunk of rows (the rescale is its own instruction, so a tiling that drops
        it fails numerically); a group's first tile just keeps O~."""
        vr, dv, a, q = self.p.vr, self.dv, c.aiv, self.q
        acc_ub, o_ub = Ref("ub.acc", (0, 0), (vr, dv)), Ref("ub.o", (0, 0), (vr, dv))
        for j in range(self.nch):
            st = Ref(f"ub.st{slot}", (j * vr, 0), (vr, 3))
            o_ws = Ref(f"ws.o{slot}", (self.rows_of(a, j), 0), (vr, dv))
            c.alloc(q.acc)
            if j == 0:
                c.deque(q.o)
            if first:
                c.op("mte2", "load_o", Act("load", acc_ub, (o_ws,), "fp32"), bytes=4.0 * vr * dv, dtype="fp32",
                     src="gm", dst="ub", hit=1.0)
                c.enque(q.acc, to="mte3")
            else:
                c.op("mte2", "load_acc", Act("load", acc_ub, (self.acc_ws(a, j),), "fp32"), bytes=4.0 * vr * dv,
                     dtype="fp32", src="gm", dst="ub", hit=1.0)
                c.op("mte2", "load_o", Act("load", o_ub, (o_ws,), "fp32"), bytes=4.0 * vr * dv, dtype="fp32",
                     src="gm", dst="ub", hit=1.0)
                c.enque(q.acc, to="vector")
            if j == self.nch - 1:
                c.free(q.o)
            if not first:
                c.deque(q.acc, at="vector")
                c.op("vector", "rescale", Act("rescale", acc_ub, (acc_ub, st), "fp32"), flops=1.0 * vr * dv,
                     bytes=4.0 * vr * dv, dtype="fp32", src="ub", dst="ub")
                c.op("vector", "accumulate", Act("add", acc_ub, (acc_ub, o_ub), "fp32"), flops=1.0 * vr * dv,
                     bytes=4.0 * vr * dv, dtype="fp32", src="ub", dst="ub")
                c.enque(q.acc)
            c.deque(q.acc)
            c.op("mte3", "store_acc", Act("store", self.acc_ws(a, j), (acc_ub,), "fp32"), bytes=4.0 * vr * dv,
                 dtype="fp32", src="ub", dst="gm", hit=self.ws_hit)
            c.free(q.acc)

    @stage
    def load_acc(self, c: Code, j: int) -> Ref:
        """A chunk of the running output back into UB, handed to the vector."""
        acc_ub = Ref("ub.acc", (0, 0), (self.p.vr, self.dv))
        c.alloc(self.q.acc)
        c.op("mte2", "load_acc", Act("load", acc_ub, (self.acc_ws(c.aiv, j),), "fp32"), bytes=4.0 * self.p.vr * self.dv,
             dtype="fp32", src="gm", dst="ub", hit=1.0)
        c.enque(self.q.acc, to="vector")
        c.deque(self.q.acc, at="vector")
        return acc_ub

    @stage
    def finalize(self, c: Code, slot: int) -> None:
        """out = acc / l (with the sink's e^(sink - m) in l) in bf16, per chunk of rows."""
        vr, dv, a, hb, q = self.p.vr, self.dv, c.aiv, self.p.hb, self.q
        out_ub = Ref("ub.out", (0, 0), (vr, dv))
        for j in range(self.nch):
            st = Ref(f"ub.st{slot}", (j * vr, 0), (vr, 3))
            sink = (Ref("sink", (0, lin(("hk", hb), base=self.rows_of(a, j))), (1, vr)),) if self.k.with_sink else ()
            out = Ref("out", (lin(("grow0", 1), base=self.rows_of(a, j)), 0), (vr, dv), self.ostop)
            acc_ub = self.load_acc(c, j)
            c.op("vector", "finalize", Act("finalize", out_ub, (acc_ub, st) + sink, "bf16"), flops=2.0 * vr * dv,
                 bytes=4.0 * vr * dv, dtype="fp32", src="ub", dst="ub")
            c.enque(q.acc)
            c.deque(q.acc)
            c.op("mte3", "store_out", Act("store", out, (out_ub,), "bf16"), bytes=nbytes("bf16", vr, dv),
                 dtype="bf16", src="ub", dst="gm")
            c.free(q.acc)

    # ---------------------------------------------------------------- split-KV: partials, SyncAll, combine
    @stage
    def partial(self, c: Code, slot: int) -> None:
        """This key range's normalised output and log-sum-exp (m + ln l) per row, to the GM partials."""
        vr, dv, a, q, stop = self.p.vr, self.dv, c.aiv, self.q, (self.ostop[0], None)
        o_ub, lse_ub = Ref("ub.out", (0, 0), (vr, dv)), Ref("ub.lse", (0, 0), (vr, 1))
        for j in range(self.nch):
            st = Ref(f"ub.st{slot}", (j * vr, 0), (vr, 3))
            row = lin(("grow0", 1), base=self.rows_of(a, j))
            acc_ub = self.load_acc(c, j)
            c.op("vector", "partial", Act("partial", o_ub, (acc_ub, st), "fp32"), flops=1.0 * vr * dv,
                 bytes=4.0 * vr * dv, dtype="fp32", src="ub", dst="ub")
            c.op("vector", "lse", Act("lse", lse_ub, (st,), "fp32"), flops=2.0 * vr, bytes=12.0 * vr, dtype="fp32",
                 src="ub", dst="ub")
            c.enque(q.acc)
            c.deque(q.acc)
            c.op("mte3", "store_partial", Act("store", Ref("gm.part_o", (row, lin(("si", dv))), (vr, dv), stop),
                                              (o_ub,), "fp32"),
                 bytes=4.0 * vr * dv, dtype="fp32", src="ub", dst="gm", hit=self.part_hit)
            c.op("mte3", "store_lse", Act("store", Ref("gm.part_lse", (row, lin(("si", 1))), (vr, 1), stop),
                                          (lse_ub,), "fp32"),
                 bytes=4.0 * vr, dtype="fp32", src="ub", dst="gm", hit=self.part_hit)
            c.free(q.acc)

    @stage
    def combine(self, c: Code) -> None:
        """cr rows: weights w_s = e^(lse_s - M) / (sum_s e^(lse_s - M) [+ e^(sink - M)]), out = sum_s w_s o_s."""
        cr, ranges, dv, hg, q = self.cr, self.ranges, self.dv, self.hg, self.q
        r0, stop = lin(("blk", 2 * cr), base=c.aiv * cr), (self.rtot, None)
        lse, wts, acc = Ref("ub.lse", (0, 0), (cr, ranges)), Ref("ub.w", (0, 0), (cr, ranges)), \
            Ref("ub.cacc", (0, 0), (cr, dv))
        sink = (Ref("sink", (0, lin(("blk", 2 * cr), base=c.aiv * cr, mod=hg)), (1, cr)),) if self.k.with_sink else ()
        c.alloc(q.cl)
        c.op("mte2", "load_lse", Act("load", lse, (Ref("gm.part_lse", (r0, 0), (cr, ranges), stop),), "fp32"),
             bytes=4.0 * cr * ranges, dtype="fp32", src="gm", dst="ub", hit=self.part_hit)
        c.enque(q.cl)
        c.deque(q.cl)
        c.alloc(q.co)
        c.op("vector", "merge_weights", Act("merge_weights", wts, (lse,) + sink, "fp32"), flops=4.0 * cr * ranges,
             bytes=8.0 * cr * ranges, dtype="fp32", src="ub", dst="ub")
        c.free(q.cl)
        c.op("vector", "zero", Act("zero", acc), bytes=4.0 * cr * dv, dtype="fp32", dst="ub")
        for r in range(ranges):
            o = Ref(f"ub.co{r % 2}", (0, 0), (cr, dv))
            c.alloc(q.cb)
            c.op("mte2", "load_partial", Act("load", o, (Ref("gm.part_o", (r0, r * dv), (cr, dv), stop),), "fp32"),
                 bytes=4.0 * cr * dv, dtype="fp32", src="gm", dst="ub", hit=self.part_hit)
            c.enque(q.cb)
            c.deque(q.cb)
            c.op("vector", "merge", Act("axpy", acc, (acc, wts, o), "fp32", (("col", r),)), flops=2.0 * cr * dv,
                 bytes=8.0 * cr * dv, dtype="fp32", src="ub", dst="ub")
            c.free(q.cb)
        c.enque(q.co)
        c.deque(q.co)
        c.op("mte3", "store_out", Act("store", Ref("out", (r0, 0), (cr, dv), (self.rtot, dv)), (acc,), "bf16"),
             bytes=nbytes("bf16", cr, dv), dtype="bf16", src="ub", dst="gm")
        c.free(q.co)

    def combine_band(self) -> Band | None:
        """After a SyncAll, the vector cores merge the key ranges' partials, cr rows per tile."""
        if self.ranges <= 1:
            return None
        barrier, bodies = [], []
        for a in range(AIVS):
            v = self.prog.code(AIV, a)
            v.sync_all()
            barrier.append(v.body())
            v = self.prog.code(AIV, a)
            self.combine(v)
            bodies.append(v.body())
        return Band(cdiv(self.rtot, 2 * self.cr), None, tuple(bodies), lead=tuple(barrier))

    # ---------------------------------------------------------------- a block's stream of (group, key tile)
    # The tiles of all groups of a block form one stream u = gi * n + k, and the preload runs along it across
    # group boundaries: the AIC issues C1 one tile ahead of C2 (the next group's Q is loaded into the Q/P slots
    # once this group's last C1 is done, models.md §3.5), the AIVs gather two tiles ahead and run V1 one tile
    # ahead of V2, so the cube does not drain at every token. Buffer slots alternate along the stream.
    def bind(self, c: Code, gi: Lin) -> None:
        """Rows, token, query position and index row of the group and of the two after it."""
        b: dict[str, Lin] = {"gi": gi}
        for o in range(3):
            b |= {f"gtok{o}": lin(("t0", 1), ("gi", 1), base=o),
                  f"grow{o}": lin(("row0", 1), ("gi", self.p.hb), base=o * self.p.hb),
                  f"qpos{o}": lin((f"gtok{o}", 1), base=self.k.keys - self.k.tokens),
                  f"irow{o}": lin(("bk", self.k.tokens), (f"gtok{o}", 1))}
        c.addr(**b)

    def tile(self, walk: tuple[int, ...], k: int, kt: Lin, o: int, gp: int) -> KeyTile:
        """Tile k of the walk (kt: its Lin among the walk's tiles) of the group `o` groups after group gp."""
        if k < self.wt:
            return KeyTile(Lin(0), walk[k], True, False, o)
        ws = ((gp + o) * (len(walk) - self.wt) + k - self.wt) % 2 if self.g else 0
        return KeyTile(Lin(kt.base - self.shift, kt.terms, kt.div, kt.mod), walk[k], False, self.g, o, ws)

    @staticmethod
    def cube(t: KeyTile) -> KeyTile:
        """The tile as the AIC reads it: only a window's rows depend on the group (its query position)."""
        return t if t.window else replace(t, o=0)

    def stretch(self, c: Code, count: int, j0: int, walk: tuple[int, ...], gp: int, make, var: str,
                uses: tuple[int, ...]) -> None:
        """Iterations j0 .. j0+count-1 of a group's stream, looped two at a time (so slots stay static) over each
        run of iterations whose tiles j + d (d in `uses`) are alike; make(j, tile) writes iteration j (its parity
        static), tile(d) giving the KeyTile j + d."""
        n, end = len(walk), j0 + count
        like = lambda j: tuple((walk[j + d], j + d < self.wt) for d in uses)  # noqa: E731
        j = j0
        while j < end:
            stop = j
            while stop < end and like(stop) == like(j):
                stop += 1
            if (stop - j) // 2:
                with c.loop((stop - j) // 2, var):
                    for e in (j, j + 1):
                        make(e, lambda d, e=e: self.tile(walk, e + d, lin((var, 2), K0, base=e + d), 0, gp))
            if (stop - j) % 2:
                make(stop - 1, lambda d: self.tile(walk, stop - 1 + d, at(stop - 1 + d, n), 0, gp))
            j = stop

    def aic_group(self, c: Code, walk: tuple[int, ...], gp: int, ahead: int) -> None:
        """C2 of the group's tiles with C1 one tile ahead, into the next group when there is one (ahead > 0)."""
        n = len(walk)
        sl = lambda j: (gp * n + j) % 2  # noqa: E731
        tile = lambda k, o=0: self.cube(self.tile(walk, k, at(k, n), o, gp))  # noqa: E731

        def pair(j: int, t) -> None:
            c.fragment(self.c1, sl(j + 1), self.cube(t(1)))
            c.fragment(self.c2, sl(j), self.cube(t(0)))

        self.stretch(c, n - 2, 0, walk, gp, pair, "kp", (0, 1))
        if n >= 2:
            c.fragment(self.c1, sl(n - 1), tile(n - 1))
        c.fragment(self.release_q)
        if n >= 2:
            c.fragment(self.c2, sl(n - 2), tile(n - 2))
        if ahead:
            c.fragment(self.load_q, 1)
            c.fragment(self.c1, sl(n), tile(0, 1))
        c.fragment(self.c2, sl(n - 1), tile(n - 1))

    def aiv_group(self, c: Code, walk: tuple[int, ...], gp: int, ahead: int) -> None:
        """V2 of the group's tiles, V1 one tile and the gathers two tiles ahead (into the next `ahead` groups)."""
        n = len(walk)
        sl = lambda j: (gp * n + j) % 2  # noqa: E731
        end = self.partial if self.p.splits > 1 else self.finalize

        def step(j: int) -> None:
            o, k = divmod(j + 2, n)
            if o <= ahead:
                self.gathered(c, sl(j + 2), self.tile(walk, k, at(k, n), o, gp))
            o, k = divmod(j + 1, n)
            if o <= ahead:
                c.fragment(self.softmax, sl(j + 1), self.tile(walk, k, at(k, n), o, gp), k == 0)
            c.fragment(self.accumulate, sl(j), j == 0)
            if j == n - 1:
                c.fragment(end, sl(j))

        def uniform(j: int, t) -> None:
            self.gathered(c, sl(j + 2), t(2))
            c.fragment(self.softmax, sl(j + 1), t(1), False)
            c.fragment(self.accumulate, sl(j), False)

        step(0)
        self.stretch(c, n - 3, 1, walk, gp, uniform, "kp", (1, 2))
        for j in range(max(1, n - 2), n):
            step(j)

    def gathered(self, c: Code, slot: int, t: KeyTile) -> None:
        """The gather of a key tile whose rows are gathered."""
        if t.gathered:
            c.fragment(self.gather, slot, t)

    def stream(self, c: Code, walk: tuple[int, ...], prologue, group) -> None:
        """The prologue, the groups in a loop (two per iteration when the walk is odd, so slots repeat), the last
        two peeled (nothing runs ahead past the block's last group)."""
        G, n = self.p.groups, len(walk)
        self.bind(c, Lin(0))
        prologue()
        unroll = 2 if n % 2 or (self.g and (n - self.wt) % 2) else 1  # slots (and gather slots) repeat
        looped = max(0, G - 2) // unroll * unroll
        if looped:
            with c.loop(looped // unroll, "gl"):
                for e in range(unroll):
                    self.bind(c, lin(("gl", unroll), base=e))
                    group(c, walk, e, 2)
        for gi in range(looped, G):
            self.bind(c, Lin(gi))
            group(c, walk, gi, min(2, G - 1 - gi))

    def aic_block(self, c: Code, walk: tuple[int, ...]) -> None:
        def prologue() -> None:
            c.fragment(self.load_q, 0)
            c.fragment(self.c1, 0, self.cube(self.tile(walk, 0, at(0, len(walk)), 0, 0)))

        self.stream(c, walk, prologue, self.aic_group)

    def aiv_block(self, c: Code, walk: tuple[int, ...]) -> None:
        n = len(walk)

        def prologue() -> None:
            self.gathered(c, 0, self.tile(walk, 0, at(0, n), 0, 0))
            o, k = divmod(1, n)
            if o < self.p.groups:
                self.gathered(c, 1, self.tile(walk, k, at(k, n), o, 0))
            c.fragment(self.softmax, 0, self.tile(walk, 0, at(0, n), 0, 0), True)

        self.stream(c, walk, prologue, self.aiv_group)

    # ---------------------------------------------------------------- bands of blocks with equal tile counts
    def runs(self) -> list[Run]:
        """Runs of token blocks walking the same number of key tiles, each cut into its key ranges (full ranges,
        then the shorter last one)."""
        k, p = self.k, self.p
        walks = k.walks(p)
        starts = [0] + [i for i in range(1, len(walks)) if walks[i] != walks[i - 1]]
        counts = np.diff(starts + [len(walks)]).tolist()
        out = []
        for tb0, ntb in zip(starts, counts):
            walk = walks[tb0]
            n = len(walk)
            tps = cdiv(n, p.splits)
            full = ((0, 1, tps), (1, n // tps - 1, tps)) if self.shift and p.splits > 1 else ((0, n // tps, tps),)
            for s0, ns, kt in full + ((n // tps, 1, n % tps),):  # the first range holds the window
                if not ns or not kt:
                    continue
                head = dict(sj=lin(("blk", 1), mod=ns), si=lin(("sj", 1), ("s0", 1)), k0=lin(("si", tps)),
                            bq=lin(("blk", 1), div=ns), hk=lin(("bq", 1), mod=p.hsplit),
                            tq=lin(("bq", 1), div=p.hsplit, mod=ntb), bk=lin(("bq", 1), div=p.hsplit * ntb),
                            t0=lin(("first", p.tpb), ("tq", p.tpb)),
                            row0=lin(("bk", k.tokens * self.hg), ("hk", k.tokens), ("t0", 1)) if k.head_major
                            else lin(("bk", k.tokens * self.hg), ("t0", self.hg), ("hk", p.hb)),
                            kvrow=lin(("bk", k.kv_rows), base=k.main_row0))
                out.append(Run(walk[s0 * tps:s0 * tps + kt], k.batch * k.kvh * p.hsplit * ntb * ns,
                               (("first", tb0), ("s0", s0), ("klast", kt - 1)), head, s0 == 0 and self.shift > 0))
        return out

    def bands(self) -> list[Band]:
        """A band per run, but the causal ramp (tokens with fewer keys than a full block's) dealt as units of two
        blocks of k and full - k keys, as the indexer deals its triangle, so every core gets the same ramp work;
        dealt band by band, the cores that drew each band's leftover blocks reach the full band out of phase, in as
        many folded groups as there are leftover patterns, and their transient settles only after tens of blocks."""
        runs = self.runs()
        full, ks = self.keyset(runs[-1]), [self.keyset(r) for r in runs]
        waves = sum(r.blocks for r in runs) > self.chip.aic.count  # in one wave a unit would put two on one core
        pairable = waves and self.p.splits == 1 and full == max(ks) and len(set(ks)) == len(ks)
        ramp = {self.keyset(r): r for r in runs[:-1]} if pairable else {}
        bands, paired = [], set()
        for k in sorted(ramp, reverse=True):
            light = ramp.get(full - k)
            if k in paired or light is None or light.blocks != ramp[k].blocks or (light is ramp[k] and
                                                                                  light.blocks % 2):
                continue
            bands.append(self.unit(ramp[k], light, light.blocks // 2 if light is ramp[k] else 0))
            paired |= {k, full - k}
        if not pairable:  # the longest run first, so the cores enter it together and run it in phase
            runs = sorted(runs, key=lambda r: -r.blocks * sum(r.walk))
        for r in runs:
            if self.keyset(r) not in paired:
                bands.append(Band(r.blocks, self.block(AIC, 0, ((r, None),)),
                                  tuple(self.block(AIV, a, ((r, None),)) for a in range(AIVS)), r.constants))
        return bands

    def keyset(self, run: Run) -> int:
        """Keys of a run's key set (past the window): what two paired ramp blocks add up to a full block's."""
        return sum(run.walk) - (run.walk[0] if run.window else 0)

    def unit(self, heavy: Run, light: Run, offset: int) -> Band:
        """Units of two causal-ramp blocks whose tiles add up to a full block's: the heavy one, then the light
        (block u + offset of its run)."""
        halves = ((heavy, 0), (light, offset))
        return Band(light.blocks - offset, self.block(AIC, 0, halves),
                    tuple(self.block(AIV, a, halves) for a in range(AIVS)))

    def block(self, core: str, a: int, blocks: tuple[tuple[Run, int | None], ...]) -> tuple[Node, ...]:
        """One core's body over `blocks` (a run and, inside a unit, the block's offset from the unit's index)."""
        c = self.prog.code(core, a)
        if blocks[0][1] is not None:
            c.addr(u=lin(("blk", 1)))
        for run, offset in blocks:
            if offset is not None:
                c.addr(**dict(run.constants), blk=lin(("u", 1), base=offset))
            c.addr(**run.head)
            self.wt = int(run.window)
            (self.aic_block if core == AIC else self.aiv_block)(c, run.walk)
        return c.body()


@register
@dataclass(frozen=True)
class SparseFlashAttention(Attention):
    """Absorbed-MLA attention of each token over its top-k selected latent rows (V3.2 DSA, models.md §1.4):
    q [batch*tokens*heads, d_qk], kv [batch*keys, d_qk] (V = first d_v columns), indices [batch*tokens, topk]
    (-1 = none) -> out [batch*tokens*heads, d_v]."""

    name: ClassVar[str] = "sparse_flash_attention"
    options: ClassVar[tuple[str, ...]] = ("dtype", "causal", "block_m", "block_n", "scale", "kv_splits", "buffering",
                                          "aiv_rows")
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
    block_m: int = 0  # 0: one token's heads (mBaseSize = gSize)
    block_n: int = 512
    scale: float = 0.0  # 0 = d_qk^-0.5
    kv_splits: int = 1  # key ranges per block: 1 = never (the AscendC SFA's tiling), 0 = split-KV when blocks < cores
    buffering: int = 0  # depth of the double-buffered queues (0 = 2, as written)
    aiv_rows: int = 0  # rows of an AIV's UB chunk (0 = the tiler's: as many as fit, up to 32)
    # the latent and the rope part of a row are separate caches: a pair of rows is two copies (AscendC SFA CopyInKv)
    pair_copies: ClassVar[int] = 2

    def block_rows(self, chip: Chip) -> int:
        """A block is one token's heads: the AscendC SFA's tiling sets its M base to gSize, the query heads sharing
        the KV head (ops-transformer attention/sparse_flash_attention/op_host/sparse_flash_attention_tiling.cpp,
        SFAMlaTiling::SplitBalanced), since each token gathers its own top-k rows; the blocks are dealt over all
        AICs. block_m overrides it."""
        return self.block_m or self.heads // self.kvh

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
    `tokens` positions of `keys`. Layout BSND orders a KV head's q rows (token, head) and a block holds whole tokens'
    heads; BNSD orders them (head, token) and a block is block_m tokens of one head, as npu_fusion_attention tiles a
    BNSD input (one (batch, head) S1 block at a time: the heads sharing a KV head read its keys apart)."""

    name: ClassVar[str] = "flash_attention"
    options: ClassVar[tuple[str, ...]] = ("dtype", "causal", "block_m", "block_n", "scale", "kv_splits", "buffering",
                                          "aiv_rows", "layout")
    gathered: ClassVar[bool] = False
    kv_arrays: ClassVar[tuple[str, str]] = ("k", "v")
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
    buffering: int = 0
    aiv_rows: int = 0
    layout: str = "BSND"

    @property
    def v_in_k(self) -> bool:
        """Absorbed MLA (one KV head, d_v < d_qk): V is the latent part of the K rows; the deployments pass the same
        cache as key and value (cann-recipes-infer models/deepseek_r1/models/modeling_deepseek.py:1302-1303 @
        fbc225d, npu_fused_infer_attention_score_v2(q_nope, k_nope, k_nope, ...))."""
        return self.kvh == 1 and self.d_v < self.d_qk

    def __post_init__(self) -> None:
        if self.layout not in ("BSND", "BNSD"):
            raise NpusimError(f"flash_attention layout={self.layout!r}: allowed are 'BSND' and 'BNSD'", field="layout")

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
    keys//ratio)] index into it (-1 = none); sink [1, heads].

    Laid out as the AscendC SparseAttnSharedkv (ops-transformer experimental/attention/sparse_attn_sharedkv): a
    token's window is one key tile of its raw rows, read contiguously by the cube (SWA); the compressed entries
    follow, read contiguously (HCA: every completed entry) or gathered by the AIVs (CSA: the top-k); every tile
    holds the keys it has (its actualSingleProcessSInnerSize), not a padded block_n. A row group is one token's 64
    heads (mBaseSize = gSize: the SAS never splits heads, its metadata splits only key ranges, s2BaseSize_ 512), and
    a block is a core's contiguous share of a sequence's tokens streamed through one pipeline, as the SAS metadata
    deals each core a range of (batch, token, key range) work and ProcessBalance preloads across it."""

    name: ClassVar[str] = "v4_attention"
    options: ClassVar[tuple[str, ...]] = ("dtype", "block_m", "block_n", "scale", "kv_splits", "buffering", "aiv_rows")
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
    block_m: int = 0  # 0: a core's share of the tokens, a token's 64 heads per row group (SAS mBaseSize = gSize)
    block_n: int = 512
    scale: float = 0.0
    kv_splits: int = 0
    buffering: int = 0
    aiv_rows: int = 0
    causal: ClassVar[int] = 0  # the index set is causal by construction
    sized: ClassVar[bool] = True
    split_heads: ClassVar[bool] = False  # the SAS metadata balances key ranges (s2BaseSize_ 512), never heads

    @property
    def gathered(self) -> bool:
        return bool(self.topk)

    @property
    def window_keys(self) -> int:
        return self.window

    @property
    def main_row0(self) -> int:
        return self.keys

    def main_limit(self, qpos: Lin) -> Lin | int:
        """The entries completed by the query at qpos: keys + (qpos + 1) // ratio."""
        return Lin(qpos.base + 1 + self.keys * self.ratio, qpos.terms, self.ratio) if self.ratio else self.keys

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
        return self.compressed(p)

    def visible(self, p: np.ndarray) -> np.ndarray:
        return np.minimum(self.window, p + 1) + self.compressed(p)
