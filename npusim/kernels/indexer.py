"""Lightning Indexer: I[t,s] = sum_j w[t,j] ReLU(q[t,j] . k[s]) and its exact top-k per token (models.md §1.3).

Huawei's tiling with the head reduction on the cube ("Mat-Duce", models.md §3.4; the 950's): a basic block of
`block_m` query rows (block_m / heads tokens x heads) by `block_n` keys. The AIC keeps Q resident in L1 and
triple-buffers K in half-tile slices; per L0 chunk (c_m rows = whole tokens, c_n keys) C1 = Q K^T goes to L0C,
FIXPIPE applies ReLU (and the INT8/FP8 dequant, DEQF16) on its way into L1 as fp16 S', and a second cube matmul
P = W~ S' over the heads (W~ block-diagonal: each token's head weights, with the per-token-head query scales folded
in) leaves only the head-summed [tokens x keys] scores. Those go through a small GM/L2 workspace to the two AIVs,
which apply the key scale (quantised variants) and the causal mask and merge them into a running exact top-k, whose
cost follows the sort/merge model (A2/A3) or radix select (950).

The bf16/fp16 kernel of dav-c220 (A2/A3; ops-transformer attention/lightning_indexer/op_kernel/arch22, models.md
§3.4's A3 flow) keeps only C1 on the cube: blocks of `s1_base` tokens (8) x heads rows by 512 keys, FIXPIPE's ReLU
writes each chunk's per-head scores as fp32 to the workspace (mm1ResGm, two slots per core), and the two AIVs, in
lockstep with their AIC (one cross-core flag for both), split the block's tokens: per token the scores come in
16-head groups (MTE2, ping-pong), are weighted and summed (Brcb, Mul, Add, DoReduce), masked, sorted (VBS32 +
VMS4 to a 512 run) and merged into the token's running top-k every block (MergeSort; a sequence of <= 4 query
tokens caches four sorted blocks per merge), a finished row only extracted. Measured on kernels.md K135 (raw
msprof, 910B3): vec0 holds 3 of 5 tokens per block (vector 47.2 us, 3.15 us per token-block; vec1 32.2 us for 2),
the AIC's FIXPIPE writes 0.66 MB per block (23.9 us at ~128 GB/s), the cube is 21 % busy.

The INT8 kernel of dav-c220 (QuantLightningIndexer, the deployment's npu_quant_lightning_indexer; ops-transformer
attention/quant_lightning_indexer/op_kernel, read at the mirror ckorikov/cann-ops-transformer 5b210dd:
quant_lightning_indexer_kernel.h, _service_cube.h, _service_vector.h, _vector.h; cann-recipes-infer's
lightning_indexer_quant custom op is the same kernel) keeps the Mat-Duce split: blocks of M_BASE_SIZE 256 rows
(ceil(256 / heads) tokens: one MTP3 sequence at 64 heads) by S2_BASE_SIZE 2048 keys. Per block the AIC (ComputeMm1)
walks 128-key chunks, each K slice loaded into L1 on its own (two buffers), and for both 128-row chunks C1 on the
INT8 cube (Q into L0A again each time), FIXPIPE's DEQF16 + ReLU into L1 as fp16 S', then, one chunk behind, the head
reduction on the cube one token at a time (16 x 64 W~ by 64 x 128 S', C1 and it sharing L0C's two buffers) and its
rows straight out to the workspace. Each AIV takes half the block's tokens one by one (ProcessVec1): the token's
2048 scores and the block's key scales in (one DMA per page of a paged cache), five barrier-separated passes (Cast
and Mul of the key scales, Duplicate, Adds of scores and indices: DEQ_PASSES), the block sorted (Sort32, three
MrgSort levels) and merged into the token's running 2048-list (MergeSort, no cache of sorted blocks), every step
behind a PipeBarrier (`sort_chain`). The W~ the AIC loads (W x query scale, Brcb to 16 rows) is made by vec0 once
per query block (ProcessVec0) and is an input here.

How the dav-c220 launch is cut: as the kernel's SplitCore does (`split_core`; lightning_indexer_kernel_arch22.h,
read at hicann/ops-transformer 0d8dd3e): every (sequence, query block, key tile) block in order, the causal count
per query block from the mask, core c a contiguous run of floor(total / cores) blocks, one more for the first
total mod cores. A run may start and end inside a query block's keys: its pieces of a split block store their
top-ks as partials, and after a SyncAll the block's first core merges them (ProcessLD; vec0 the first ceil(n / 2)
tokens). The workspace slot alternates over a core's whole run (loop % 2), so the AIC computes block i + 1 while
the AIVs take block i, across query blocks too. The tiling host gives the kernel every core (usedCoreNum = block
dim) and 8-token blocks for topk <= 2048 (S1_BASE_SIZE 8 in lightning_indexer_tiling.cpp; the older
cann-recipes-infer custom op, 98946b6, used ceil(512 / G) tokens). The quantised kernel deals its blocks by the
same SplitCore (GetTotalBaseBlockNum, SplitCore, isLD; quant_lightning_indexer_tiling.cpp: usedCoreNum = block dim)
and merges a split sequence's partial 2048-lists on its first core after the SyncAll (ProcessLD, MrgSort4 of up
to four lists): at decode one sequence of 128K keys is 64 blocks cut over all 24 cores of a 910C die, and the
first core's AIVs merge 24 lists per token. A run is written whole blocks first and its
split pieces as one unit of two parts after them (`Launch.core_run` says why), and cores with the same run's
shape fold into one group (base.place). Limit: an uneven causal triangle over many query blocks (the pairing
condition below) keeps npusim's paired units: there SplitCore gives each core a run of query blocks of its own
lengths (core 0 thousands of 1-tile blocks at 128K), whose loops never recur together, beyond what the engine's
steady-state jumps compress; the paired units give every core the same blocks within one pair (the serving
graphs' indexer is non-causal, so this is the kernel rows' K134 and the long causal tests).

How the 950's Mat-Duce launch (and that limit) is cut into units of equal work, each one loop of key-tile steps:
  * decode and short prefills (few query blocks): smaller blocks, and each block's keys split into ranges over the
    cores (as many as pay for their merge); each range yields a partial top-k in GM, and after an all-core barrier
    (SyncAll) one vector core per token merges the ranges;
  * causal prefill: query blocks qb and nq-1-qb share a unit (their key tiles sum to a constant), so the causal
    triangle is one loop of identical units, Q of both resident; each step selects its query block and key tile.

Written on the tile-program layer (npusim.kernels.program): the queues of `Queues` — on the AIC Q and W~ (L1),
K (L1, three half-tile buffers or two key-chunk slices), the row chunk's Q and W~ (L0A), K and S' chunks (L0B), S
and P (L0C), S' (L1); the score workspace's two GM slots from the AIC to its AIVs; on each AIV the scores (UB), the
running top-k and the partials being merged — between the stages of `Launch` (AIC: CopyInQ, CopyInK, LoadL0, C1,
ReLU, C2, CopyOutScores; AIV: CopyInScores, Select, TopkInit, CopyOutTopk; after the SyncAll: MergePart,
CopyOutMerged).
A plan's `buffering` is the depth of the double-buffered queues (the layout is chosen for double buffering, so a
deeper one that does not fit is refused); the running top-k's queue stays two deep at any buffering (a unit of
two parts holds both). Known limit kept from the hand-written trace: with it two deep, a unit's first selection may
start while the last unit's top-k is still being stored, but UB holds one top-k per part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import ClassVar

from npusim.errors import NpusimError
from npusim.kernels.base import (Allowed, Band, Kernel, Work, cdiv, capacity, nbytes, need_cube, read_seconds, register,
                                 scaled, tiler_buffers)
from npusim.kernels.program import AIC, AIV, AIVS, Code, Queue, TileProgram, stage
from npusim.kernels.tile import Act, Lin, Ref, lin
from npusim.kernels.trace import Trace
from npusim.spec.chip import Chip

QUANTISED = ("int8", "fp8")  # q and k with per-(token, head) and per-key scales (models.md §1.3, §3.4)
DEQ = 2.0 ** -10  # DEQF16: S' = fp16(S / 1024) for the quantised variants (models.md §3.4); 1024 folded into W~
SCORE_DT = "fp16"  # S' and W~ in L1, the dtype of the head-reduction matmul (models.md §3.4 DEQF16)
PREFILL_ROWS = 512  # query rows of Huawei's basic block (models.md §3.4)
BLOCK_N = 512  # keys per block of that block and of the dav-c220 bf16 kernel (arch22 s2BaseSize)
M_BASE = 256  # query rows per block of the dav-c220 QuantLightningIndexer (M_BASE_SIZE): ceil(256 / heads) tokens
S2_BASE = 2048  # its keys per block (S2_BASE_SIZE)
SHORTLIST = 2  # (block, key ranges) plans the tuner (npusim.engine.tune) times
LAG = 2  # key chunks by which the head reduction trails C1 (FIXPIPE and MTE1 bring S' into L0B meanwhile)
ELEMENT = {"bf16": "bf16", "fp16": "fp16", "int8": "int8", "fp8": "fp8e4m3"}  # functional format of q and k
WS_HIT = 1.0  # the C->V score workspace: two slots of tb x bn fp32 per core, written and read at once (L2)
S1_BASE = 8  # tokens per block of the dav-c220 kernel when topk <= 2048 (s1BaseSize; 8192 / topk x 2 above)
HEAD_GROUP = 16  # heads an AIV scales per UB load in the dav-c220 kernel (groupInner_)
# passes of the quantised dav-c220 kernel's AIV over a token's block before the sort, each behind a PipeBarrier
# (ProcessVec1: Cast and Mul of the key scales, Duplicate of the sort buffer, Adds of the scores and of the indices)
DEQ_PASSES = 5
# a unit's part-1 offsets (sequence, first key tile, partial index) where it has no second part from elsewhere
UNIT_DEFAULTS = {"db": Lin(0), "k1": Lin(0), "si1": Lin(0)}

def topk_cycles(chip: Chip, k: int, presorted: bool = False) -> tuple[float, float]:
    """(cycles per candidate key, fixed cycles per row) of an exact top-k, models.md §3.4: A2/A3 VBS32 + VMS4
    (1.36 Sk + 3.32 k + ceil(max(log2 k - 5, 0)/2) Sk)/2; 950 radix select (Sk/256)*111 + 192. Candidates that come
    as sorted k-lists (a merge of partial top-ks) skip the VMS4 levels that build k-runs (estimate: the 1.36 term
    stays, the run-building term goes)."""
    if chip.family == "950":
        return 111 / 256, 192.0
    runs = 0 if presorted else math.ceil(max(math.log2(max(k, 1)) - 5, 0) / 2)
    return (1.36 + runs) / 2, 3.32 * k / 2


def block_topk_cycles(k: int, bn: int, cached: bool) -> float:
    """Cycles per token and key block of the dav-c220 kernel's running top-k (ProcessVec of
    lightning_indexer_service_vector_arch22.h): the block's bn scores sorted into one run (VBS32, then the VMS4
    levels up to bn), then merged into the token's running k-list (MergeSort: one exhaust-mode merge, the 3.32 k / 2
    of models.md §3.4) every block. `cached` (an AIV holds at most 2 tokens of the block and k <= 2048, the decode
    path): the sorted blocks are kept four at a time, merged into one list (one more VMS4 level) and that into the
    running list once per four blocks."""
    runs = math.ceil(max(math.log2(bn) - 5, 0) / 2)
    sort, merge = (1.36 + runs) * bn / 2, 3.32 * k / 2
    return sort + bn / 2 + merge / 4 if cached else sort + merge


def sort_chain(bn: int) -> int:
    """Vector instructions of the quantised dav-c220 kernel's sort and merge of one token's block, each behind a
    PipeBarrier (ProcessVec1): Sort32, the MrgSort levels to bn (SortAll, with a DataCopy back after an even number
    of them), the merge into the running list and its copy back (MergeSort)."""
    runs = math.ceil(max(math.log2(bn) - 5, 0) / 2)
    return 1 + runs + (runs % 2 == 0) + 2


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
    vec: bool = False  # the head reduction on the vector cores (the dav-c220 kernel, see `vector_heads`)
    dealt: bool = False  # blocks dealt by SplitCore and merged into running top-ks block by block (`dealt`)

    @property
    def kmajor(self) -> bool:
        """The dav-c220 QuantLightningIndexer's C1 order (ComputeMm1): per key chunk its K slice into L1, then both
        row chunks (Q into L0A again for each), each chunk's head-reduced scores out to the workspace at once."""
        return self.dealt and not self.vec

    @property
    def k_slices(self) -> int:
        """K loads per key tile: one per key chunk in that kernel (KeyNd2Nz), else two halves."""
        return self.bn // self.c_n if self.kmajor else 2

    @property
    def lag(self) -> int:
        """Chunks by which the head reduction trails C1: one in that kernel (ProcessWs after the next ProcessQk)."""
        return 1 if self.kmajor else LAG

    @property
    def pieces(self) -> int:
        """Head-reduction matmuls per chunk: one per token in that kernel (ComputeWs), else one block-diagonal."""
        return self.tpc if self.kmajor else 1

    def chunk(self, g: int) -> tuple[int, int]:
        """(row chunk, key chunk) of a step's chunk g: key-major in that kernel, else row-major."""
        return (g % self.nr, g // self.nr) if self.kmajor else divmod(g, self.bn // self.c_n)

    @property
    def parts(self) -> int:
        """Query blocks whose Q a unit holds in L1 as the kernel does: two for causal pairs; a SplitCore run's split
        pieces, written as one unit of two parts that loads both Qs first, are counted as the kernel holds them
        (one after the other)."""
        return 2 if self.paired else 1

    def tokens_of(self, a: int) -> tuple[int, int]:
        """(first token, tokens) of AIV a in a block."""
        first = 0 if a == 0 else self.split * self.tpc
        return first, (self.split if a == 0 else self.nr - self.split) * self.tpc


@dataclass(frozen=True)
class Piece:
    """`steps` key tiles of query block `row` (sequence-major: row = sequence x query blocks + block) from tile `k0`
    on one core: piece `part` of the `parts` the SplitCore runs cut the row into."""

    row: int
    k0: int
    steps: int
    part: int
    parts: int

    @property
    def whole(self) -> bool:
        return self.parts == 1


@dataclass(frozen=True)
class Queues:
    """One launch's queues (see the module docstring); `ws`: the score workspace's two GM slots, each its own
    queue because the code names the slot a step writes."""

    q: Queue  # Q and W~ of a unit in L1 (MTE2 -> MTE1; the cube gives them back at the unit's end)
    k: Queue  # K half tiles in L1 (MTE2 -> MTE1)
    qa: Queue  # the row chunk's Q in L0A (MTE1 -> cube)
    wa: Queue | None  # the row chunk's W~ in L0A (MTE1 -> cube)
    kb: Queue  # a K chunk in L0B (MTE1 -> cube)
    s: Queue  # S = Q K^T in L0C (cube -> FIXPIPE)
    s1: Queue | None  # S' = ReLU(S) in L1 (FIXPIPE -> MTE1); the cube head reduction only, as wa, sb, pc
    sb: Queue | None  # S' in L0B (MTE1 -> cube)
    pc: Queue | None  # P = W~ S' in L0C (cube -> FIXPIPE)
    ws: tuple[Queue, Queue]  # a step's scores in GM (AIC FIXPIPE -> AIV MTE2): head-summed, or per head (vec)
    ub: Queue  # the scores in UB (MTE2 -> vector)
    top: Queue  # the running top-k (vector -> MTE3)
    m: Queue  # a key range's partial top-k in UB (MTE2 -> vector)


@register
@dataclass(frozen=True)
class LightningIndexer(Kernel):
    """q [batch*tokens*heads, dim], k [batch*keys, dim], w [batch*tokens, heads] fp16 head weights W~ (the quantised
    variants with the query scales and 1024 folded in; laid out block-diagonally in L1), ks [1, batch*keys] key
    scales (int8 / fp8 only) -> scores, indices [batch*tokens, topk] (index within the sequence, -1 where fewer keys
    are visible)."""

    name: ClassVar[str] = "lightning_indexer"
    options: ClassVar[tuple[str, ...]] = ("dtype", "causal", "block_m", "block_n", "splits", "buffering", "page")
    limits: ClassVar[dict[str, Allowed]] = {"causal": Allowed(choices=(0, 1))}
    tokens: int
    keys: int
    heads: int = 64
    dim: int = 128
    topk: int = 2048
    batch: int = 1
    causal: int = 1
    dtype: str = "bf16"  # q/k: bf16, or int8 / fp8 with scales (the cube dtype of C1)
    block_m: int = 0  # query rows per block (0 = the kernel's, `base_rows`; fewer for decode on the 950)
    block_n: int = 0  # keys per block (0 = the kernel's: S2_BASE for the quantised dav-c220 kernel, else BLOCK_N)
    splits: int = 0  # key ranges per query block (0 = the tiler's choice)
    buffering: int = 0  # depth of the double-buffered queues (0 = 2, as written)
    page: int = 0  # keys per block of a paged cache (PA_BSND's block size): one DMA per page; 0 = contiguous keys

    @property
    def quantised(self) -> bool:
        return self.dtype in QUANTISED

    def dealt(self, chip: Chip) -> bool:
        """The ops-transformer kernels of dav-c220 (A2/A3): LightningIndexer arch22 (bf16/fp16) and
        QuantLightningIndexer (int8), which deal their blocks over the cores by SplitCore and merge each block's keys
        into the tokens' running top-k. The 950 keeps npusim's Mat-Duce units (models.md §3.4)."""
        return chip.family != "950"

    def vector_heads(self, chip: Chip) -> bool:
        """The head weighting and reduction on the AIVs: the dav-c220 (A2/A3) LightningIndexer for bf16/fp16 q and k
        (ops-transformer attention/lightning_indexer/op_kernel/arch22; models.md §3.4's A3 flow: C1 = QK^T + ReLU in
        FIXPIPE, V1 = weight-mul, head reduce, top-k). The quantised variants and the 950 keep the cube's Mat-Duce."""
        return not self.quantised and self.dealt(chip)

    def s1_base(self) -> int:
        """Tokens per block of the dav-c220 kernel (InitTilingData: 8, or 8192 / topk x 2 above 2048 selections)."""
        return S1_BASE if self.topk <= 2048 else max(1, 8192 // self.topk * 2)

    def base_rows(self, chip: Chip) -> int:
        """Query rows per block (0 block_m): the bf16 dav-c220 kernel's s1_base tokens; the quantised one's
        M_BASE_SIZE in whole tokens (InitTilingData: s1BaseSize = ceil(256 / G)); Huawei's 512 on the 950."""
        if not self.dealt(chip):
            return PREFILL_ROWS
        return (self.s1_base() if self.vector_heads(chip) else cdiv(M_BASE, self.heads)) * self.heads

    def keys_per_block(self, chip: Chip) -> int:
        """block_n, or the kernel's: S2_BASE_SIZE 2048 in the quantised dav-c220 kernel, BLOCK_N otherwise."""
        return self.block_n or (S2_BASE if self.quantised and self.dealt(chip) else BLOCK_N)

    def pairs(self) -> float:
        return self.batch * (self.tokens * self.keys - (self.tokens * (self.tokens - 1) / 2 if self.causal else 0))

    def work(self) -> Work:
        T, S, H, D, B = self.tokens, self.keys, self.heads, self.dim, self.batch
        io = B * (nbytes(self.dtype, T * H + S, D) + nbytes(SCORE_DT, T, H) + 8.0 * T * self.topk
                  + (4.0 * S if self.quantised else 0.0))
        return Work(2.0 * self.pairs() * H * (D + 1), io, vector_flops=2.0 * self.pairs(), cube_dtype=self.dtype)

    # ------------------------------------------------------------------------------------------------ the plan
    def plan(self, chip: Chip) -> Plan:
        """The dav-c220 kernels' blocks (`base_rows` by `keys_per_block`), dealt by SplitCore; on the 950 Huawei's
        512-row block (block_m / heads tokens), and with too few query blocks to fill the cores the block size and
        the key ranges per block that `estimate` finds fastest (explicit sizes win)."""
        H, bn = self.heads, self.keys_per_block(chip)
        rows = self.block_m or self.base_rows(chip)
        tpb = rows // H
        if tpb < 1 or rows % H or bn % 2 or bn < 32:
            raise NpusimError(f"lightning_indexer block_m={self.block_m} must hold whole tokens of {H} heads and "
                              f"block_n={bn} must be an even number of keys >= 32", field="tiling.block_m")
        if H > 128:
            raise NpusimError(f"lightning_indexer: {H} heads do not fit a 128-row L0 chunk", field="heads")
        if self.page < 0:
            raise NpusimError(f"lightning_indexer page={self.page}: a paged cache's block holds >= 1 key, or 0 for "
                              "contiguous keys", field="page")
        return self.layout(chip, *self.split_options(chip)[0])

    def split_options(self, chip: Chip) -> list[tuple[int, int]]:
        """(tokens per block, key ranges) best first by `estimate`: the SHORTLIST best, for the tuner
        (npusim.engine.tune) to time."""
        H, T = self.heads, self.tokens
        tb = min((self.block_m or self.base_rows(chip)) // H, T)
        if self.dealt(chip):  # SplitCore decides where each block runs: no key ranges to choose
            return [(tb, 1)]
        if self.block_m and self.splits:
            return [(tb, self.splits)]
        few = self.batch * cdiv(T, tb) < chip.aic.count  # decode: smaller blocks and key ranges fill the cores
        sizes = sorted({cdiv(tb, 2 ** i) for i in range(tb.bit_length())}) if few and not self.block_m else [tb]
        options = [(b, s) for b in sizes
                   for s in ([self.splits] if self.splits else range(1, self.max_splits(chip, b) + 1))]
        scored = sorted(((self.estimate(chip, *o), i, o) for i, o in enumerate(options)))
        return [o for _, _, o in scored[:SHORTLIST]]

    def candidates(self, chip: Chip) -> tuple[Kernel, ...]:
        if self.block_m and self.splits or self.dealt(chip):
            return (self,)
        return tuple(replace(self, block_m=b * self.heads, splits=s) for b, s in self.split_options(chip))

    def max_splits(self, chip: Chip, tb: int) -> int:
        units = self.batch * cdiv(self.tokens, tb)
        bn = self.keys_per_block(chip)
        return 1 if units >= chip.aic.count else max(1, min(cdiv(self.keys, bn), 4 * chip.aic.count // units))

    def layout(self, chip: Chip, tb: int, splits: int) -> Plan:
        """The L0 chunks: whole tokens of at most 128 rows (the quantised dav-c220 kernel's S1G_BASIC_BLOCK_L0) by
        the widest key chunk that fits (its S2_BASIC_BLOCK_L0 128)."""
        H, T, S, bn = self.heads, self.tokens, self.keys, self.keys_per_block(chip)
        tpc = max(t for t in range(1, 128 // H + 1) if tb % t == 0 and (tb // t >= 2 or tb == 1))
        c_m, nr = tpc * H, tb // tpc
        nq, full = cdiv(T, tb), cdiv(S, bn)
        # pairs balance the causal triangle; when every query block sees the same key tiles (keys far beyond the
        # queries) there is nothing to balance and single blocks spread over the cores in finer units
        paired = (bool(self.causal) and self.batch * (nq // 2) >= chip.aic.count
                  and self.tiles(0, tb, full, bn) != self.tiles(nq - 1, tb, full, bn))
        tps = cdiv(full, 1 if paired else splits)
        if not paired and self.causal and len({cdiv(self.tiles(q, tb, full, bn), tps) for q in range(nq)}) > 1:
            tps = full  # causal query blocks with different range counts are not split (their merges would differ)
        b = tiler_buffers(chip)  # the largest chunk that fits as much L0 / L1 as a tiler fills
        cap = capacity(chip) | {"l0a": b.l0a, "l0b": b.l0b, "l1": b.l1}
        plans = [Plan(tb, tb * H, tpc, c_m, c_n, nr, cdiv(nr, 2), bn, nq, full, cdiv(full, tps), tps, paired,
                      self.vector_heads(chip), self.dealt(chip))
                 for c_n in (128, 64, 32, 16) if (bn // 2) % c_n == 0]
        return next((p for p in plans if all(v <= cap[lv] for lv, v in self.buffers(chip, p).items())), plans[-1])

    def buffers(self, chip: Chip, p: Plan) -> dict[str, float]:
        """Bytes per core of each level with the queues as written (double-buffered), for choosing the layout."""
        prog = TileProgram(self.name, chip)
        return self.used(prog, self.queues(prog, p), p)

    def queues(self, prog: TileProgram, p: Plan) -> Queues:
        """L1: Q and the block-diagonal W~ of each part of a unit, K in three half-tile buffers, two S' chunks; L0A:
        the row chunk's Q and two W~ chunks; L0B: two K and two S' chunks; L0C: two S chunks and two P
        accumulators. The quantised dav-c220 kernel (InitBuffers of its cube service) double-buffers Q and W~, holds
        K as two 128-key slices, brings S' into L0B a token (64 x 128) at a time and shares L0C's two buffers
        between C1 and the head reduction (l0cBufIdx_); those two and S' in L1 stay two deep at any buffering, as
        C1 of one chunk runs before the head reduction of the one before. UB is counted by `ub` (its two phases
        reuse it)."""
        dt, D, bn, c_m, c_n = self.dtype, self.dim, p.bn, p.c_m, p.c_n
        q = prog.queue
        w_l1 = 0.0 if p.vec else nbytes(SCORE_DT, p.nr * 16, c_m)
        cube = (lambda *a, **k: None) if p.vec else q  # the cube head reduction's queues
        ring = 2 if p.kmajor else 1  # Q's L1 buffers, and Q's L0A buffers (reloaded per chunk in that kernel)
        return Queues(
            q("q", (AIC, "mte2"), (AIC, "mte1"), depth=ring,
              slot={"l1": p.parts * (nbytes(dt, p.rows, D) + w_l1)}),
            q("k", (AIC, "mte2"), (AIC, "mte1"), depth=2 if p.kmajor else 3,
              slot={"l1": nbytes(dt, bn // p.k_slices, D)}),
            q("qa", (AIC, "mte1"), (AIC, "cube"), depth=ring, slot={"l0a": nbytes(dt, c_m, D)}),
            cube("wa", (AIC, "mte1"), (AIC, "cube"), depth=2, slot={"l0a": nbytes(SCORE_DT, 16, c_m)}),
            q("kb", (AIC, "mte1"), (AIC, "cube"), depth=2, slot={"l0b": nbytes(dt, c_n, D)}),
            s := q("s", (AIC, "cube"), (AIC, "fixpipe"), depth=2, slot={"l0c": 4.0 * c_m * c_n}, fixed=p.kmajor),
            cube("s1", (AIC, "fixpipe"), (AIC, "mte1"), depth=2, slot={"l1": nbytes(SCORE_DT, c_m, c_n)},
                 fixed=p.kmajor),
            cube("sb", (AIC, "mte1"), (AIC, "cube"), depth=2, slot={"l0b": nbytes(SCORE_DT, c_m // p.pieces, c_n)}),
            s if p.kmajor else cube("pc", (AIC, "cube"), (AIC, "fixpipe"), depth=2, slot={"l0c": 4.0 * 16 * bn}),
            tuple(q(f"ws{i}", (AIC, "fixpipe"), (AIV, "mte2"), depth=1) for i in range(2)),
            q("ub", (AIV, "mte2"), (AIV, "vector"), depth=2),
            q("top", (AIV, "vector"), (AIV, "mte3"), depth=2, fixed=True),  # a unit of two parts holds both
            q("m", (AIV, "mte2"), (AIV, "vector"), depth=2))

    def used(self, prog: TileProgram, q: Queues, p: Plan) -> dict[str, float]:
        """The queues' buffers, and UB: in the scoring phase a step's scores (and key scales) per buffer of `ub`,
        the masked scores and the running top-k of each part; in the merge, a partial per buffer of `m` and the
        merged top-k. The quantised dav-c220 kernel loads a token's scores at a time (ProcessVec1)."""
        na, bn, K = max(p.tokens_of(a)[1] for a in range(AIVS)), p.bn, self.topk
        scores = 4.0 * (1 if p.dealt else na) * bn + (4.0 * bn if self.quantised else 0.0)
        phase = self.vec_ub(na, q.ub.depth, bn) if p.vec else (
            q.ub.depth * scores + 4.0 * na * bn + 8.0 * p.parts * na * K)
        return prog.buffers() | {"ub": max(phase, (q.m.depth + 1) * 8.0 * K)}

    def vec_ub(self, na: int, depth: int, bn: int) -> float:
        """UB of the dav-c220 scoring phase (its InitBuffers): `depth` buffers of a head group's scores and weights,
        the group sums, the block's sorted scores and indices, and the running top-k of `na` tokens. The kernel
        walks one query block at a time, so one top-k is held; a SplitCore run's two split pieces, written as one
        unit of two parts, are counted as the kernel holds them (one after the other)."""
        g = min(HEAD_GROUP, self.heads)
        return depth * 4.0 * (g * bn + g) + 4.0 * g * bn + 8.0 * bn + 8.0 * na * self.topk

    @property
    def cached(self) -> bool:
        """The dav-c220 kernel's decode top-k path: a sequence has at most 4 query tokens (actS1Size) and at most
        2048 are selected (ProcessVec)."""
        return self.tokens <= 4 and self.topk <= 2048

    def tiles(self, qb: int, tb: int, full: int, bn: int) -> int:
        """Key tiles of bn keys query block qb needs (queries are the last `tokens` positions of `keys`)."""
        if not self.causal:
            return full
        return min(full, (self.keys - self.tokens + min((qb + 1) * tb, self.tokens) - 1) // bn + 1)

    def estimate(self, chip: Chip, tb: int, splits: int) -> float:
        """Seconds for blocks of `tb` tokens and `splits` key ranges (the 950's Mat-Duce kernel): the units' key-tile
        steps in waves over the cores, a step taking the slowest of its cube work (C1 and the 16-row head
        reduction), its top-k on the busier vector core and its K tile (per-core MTE2 rate, the wave's share of
        HBM and L2), then the merge of
        the ranges on one vector core. An estimate for ranking; the engine times the trace."""
        H, D, bn, cube = self.heads, self.dim, self.keys_per_block(chip), chip.aic.cube.flop_per_cycle
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
        n = min(units, cores)
        step_mem = max(read_seconds(chip, k_step, hit),
                       n * k_step * (1 - hit) / (chip.hbm.bandwidth * eff.hbm),
                       n * k_step * hit / (chip.l2.read_bandwidth * eff.l2))
        stream = cdiv(units, cores) * cdiv(full, splits) * max(step_cube, step_vec, step_mem)
        merge = (merge_key * splits * self.topk + fixed) / (clock * eff.vector) if splits > 1 else 0.0
        return stream + merge

    # ------------------------------------------------------------------------------------------------ SplitCore
    def split_core(self, p: Plan, cores: int) -> list[list[Piece]]:
        """The dav-c220 kernel's SplitCore (ops-transformer attention/lightning_indexer/op_kernel/arch22
        lightning_indexer_kernel_arch22.h, SplitCore and GetTotalBaseBlockNum): all (sequence, query block, key
        tile) blocks in that order, the causal count per query block from the mask; core c takes a contiguous run
        of floor(total / cores) blocks, one more for the first total mod cores (fewer cores when there are fewer
        blocks). A run may begin and end inside a query block's keys: the pieces of each core's run, in order."""
        tiles = [self.tiles(q, p.tb, p.full, p.bn) for q in range(p.nq)] * self.batch
        base, extra = divmod(sum(tiles), cores)
        runs: list[list[list[int]]] = []
        row, k, cut = 0, 0, [0] * len(tiles)
        for c in range(cores if base else extra):
            left, run = base + (c < extra), []
            while left:
                take = min(left, tiles[row] - k)
                run.append([row, k, take, cut[row]])
                cut[row] += 1
                left, k = left - take, k + take
                if k == tiles[row]:
                    row, k = row + 1, 0
            runs.append(run)
        return [[Piece(r, k0, n, part, cut[r]) for r, k0, n, part in run] for run in runs]

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
            t = self.tiles(q, tb, p.full, bn)
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
        prog = TileProgram(self.name, chip, self.buffering)
        q = self.queues(prog, p)
        # K is re-read by every query block of its sequence: from L2 after the first read when a sequence's keys fit
        # there, else only by the query blocks in flight together
        loads = sum(self.tiles(b, p.tb, p.full, p.bn) for b in range(p.nq))
        fits = nbytes(self.dtype, self.keys, self.dim) <= chip.l2.size / 2
        per_key, fixed = topk_cycles(chip, self.topk)
        if p.dealt:  # the merges are paid per key block (select); a finished row is only extracted (GatherMask)
            fixed = 8.0 * self.topk / chip.aiv.vector.repeat_bytes
        launch = Launch(self, p, q, 1 - p.full / loads if fits else 1 - 1 / min(p.nq, chip.aic.count),
                        chip.aiv.vector.flop_per_cycle["fp32"], per_key, fixed,
                        topk_cycles(chip, self.topk, presorted=True)[0])
        if p.dealt and not p.paired:
            split = self.split_core(p, chip.aic.count)
            runs = [launch.core_run(prog, pieces) for pieces in split]
            groups, nbands = prog.placed(runs), sum(map(len, runs))
            units = f"SplitCore: {sum(x.steps for r in split for x in r)} blocks over {len(split)} cores"
        else:
            bands = [launch.band(prog, blocks, C, bind) for blocks, C, bind in self.units(p)]
            if p.splits > 1:
                bands.append(launch.merge_band(prog))
            groups, nbands = prog.groups(bands, chip.aic.count), len(bands)
            units = "paired causal" if p.paired else f"{p.splits} key ranges"
        w = self.work()
        return Trace(self.name, chip.name, self.shape, groups, w.cube_flops, w.hbm_bytes,
                     self.used(prog, q, p),
                     {"block_m": p.rows, "block_n": p.bn, "tokens_per_block": p.tb, "l0_chunk": (p.c_m, p.c_n, self.dim),
                      "k_buffers": q.k.depth,
                      "head_reduction": "vector (dav-c220 kernel)" if p.vec else (
                          "cube per token (dav-c220 quantised kernel)" if p.dealt else "cube (Mat-Duce)"),
                      "units": units, "bands": nbands,
                      "topk": "radix select" if chip.family == "950" else "VBS32+VMS4 sort/merge"} | prog.tiling(),
                     dtype=self.dtype)


@dataclass(frozen=True)
class Launch:
    """One launch: the kernel, its plan and queues, the L2 hit rate of K, and the vector rates of the top-k (FLOPs
    per cycle; cycles per key and per row, per merged key); the stages take the core's Code first."""

    li: LightningIndexer
    p: Plan
    q: Queues
    hit_k: float
    vflops: float
    per_key: float
    fixed: float
    merge_key: float
    built: dict[tuple, Band] = field(default_factory=dict)  # whole_band's and split_band's bodies

    @property
    def nj(self) -> int:
        """Key chunks per step (K arrives in two halves of nj / 2)."""
        return self.p.bn // self.p.c_n

    @property
    def fe(self) -> str:
        return ELEMENT.get(self.li.dtype, self.li.dtype)

    @property
    def kstop(self) -> Lin:
        return lin(("b", self.li.keys), base=self.li.keys)

    # ------------------------------------------------------------------ bands
    def band(self, prog: TileProgram, blocks: int, C: int, bind: dict[str, Lin]) -> Band:
        """`blocks` units of C key-tile steps: the AIC's, and each AIV's when it owns tokens of the block (their
        top-ks final unless the plan splits the keys into ranges)."""
        paired = self.p.paired and "u" in bind
        final = self.p.splits == 1
        bind = UNIT_DEFAULTS | bind
        c = prog.code(AIC)
        c.addr(**bind)
        self.aic_unit(c, C, paired)
        aiv = []
        for a in range(AIVS):
            v = prog.code(AIV, a)
            if self.p.tokens_of(a)[1]:
                v.addr(**bind)
                self.aiv_unit(v, C, paired, final)
            aiv.append(v.body())
        return Band(blocks, c.body(), tuple(aiv))

    def merge_band(self, prog: TileProgram) -> Band:
        """After the SyncAll, one token row per AIV step: its key ranges' partial top-ks merged."""
        lead, bodies = [], []
        for a in range(AIVS):
            b, v = prog.code(AIV, a), prog.code(AIV, a)
            b.sync_all()
            lead.append(b.body())
            self.merge(v, lin(("blk", 2), base=a), Lin(self.li.batch * self.li.tokens), self.p.splits)
            bodies.append(v.body())
        return Band(cdiv(self.li.batch * self.li.tokens, 2), None, tuple(bodies), lead=tuple(lead))

    def core_run(self, prog: TileProgram, pieces: list[Piece]) -> list[Band]:
        """One core's SplitCore run: consecutive whole query blocks of equal length as one band (in pairs when their
        length is odd, so each unit starts on the same workspace slot: the slots alternate over the core's whole
        run, gloop % 2); then its split pieces (at most two: the run's head and tail) as one unit of one or two
        parts, each storing its top-k as a partial (`si`, `si1`); then, when the run ends in the first piece of a
        split block (isLD), that block's merge after the SyncAll (ProcessLD). Written in this order, not the
        kernel's (head, whole blocks, tail): nothing before the SyncAll reads another piece's output, so the order
        changes neither what the run computes nor its work, and every core's run has the same few loops, the
        pieces' lengths being bindings of one loop (the cores run in step, so the engine compresses them)."""
        bands, slot = [], 0
        whole, split = [x for x in pieces if x.whole], [x for x in pieces if not x.whole]
        i = 0
        while i < len(whole):
            x, n = whole[i], 1
            while i + n < len(whole) and whole[i + n].steps == x.steps:
                n += 1
            rows = 2 if x.steps % 2 and n > 1 else 1
            units, rest = divmod(n, rows)
            for r0, count, per in ((x.row, units, rows), (x.row + n - 1, rest, 1)):
                if count:
                    bands.append(self.whole_band(prog, x.steps, slot, per, count, r0))
                    slot = (slot + count * per * x.steps) % 2
            i += n
        if split:
            bands.append(self.split_band(prog, split, slot))
        last = pieces[-1]
        if last.part == 0 and not last.whole:
            bands.append(self.split_merge_band(prog, last.row, last.parts))
        return bands

    def whole_band(self, prog: TileProgram, steps: int, slot: int, rows: int, blocks: int, r0: int) -> Band:
        """`blocks` units of `rows` whole query blocks of `steps` tiles, blocks r0 + rows blk + i, the first on
        workspace slot `slot`; the bodies are built once per (length, slot, rows) and take r0 from the band's
        constants."""
        key = ("whole", steps, slot, rows)
        if key not in self.built:
            nq = self.p.nq
            c, vs = prog.code(AIC), [prog.code(AIV, a) for a in range(AIVS)]
            for i in range(rows):
                bind = UNIT_DEFAULTS | {"qr": lin(("r0", 1), ("blk", rows), base=i), "bi": lin(("qr", 1), div=nq),
                                        "qb0": lin(("qr", 1), mod=nq), "dq": Lin(0), "s0": Lin(steps), "k0": Lin(0),
                                        "si": Lin(0)}
                self.unit_code(c, vs, bind, steps, False, True, (slot + i * steps) % 2)
            self.built[key] = Band(1, c.body(), tuple(v.body() for v in vs))
        b = self.built[key]
        return Band(blocks, b.aic, b.aiv, (("r0", r0),))

    def split_band(self, prog: TileProgram, split: list[Piece], slot: int) -> Band:
        """The run's split pieces as one unit: part 0 the first (query block ra from tile ka, sa steps, partial
        pa), part 1 the second (block rb from tile kb, partial pb); the body is built once per total length and
        slot, the rest is the band's constants."""
        a, b = split[0], split[-1]
        paired, steps = len(split) == 2, sum(x.steps for x in split)
        key = ("split", steps, slot, paired)
        if key not in self.built:
            nq = self.p.nq
            c, vs = prog.code(AIC), [prog.code(AIV, a) for a in range(AIVS)]
            bind = {"bi": lin(("ra", 1), div=nq), "qb0": lin(("ra", 1), mod=nq), "bb": lin(("rb", 1), div=nq),
                    "qb1": lin(("rb", 1), mod=nq), "db": lin(("bb", 1), ("bi", -1)), "dq": lin(("qb1", 1), ("qb0", -1)),
                    "s0": lin(("sa", 1)), "k0": lin(("ka", 1)), "k1": lin(("kb", 1)), "si": lin(("pa", 1)),
                    "si1": lin(("pb", 1))}
            self.unit_code(c, vs, bind, steps, paired, False, slot)
            self.built[key] = Band(1, c.body(), tuple(v.body() for v in vs))
        body = self.built[key]
        return Band(1, body.aic, body.aiv, (("ra", a.row), ("rb", b.row), ("ka", a.k0), ("kb", b.k0),
                                            ("sa", a.steps), ("pa", a.part), ("pb", b.part)))

    def unit_code(self, c: Code, vs: list[Code], bind: dict[str, Lin], steps: int, paired: bool, final: bool,
                  slot: int) -> None:
        """One unit written on the AIC and on each AIV that owns tokens of its blocks."""
        c.addr(**bind)
        self.aic_unit(c, steps, paired, slot)
        for a, v in enumerate(vs):
            if self.p.tokens_of(a)[1]:
                v.addr(**bind)
                self.aiv_unit(v, steps, paired, final, slot)

    def split_merge_band(self, prog: TileProgram, row: int, parts: int) -> Band:
        """After the SyncAll, the AIVs of the block's first core merge its tokens' `parts` partial top-ks (vec0 the
        first ceil(n / 2) tokens, as ProcessLD splits them) and store the rows; query block `rl` is the band's
        constant."""
        li, p = self.li, self.p
        if ("merge", parts) not in self.built:
            lead, bodies = [], []
            for a in range(AIVS):
                b, v = prog.code(AIV, a), prog.code(AIV, a)
                f, n = p.tokens_of(a)
                if n:
                    b.sync_all()
                    token = lin(("bi", li.tokens), ("qb0", p.tb), ("t", 1), base=f)
                    v.addr(bi=lin(("rl", 1), div=p.nq), qb0=lin(("rl", 1), mod=p.nq))
                    with v.loop(n, "t"):
                        self.merge(v, token, lin(("bi", li.tokens), base=li.tokens), parts)
                lead.append(b.body())
                bodies.append(v.body())
            self.built["merge", parts] = Band(1, None, tuple(bodies), lead=tuple(lead))
        body = self.built["merge", parts]
        return Band(1, None, body.aiv, (("rl", row),), body.lead)

    def step_vars(self, c: Code, C: int, paired: bool, j: Lin) -> None:
        """sel: which part this step serves; kt: its key tile (part 0 from k0, part 1 from k1); qb and b: its query
        block and sequence."""
        sel = lin(("j", 1), ("s0", -1), base=C, div=C) if paired else Lin(0)
        c.addr(j=j, sel=sel, kt=lin(("k0", 1), ("j", 1), (("sel", "s0"), -1), (("sel", "k0"), -1), (("sel", "k1"), 1)),
               qb=lin(("qb0", 1), (("sel", "dq"), 1)), b=lin(("bi", 1), (("sel", "db"), 1)))

    # ------------------------------------------------------------------ AIC
    def aic_unit(self, c: Code, C: int, paired: bool, first: int = 0) -> None:
        """Q and W~ of the unit's parts in, C steps (the first on workspace slot `first`), Q given back."""
        self.copy_in_q(c, 2 if paired else 1)
        c.deque(self.q.q)
        c.op("mte1", "wait_q")
        c.pingpong(C, "jp", lambda slot, j: self.aic_step(c, C, paired, slot, j), first)
        c.op("cube", "release_q")
        c.free(self.q.q)

    def aic_step(self, c: Code, C: int, paired: bool, slot: int, j: Lin) -> None:
        """One key tile: K in, then the step's nr x nj chunks as one stream, the head reduction `lag` chunks behind
        C1 (across row chunks too), so FIXPIPE and MTE1 have S' in L0B before the cube wants it. The quantised
        dav-c220 kernel (ComputeMm1) walks the chunks key-major, each K slice loaded before its first chunk, Q into
        L0A for every chunk, and its FIXPIPE takes S' before the head reduction's result (ProcessQk, then
        ProcessWs of the chunk before)."""
        p = self.p
        self.step_vars(c, C, paired, j)
        if not p.kmajor:
            for h in range(p.k_slices):
                self.copy_in_k(c, h)
        n = p.nr * self.nj
        if p.vec:  # C1 chunks straight out to the workspace; both AIVs' buffers taken and handed over at once
            for g in range(n):
                if g % self.nj == 0:
                    self.load_l0(c, g)
                self.c1(c, g)
                self.relu_out(c, g, slot)
            return
        for g in range(n + p.lag):
            if g < n:
                r, k = p.chunk(g)
                if p.kmajor and r == 0:
                    self.copy_in_k(c, k)
                if p.kmajor or k == 0:
                    self.load_l0(c, g)
                self.c1(c, g)
                if p.kmajor:
                    self.relu(c, g)
            if g >= p.lag:
                self.c2(c, g - p.lag, slot)
            if g < n and not p.kmajor:
                self.relu(c, g)

    @stage
    def copy_in_q(self, c: Code, parts: int) -> None:
        """MTE2: each part's queries and its block-diagonal head weights into L1, resident for the unit."""
        li, p, fe = self.li, self.p, self.fe
        T, H, D, rows, dt = li.tokens, li.heads, li.dim, p.rows, li.dtype
        c.alloc(self.q.q)
        for part in range(parts):
            c.op("mte2", "load_q", Act("load", Ref("l1.q", (part * rows, 0), (rows, D)),
                                       (Ref("q", (lin(("bi", T * H), ("db", part * T * H), ("qb0", rows),
                                                      ("dq", part * rows)), 0),
                                            (rows, D), (lin(("bi", T * H), ("db", part * T * H), base=T * H), D)),),
                                       fe),
                 bytes=nbytes(dt, rows, D), dtype=dt, src="gm", dst="l1")
            if self.p.vec:
                continue
            c.op("mte2", "load_w", Act("headdiag", Ref("l1.w", (part * p.nr * 16, 0), (p.nr * 16, p.c_m)),
                                       (Ref("w", (lin(("bi", T), ("db", part * T), ("qb0", p.tb), ("dq", part * p.tb)),
                                                  0),
                                            (p.tb, H), (lin(("bi", T), ("db", part * T), base=T), H)),), SCORE_DT,
                                       (("tpc", p.tpc),)),
                 bytes=nbytes(SCORE_DT, p.tb, H), dtype=SCORE_DT, src="gm", dst="l1")
        c.enque(self.q.q)

    @stage
    def copy_in_k(self, c: Code, h: int) -> None:
        """MTE2: slice h of the step's key tile into L1 (two halves, or a key chunk each); from a paged cache, one
        DMA per page (its block-table entry read first), so a slice of many small pages is bound by their issue
        (aic mte2 issue_cycles)."""
        dt, S, D, bn = self.li.dtype, self.li.keys, self.li.dim, self.p.bn
        kh = bn // self.p.k_slices
        pages = cdiv(kh, self.li.page) if self.li.page else 1
        c.alloc(self.q.k)
        c.op("mte2", "load_k", Act("load", Ref(f"l1.k{h}", (0, 0), (kh, D)),
                                   (Ref("k", (lin(("b", S), ("kt", bn), base=h * kh), 0), (kh, D),
                                        (self.kstop, D)),), self.fe),
             bytes=nbytes(dt, kh, D), dtype=dt, src="gm", dst="l1", hit=self.hit_k, issues=pages)
        c.enque(self.q.k)

    def w_buf(self, g: int, i: int = 0) -> str:
        """The L0A buffer of chunk g's W~: one per row chunk, or per token of each chunk in the key-major order."""
        p = self.p
        return f"l0a.w{(g * p.pieces + i if p.kmajor else p.chunk(g)[0]) % 2}"

    @stage
    def load_l0(self, c: Code, g: int) -> None:
        """MTE1: the queries of chunk g's row chunk (kept in L0A for all its key chunks, or for this chunk alone in
        the key-major order) and its block-diagonal head weights (in the key-major order `load_w` brings them a
        token at a time just before the head reduction, LoadWeightToL0a in ProcessWs)."""
        dt, D, c_m, nr, q = self.li.dtype, self.li.dim, self.p.c_m, self.p.nr, self.q
        r = self.p.chunk(g)[0]
        c.alloc(q.qa)
        c.op("mte1", "load_q", Act("copy", Ref("l0a.q", (0, 0), (c_m, D)),
                                   (Ref("l1.q", (lin(("sel", self.p.rows), base=r * c_m), 0), (c_m, D)),), self.fe),
             bytes=nbytes(dt, c_m, D), dtype=dt, src="l1", dst="l0a")
        c.enque(q.qa)
        if self.p.vec or self.p.kmajor:
            return
        c.alloc(q.wa)
        c.op("mte1", "load_w", Act("copy", Ref(self.w_buf(g), (0, 0), (16, c_m)),
                                   (Ref("l1.w", (lin(("sel", nr * 16), base=r * 16), 0), (16, c_m)),), SCORE_DT),
             bytes=nbytes(SCORE_DT, 16, c_m), dtype=SCORE_DT, src="l1", dst="l0a")
        c.enque(q.wa)

    @stage
    def c1(self, c: Code, g: int) -> None:
        """Chunk g = (row chunk r, key chunk j): K slice into L0B, S = Q K^T into L0C. The K slice in L1 is taken by
        the first row chunk and given back by the last; Q in L0A serves the row chunk's key chunks in a row (one
        chunk in the key-major order)."""
        dt, D, c_m, c_n, q, nj = self.li.dtype, self.li.dim, self.p.c_m, self.p.c_n, self.q, self.nj
        r, j = self.p.chunk(g)
        jh = nj // self.p.k_slices
        k = Ref(f"l0b.k{g % 2}", (0, 0), (c_n, D))
        if r == 0 and j % jh == 0:
            c.deque(q.k)
        c.alloc(q.kb)
        c.op("mte1", "load_k", Act("copy", k, (Ref(f"l1.k{j // jh}", ((j % jh) * c_n, 0), (c_n, D)),), self.fe),
             bytes=nbytes(dt, c_n, D), dtype=dt, src="l1", dst="l0b")
        c.enque(q.kb)
        if r == self.p.nr - 1 and j % jh == jh - 1:
            c.free(q.k)
        if j == 0 or self.p.kmajor:
            c.deque(q.qa)
        c.deque(q.kb)
        c.alloc(q.s)
        c.op("cube", "mmad", Act("mmad", Ref(f"l0c.s{g % 2}", (0, 0), (c_m, c_n)), (Ref("l0a.q", (0, 0), (c_m, D)), k),
                                 "fp32", (("transpose_b", True), ("accumulate", False))),
             flops=2.0 * c_m * c_n * D, dtype=dt, src="l0a", dst="l0c")
        c.free(q.kb)
        c.enque(q.s)
        if j == nj - 1 or self.p.kmajor:
            c.free(q.qa)

    @stage
    def relu(self, c: Code, g: int) -> None:
        """FIXPIPE: ReLU (and DEQF16 for the quantised variants) on the way from L0C into L1 as fp16 S'."""
        c_m, c_n = self.p.c_m, self.p.c_n
        c.deque(self.q.s)
        c.alloc(self.q.s1)
        c.op("fixpipe", "relu_l1", Act("fixpipe", Ref(f"l1.s{g % 2}", (0, 0), (c_m, c_n)),
                                       (Ref(f"l0c.s{g % 2}", (0, 0), (c_m, c_n)),), SCORE_DT,
                                       (("relu", True), ("scale", DEQ if self.li.quantised else 1.0))),
             bytes=nbytes(SCORE_DT, c_m, c_n), dtype=SCORE_DT, src="l0c", dst="l1")
        c.free(self.q.s)
        c.enque(self.q.s1)

    @stage
    def relu_out(self, c: Code, g: int, slot: int) -> None:
        """FIXPIPE: chunk g's ReLU(S) as fp32 to workspace slot `slot`, rows (token, head) as C1 made them (the
        dav-c220 kernel's mm1ResGm); the first chunk takes the slot of each AIV that owns tokens, the last hands it
        over (the AIVs' CrossCoreSetFlag of the previous use must both have come: the two run in lockstep)."""
        p, (r, j) = self.p, divmod(g, self.nj)
        lanes = [a for a in range(AIVS) if p.tokens_of(a)[1]]
        c.deque(self.q.s)
        if g == 0:
            for a in lanes:
                c.alloc(self.q.ws[slot], lane=a)
        c.op("fixpipe", "scores_out", Act("fixpipe", Ref(f"ws.p{slot}", (r * p.c_m, j * p.c_n), (p.c_m, p.c_n)),
                                          (Ref(f"l0c.s{g % 2}", (0, 0), (p.c_m, p.c_n)),), "fp32", (("relu", True),)),
             bytes=4.0 * p.c_m * p.c_n, dtype="fp32", src="l0c", dst="gm", hit=WS_HIT)
        c.free(self.q.s)
        if g == p.nr * self.nj - 1:
            for a in lanes:
                c.enque(self.q.ws[slot], lane=a)

    @stage
    def c2(self, c: Code, g: int, slot: int) -> None:
        """The head reduction of chunk g: P[:, keys of j] = W~_r S' (16 x c_m times c_m x c_n), in `pieces` matmuls
        accumulated over the rows (one per token in the quantised dav-c220 kernel, ComputeWs); P leaves for the
        workspace after a row chunk's last key chunk, or after each chunk where the chunks run key-major."""
        p, q = self.p, self.q
        c_m, c_n, nj, n = p.c_m, p.c_n, self.nj, p.pieces
        r, j = p.chunk(g)
        rows, own = c_m // n, p.kmajor  # own: this chunk's P leaves on its own
        acc = Ref(f"l0c.p{g % 2}", (0, 0), (16, c_n)) if own else Ref(f"l0c.p{r % 2}", (0, j * c_n), (16, c_n))
        for i in range(n):
            sp = Ref(f"l0b.s{(g * n + i) % 2}", (0, 0), (rows, c_n))
            if i == 0:
                c.deque(q.s1)
            c.alloc(q.sb)
            c.op("mte1", "load_s", Act("copy", sp, (Ref(f"l1.s{g % 2}", (i * rows, 0), (rows, c_n)),), SCORE_DT),
                 bytes=nbytes(SCORE_DT, rows, c_n), dtype=SCORE_DT, src="l1", dst="l0b")
            if i == n - 1:
                c.free(q.s1)
            c.enque(q.sb)
            if own:
                self.load_w(c, g, i)
            c.deque(q.sb)
            if own or i == 0 and j == 0:
                c.deque(q.wa)
            if i == 0 and (j == 0 or own):
                c.alloc(q.pc)
            w = Ref(self.w_buf(g, i), (0, 0), (16, rows)) if own else Ref(self.w_buf(g), (0, 0), (16, c_m))
            c.op("cube", "mmad_heads", Act("mmad", acc, (acc,) * bool(i) + (w, sp), "fp32",
                                           (("accumulate", bool(i)),)),
                 flops=2.0 * 16 * rows * c_n, dtype=SCORE_DT, src="l0a", dst="l0c")
            c.free(q.sb)
            if own:
                c.free(q.wa)
        if j == nj - 1 or own:
            if not own:
                c.free(q.wa)
            c.enque(q.pc)
            self.copy_out_scores(c, g, slot)

    @stage
    def load_w(self, c: Code, g: int, i: int) -> None:
        """MTE1: token i of chunk g's row chunk: its 16 x heads slice of the block-diagonal W~ into L0A."""
        p = self.p
        r, rows = p.chunk(g)[0], p.c_m // p.pieces
        sel = lin(("sel", p.nr * 16), base=r * 16)
        c.alloc(self.q.wa)
        c.op("mte1", "load_w", Act("copy", Ref(self.w_buf(g, i), (0, 0), (16, rows)),
                                   (Ref("l1.w", (sel, i * rows), (16, rows)),), SCORE_DT),
             bytes=nbytes(SCORE_DT, 16, rows), dtype=SCORE_DT, src="l1", dst="l0a")
        c.enque(self.q.wa)

    @stage
    def copy_out_scores(self, c: Code, g: int, slot: int) -> None:
        """FIXPIPE: row chunk r's head-summed scores (all its keys, or chunk g's where each chunk's P leaves on its
        own) to workspace slot `slot`, for the AIV that owns its tokens (taken by its first chunk, handed over after
        its last)."""
        p = self.p
        r, j = p.chunk(g)
        a = 0 if r < p.split else 1
        first, last = (j == 0, j == self.nj - 1) if p.kmajor else (True, True)
        width, at, acc = (p.c_n, j * p.c_n, f"l0c.p{g % 2}") if p.kmajor else (p.bn, 0, f"l0c.p{r % 2}")
        c.deque(self.q.pc)
        if first and r in (0, p.split):
            c.alloc(self.q.ws[slot], lane=a)
        c.op("fixpipe", "scores_out", Act("fixpipe", Ref(f"ws.p{slot}", (r * p.tpc, at), (p.tpc, width)),
                                          (Ref(acc, (0, 0), (p.tpc, width)),), "fp32"),
             bytes=4.0 * p.tpc * width, dtype="fp32", src="l0c", dst="gm", hit=WS_HIT)
        c.free(self.q.pc)
        if last and r in (p.split - 1, p.nr - 1):
            c.enque(self.q.ws[slot], lane=a)

    # ------------------------------------------------------------------ AIV
    def aiv_unit(self, v: Code, C: int, paired: bool, final: bool, first: int = 0) -> None:
        """A running top-k per part over the unit's C steps (the first on workspace slot `first`), then each part's
        out: the rows' results when `final`, else to the partials (key range or SplitCore piece `si`) the merge
        reads."""
        parts = 2 if paired else 1
        for part in range(parts):
            self.topk_init(v, part)
        v.pingpong(C, "jp", lambda slot, j: self.aiv_step(v, C, paired, slot, j), first)
        for part in range(parts):
            self.copy_out_topk(v, part, final)

    def aiv_step(self, v: Code, C: int, paired: bool, slot: int, j: Lin) -> None:
        """A step's scores into the running top-ks: the bf16 dav-c220 kernel weights and reduces the heads first;
        the quantised one (ProcessVec1) takes its tokens one by one, the next token's scores loading while this
        one sorts."""
        self.step_vars(v, C, paired, j)
        if self.p.vec:
            self.head_sums(v, slot)
            v.free(self.q.ws[slot])
            return
        for t, nt in ([(t, 1) for t in range(self.p.tokens_of(v.aiv)[1])] if self.p.dealt else [(0, 0)]):
            self.copy_in_scores(v, slot, t, nt)
            self.select(v, slot, t, nt)

    @stage
    def head_sums(self, v: Code, slot: int) -> None:
        """The dav-c220 AIV (ProcessVec): token by token of its share, the per-head scores in groups of HEAD_GROUP
        heads (MTE2, with the token's weights), each group weighted and summed into the token's row (Brcb, Mul, Add),
        then the group's rows reduced (DoReduce) and the token's keys merged into its top-k (`select`), so the next
        token's first groups load while this one sorts. The workspace slot is given back after the step's top-k
        (the CrossCoreSetFlag follows ProcessVec)."""
        li, p = self.li, self.p
        f, n = p.tokens_of(v.aiv)
        H, T, bn = li.heads, li.tokens, p.bn
        g = min(HEAD_GROUP, H)
        v.deque(self.q.ws[slot])
        for t in range(n):
            row = lin(("b", T), ("qb", p.tb), base=f + t)
            for h in range(0, H, g):
                hg = min(g, H - h)
                v.alloc(self.q.ub)
                v.op("mte2", "load_scores", Act("load", Ref(f"ub.p{slot}", (0, 0), (hg, bn)),
                                                (Ref(f"ws.p{slot}", ((f + t) * H + h, 0), (hg, bn)),), "fp32"),
                     bytes=4.0 * hg * bn, dtype="fp32", src="gm", dst="ub", hit=WS_HIT)
                v.op("mte2", "load_weights", Act("load", Ref(f"ub.w{slot}", (0, 0), (1, hg)),
                                                 (Ref("w", (row, h), (1, hg), (lin(("b", T), base=T), H)),), "fp32"),
                     bytes=nbytes(SCORE_DT, 1, hg), dtype=SCORE_DT, src="gm", dst="ub")
                v.enque(self.q.ub)
                v.deque(self.q.ub)
                acc = (Ref("ub.r", (t, 0), (1, bn)),) if h else ()
                v.op("vector", "head_scale", Act("mmad", Ref("ub.r", (t, 0), (1, bn)),
                                                 acc + (Ref(f"ub.w{slot}", (0, 0), (1, hg)),
                                                        Ref(f"ub.p{slot}", (0, 0), (hg, bn))), "fp32",
                                                 (("accumulate", bool(h)),)),
                     flops=2.0 * hg * bn, bytes=4.0 * hg * bn, dtype="fp32", src="ub", dst="ub")
                v.free(self.q.ub)
            v.op("vector", "head_reduce", flops=(g - 1) * bn, bytes=4.0 * g * bn, dtype="fp32", src="ub", dst="ub")
            self.select(v, slot, t, 1)

    @stage
    def topk_init(self, v: Code, part: int) -> None:
        n, K = self.p.tokens_of(v.aiv)[1], self.li.topk
        v.alloc(self.q.top)
        v.op("vector", "topk_init", Act("topk_init", Ref("ub.top", (2 * n * part, 0), (2 * n, K))), bytes=8.0 * n * K,
             dtype="fp32", dst="ub")

    @stage
    def copy_in_scores(self, v: Code, slot: int, t: int = 0, nt: int = 0) -> None:
        """MTE2: this AIV's rows t .. t + nt (all by default) of the step's scores from the workspace, and the key
        tile's scales. The quantised dav-c220 kernel loads them for each token (GetKeyScale: one DMA per page of a
        paged cache) before handing the token over; the 950's trace hands the scores over first."""
        li, p = self.li, self.p
        f, n = p.tokens_of(v.aiv)
        nt, bn = nt or n, p.bn
        if t == 0:
            v.deque(self.q.ws[slot])
        v.alloc(self.q.ub)
        v.op("mte2", "load_scores", Act("load", Ref(f"ub.p{slot}", (0, 0), (nt, bn)),
                                        (Ref(f"ws.p{slot}", (f + t, 0), (nt, bn)),), "fp32"),
             bytes=4.0 * nt * bn, dtype="fp32", src="gm", dst="ub", hit=WS_HIT)
        if t + nt == n:
            v.free(self.q.ws[slot])
        if not p.dealt:
            v.enque(self.q.ub)
        if li.quantised:
            src = Ref("ks", (0, lin(("b", li.keys), ("kt", bn))), (1, bn), (None, self.kstop))
            v.op("mte2", "load_key_scales", Act("load", Ref(f"ub.ks{slot}", (0, 0), (1, bn)), (src,), "fp32"),
                 bytes=4.0 * bn, dtype="fp32", src="gm", dst="ub", hit=self.hit_k,
                 issues=cdiv(bn, li.page) if li.page else 1)
        if p.dealt:
            v.enque(self.q.ub)

    @stage
    def select(self, v: Code, slot: int, t: int = 0, nt: int = 0) -> None:
        """Vector: key scale and causal mask, then the step's keys merged into the running top-k of its part; for
        this AIV's tokens t .. t + nt (all of them by default). The merge acts on all of the AIV's rows once its
        last token is scored (the state holds values, then indices, row by row), so a token's merge before that is
        timed but carries no action. The quantised dav-c220 kernel's steps are barrier chains (DEQ_PASSES, then
        `sort_chain`)."""
        li, p = self.li, self.p
        f, n = p.tokens_of(v.aiv)
        nt = nt or n
        bn, K = p.bn, li.topk
        ks = (Ref(f"ub.ks{slot}", (0, 0), (1, bn)),) if li.quantised else ()
        kpos = lin(("kt", bn))
        ui = Ref("ub.i", (0, 0), (n, bn))
        top = Ref("ub.top", (lin(("sel", 2 * n)), 0), (2 * n, K))
        src = Ref("ub.r", (t, 0), (nt, bn)) if p.vec else Ref(f"ub.p{slot}", (0, 0), (nt, bn))
        passes = DEQ_PASSES if p.kmajor else 1
        if not p.vec:
            v.deque(self.q.ub)
        v.op("vector", "scores", Act("li_scores", Ref("ub.i", (t, 0), (nt, bn)), (src,) + ks, "fp32",
                                     (("qpos", lin(("qb", p.tb), base=li.keys - li.tokens + f + t)), ("kpos", kpos),
                                      ("keys", li.keys), ("causal", bool(li.causal)))),
             flops=2.0 * passes * nt * bn, bytes=4.0 * nt * bn, dtype="fp32", src="ub", dst="ub", issues=passes)
        if not p.vec:
            v.free(self.q.ub)
        cycles = block_topk_cycles(K, bn, li.cached and p.vec) if p.dealt else self.per_key * bn
        merge = Act("topk_merge", top, (top, ui), "fp32", (("kpos", kpos),)) if t + nt == n else None
        v.op("vector", "topk_merge", merge, flops=cycles * nt * self.vflops, bytes=4.0 * nt * bn, dtype="fp32",
             src="ub", dst="ub", issues=sort_chain(bn) if p.kmajor else 1)

    @stage
    def copy_out_topk(self, v: Code, part: int, final: bool) -> None:
        """The part's top-k finished and stored: to the scores and indices, or to partial `si`."""
        li, p = self.li, self.p
        f, n = p.tokens_of(v.aiv)
        T, K, R = li.tokens, li.topk, li.batch * li.tokens
        tops = (Ref("ub.top", (2 * n * part, 0), (n, K)), Ref("ub.top", (2 * n * part + n, 0), (n, K)))
        seq = (("bi", T), ("db", part * T))
        if not final:
            si = "si1" if part else "si"
            first = (("qb0", p.tb), ("dq", part * p.tb))
            outs = tuple(Ref("gm.li_part", (lin((si, 2 * R), *seq, *first, base=w * R + f), 0), (n, K),
                             (lin((si, 2 * R), *seq, base=w * R + T), K)) for w in range(2))
        else:
            row, stop = lin(*seq, ("qb0", p.tb), ("dq", part * p.tb), base=f), (lin(*seq, base=T), K)
            outs = (Ref("scores", (row, 0), (n, K), stop), Ref("indices", (row, 0), (n, K), stop))
        v.op("vector", "topk_final", flops=self.fixed * n * self.vflops, dtype="fp32", src="ub", dst="ub")
        v.enque(self.q.top)
        v.deque(self.q.top)
        for out, top in zip(outs, tops):
            v.op("mte3", "store", Act("store", out, (top,), "fp32"), bytes=4.0 * n * K, dtype="fp32", src="ub",
                 dst="gm", hit=0.0 if final else 1.0)
        v.free(self.q.top)

    # ------------------------------------------------------------------ merge of the key ranges (splits > 1)
    def merge(self, v: Code, row: Lin, end: Lin, parts: int) -> None:
        """Token row `row` (stored only below row `end`, its sequence's): its `parts` partial top-k lists merged
        into one (values and indices from the partials)."""
        K = self.li.topk
        v.addr(row=row, end=end)
        v.alloc(self.q.top)
        v.op("vector", "topk_init", Act("topk_init", Ref("ub.mt", (0, 0), (2, K))), bytes=8.0 * K, dtype="fp32",
             dst="ub")
        v.pingpong(parts, "ri", lambda slot, i: self.merge_part(v, slot, i))
        self.copy_out_merged(v)

    @stage
    def merge_part(self, v: Code, slot: int, i: Lin) -> None:
        """Partial i (values, then indices) into UB and merged into the row's top-k (each list's K candidates
        charged once, as one merge of all the lists would)."""
        K, R = self.li.topk, self.li.batch * self.li.tokens
        state = Ref("ub.mt", (0, 0), (2, K))
        v.alloc(self.q.m)
        for w in range(2):  # rows of the partials: (2 range + 0/1) R + token row
            at = scaled(i, 2 * R, w * R)
            v.op("mte2", "load_part", Act("load", Ref(f"ub.m{slot}", (w, 0), (1, K)),
                                          (Ref("gm.li_part", (Lin(at.base, at.terms + (("row", 1),)), 0), (1, K)),),
                                          "fp32"), bytes=4.0 * K, dtype="fp32", src="gm", dst="ub", hit=1.0)
        v.enque(self.q.m)
        v.deque(self.q.m)
        v.op("vector", "topk_union", Act("topk_union", state, (state, Ref(f"ub.m{slot}", (0, 0), (2, K))), "fp32"),
             flops=self.merge_key * K * self.vflops, bytes=8.0 * K, dtype="fp32", src="ub", dst="ub")
        v.free(self.q.m)

    @stage
    def copy_out_merged(self, v: Code) -> None:
        K, stop = self.li.topk, (lin(("end", 1)), self.li.topk)
        v.op("vector", "topk_final", flops=self.fixed * self.vflops, dtype="fp32", src="ub", dst="ub")
        v.enque(self.q.top)
        v.deque(self.q.top)
        for name, w in (("scores", 0), ("indices", 1)):
            v.op("mte3", "store", Act("store", Ref(name, (lin(("row", 1)), 0), (1, K), stop),
                                      (Ref("ub.mt", (w, 0), (1, K)),), "fp32"),
                 bytes=4.0 * K, dtype="fp32", src="ub", dst="gm")
        v.free(self.q.top)
