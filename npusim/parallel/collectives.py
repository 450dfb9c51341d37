"""Cost of one collective on a system's interconnect: latency + bytes / bandwidth, per algorithm and topology.

The group's ranks are `stride` apart, so a group spans `group * stride` consecutive ranks and runs on the innermost
tier whose domain holds them; when the group does not fit the innermost tier that its members' neighbours share,
the hierarchical algorithm runs the inner tier and the outer tier in turn. Every group collective pays its tier's
fixed `setup` (software start-up, calibrated) once, plus `latency` per algorithm step; a one-sided P2P transfer
(HIXL-style KV transfer, ring P2P) pays only the latency. Bandwidth between two ranks of a
full mesh is one link (tier bandwidth / links per rank); switched tiers (switch, Clos, fat tree) give each rank its
whole port bandwidth to any peer. All rates are scaled by the chip's calibrated `efficiency.link`.

HCCL inside a node (a system with an `hccl:` block; all-gather, reduce-scatter, all-reduce and a plain HCCL
AlltoAll of a group that one node holds — o_proj's head exchange, not the fused MoE dispatch / combine, which are MC2
kernels of their own and keep the tier model): each rank's shard reaches every peer, the peers on each tier at once — a 910C die reaches its package
partner over SIO while the other dies' shards come over UB — so the bytes take the slowest tier's share. A
collective whose per-rank data fits HCCL's AIV entry size runs as one vector-core kernel that writes to all peers
in one round (`aiv_setup` and one latency); a larger one is expanded by the AI CPU into a ring of DMA steps
(`aicpu_setup` and a latency per step): that switch is the 5x step in all-gather time near 512 KiB per rank on A3.
A reduce-scatter then streams the g shards it holds through HBM to sum them (read g, write one); an all-reduce is a
reduce-scatter and an all-gather; an all-to-all is the exchange alone (each peer gets its own shard). Rates are `hccl.efficiency` of the tiers' bandwidth.
A bulk all-to-all (the prefill's expert dispatch and combine: HCCL all_to_all_v of cann-recipes' double routing,
DeepEP normal mode) moves its rows at a further `efficiency.bulk_all_to_all` of that rate and pays
`overheads.all_to_all_peer` for every other rank of its group (a transfer and notify task per peer; fitted on K07);
the fused low-latency dispatch / combine (MC2: decode, and a prefill
whose tokens per die fit `moe.fused_dispatch_tokens`) does not.

The fused dispatch / combine moves rows, not a buffer: each AIV takes its share of the destination experts and walks
their (token, expert) rows one at a time, loading the token, quantising it (dispatch) and writing it into the peer's
window (CANN ops-transformer mc2/moe_distribute_dispatch_v2 op_kernel/moe_distribute_dispatch_v2_full_mesh.h,
SendToMoeExpert -> TokenToExpertInQuant per row, mirror yuanfang-chen/ops-transformer @ 00ff90a; the combine writes
each expert output row back the same way; the step counts rows on the chips whose kernel this is,
npusim.parallel.step ROW_WRITING_ARCHS). A row's write crosses the fabric before the AIV's buffer takes the next, so
with `rows` given the kernel takes at least the busiest AIV's rows, each its two DMAs and one tier latency, whatever
the bytes, and its bytes move at the AIV-direct rate of HCCL's AIV kernels (`hccl.efficiency`, fitted on K204) where
the system has one; without `rows` it is timed as the buffer exchange it was before. That is why the low-latency
dispatch (INT8, half the bytes) takes as long as the combine (BF16) in published.md K08 (132-153 vs 126-151 us at
128 tokens): rows, not bytes, bound both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from npusim.errors import NpusimError, did_you_mean
from npusim.spec.system import HCCL_KINDS, Hccl, System, Tier

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p", "broadcast")
ALGORITHMS = ("auto", "ring", "mesh", "hierarchical")


@dataclass(frozen=True)
class Collective:
    """One collective over `group` ranks.

    bytes: all_gather / broadcast: the full output per rank; reduce_scatter / all_reduce: the full input per rank;
    all_to_all: everything one rank sends (its share to itself included); p2p: the message. An all-to-all is the
    fused low-latency MoE dispatch / combine (MC2) unless `bulk` (a bulk kernel: the prefill's) or `hccl` (a plain
    HCCL AlltoAll call, e.g. o_proj's head exchange).
    """

    kind: str
    bytes: float
    group: int
    stride: int = 1
    algorithm: str = "auto"
    bulk: bool = False
    hccl: bool = False
    rows: int = 0  # fused MoE dispatch / combine: the (token, expert) rows one rank moves (0 = not counted)
    issuers: float = 0.0  # AIV cores moving those rows (0 = the die's share `comm.fused_dispatch_aiv` of its AIVs)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise NpusimError(f"unknown collective '{self.kind}'" + did_you_mean(self.kind, KINDS))
        if self.algorithm not in ALGORITHMS:
            raise NpusimError(f"unknown collective algorithm '{self.algorithm}'" + did_you_mean(self.algorithm, ALGORITHMS),
                              field="algorithm")
        if self.group < 1 or self.stride < 1 or self.bytes < 0:
            raise NpusimError(f"collective {self.kind} needs group >= 1, stride >= 1 and bytes >= 0")
        if self.bulk and self.kind != "all_to_all":
            raise NpusimError(f"only an all-to-all runs as a bulk kernel, not {self.kind}", field="bulk")
        if self.rows < 0 or self.issuers < 0:
            raise NpusimError(f"collective {self.kind} needs rows >= 0 and issuers >= 0", field="rows")
        if self.rows and not self.fused_moe:
            raise NpusimError(f"only a fused MoE all-to-all moves counted rows, not {self.kind}"
                              f"{' (bulk)' if self.bulk else ' (HCCL)' if self.hccl else ''}", field="rows")
        if self.hccl and (self.kind != "all_to_all" or self.bulk):
            raise NpusimError(f"only a non-bulk all-to-all is marked as a plain HCCL call, not {self.kind}"
                              f"{' (bulk)' if self.bulk else ''}", field="hccl")

    @property
    def fused_moe(self) -> bool:
        """The fused MC2 MoE dispatch / combine: an all-to-all that is neither a bulk kernel nor a plain HCCL call."""
        return self.kind == "all_to_all" and not self.bulk and not self.hccl


@dataclass(frozen=True)
class CommResult:
    time: float
    algorithm: str
    tier: str
    alg_bandwidth: float  # bytes / time, the convention of nccl-tests "algbw"

    @property
    def bus_bandwidth(self) -> float:
        return self.alg_bandwidth


def _peer_bw(tier: Tier, eff: float) -> float:
    per_link = tier.bandwidth / tier.links_per_rank if tier.topology == "full-mesh" else tier.bandwidth
    return per_link * eff


def _fan_bw(tier: Tier, peers: int, eff: float) -> float:
    """Bandwidth of one rank sending to `peers` others at once."""
    return min(tier.bandwidth * eff, peers * _peer_bw(tier, eff))


def _flat(kind: str, size: float, g: int, tier: Tier, eff: float, algorithm: str) -> float:
    """A collective of g ranks entirely on one tier."""
    if g == 1 or size == 0:
        return 0.0
    a = tier.latency
    if kind == "p2p":
        return a + size / _peer_bw(tier, eff)
    if kind == "all_reduce":
        return 2 * _flat("all_gather", size, g, tier, eff, algorithm)
    chunk = size / g
    if kind == "broadcast":
        kind, chunk = "all_gather", size / g  # pipelined broadcast moves the same volume as an all-gather
    if algorithm == "ring":
        return (g - 1) * (a + chunk / _peer_bw(tier, eff))
    # mesh: every rank exchanges with all g-1 peers at once
    return a * math.ceil(math.log2(g)) + chunk * (g - 1) / _fan_bw(tier, g - 1, eff)


def collective_time(c: Collective, system: System) -> CommResult:
    chip = system.chip_spec
    bulk = c.bulk and c.group > 1 and c.bytes > 0
    eff = chip.efficiency.link * (chip.efficiency.bulk_all_to_all if bulk else 1.0)
    if c.rows and system.hccl is not None:  # the MC2 AIVs' own stores into the peers' windows, as HCCL's AIV kernels
        eff = system.hccl.efficiency
    span = c.group * c.stride
    tier_name, tier = system.tier_for(span)
    hccl = _node_hccl(c, system, span)
    if hccl is not None and c.bytes > 0:
        t = _hccl_time(c, system, hccl, span)
        return CommResult(t, "hccl-aiv" if _per_rank(c) <= hccl.aiv_entry[c.kind] else "hccl-aicpu-ring",
                          tier_name, c.bytes / t)
    setup = tier.setup if c.kind != "p2p" and c.group > 1 and c.bytes > 0 else 0.0
    setup += (c.group - 1) * chip.overheads.all_to_all_peer if bulk else 0.0
    options: dict[str, float] = {}
    if c.algorithm in ("auto", "ring", "mesh"):
        for alg in (("ring", "mesh") if c.algorithm == "auto" else (c.algorithm,)):
            options[alg] = _flat(c.kind, c.bytes, c.group, tier, eff, alg)
    inner = _inner_tier(system, c.stride, tier_name)
    if c.algorithm in ("auto", "hierarchical") and inner is not None:
        options["hierarchical"] = _hierarchical(c, system, inner, tier, eff)
    if not options:
        raise NpusimError(f"the hierarchical algorithm needs a group that spans two tiers; {c.group} ranks at stride "
                          f"{c.stride} fit one {tier_name} domain of {system.name}", field="algorithm")
    alg = min(options, key=lambda k: (options[k], k))
    t = options[alg] + setup
    if c.rows and c.group > 1 and c.bytes > 0:
        rows = _row_time(c, tier, chip)
        if rows > options[alg]:
            t, alg = rows + setup, "rows"
    return CommResult(t, alg, tier_name, c.bytes / t if t > 0 else math.inf)


def _row_time(c: Collective, tier: Tier, chip) -> float:
    """The fused MoE all-to-all bound by its rows (module docstring): the busiest AIV's rows one after another, each
    a GM -> UB load and a UB -> peer-window store (each DMA's start-up and its bytes at the AIV's MTE rates) and the
    tier's latency for the store to land before the buffer takes the next row. A row is taken as the bytes sent
    (the dispatch's bf16 load before its INT8 quantisation and that quantisation's vector work are not counted)."""
    issuers = c.issuers or chip.aiv.count * (chip.comm.fused_dispatch_aiv if chip.comm is not None else 1.0)
    row = c.bytes / c.rows
    load, store = chip.aiv.pipes["mte2"], chip.aiv.pipes["mte3"]
    dma = (load.latency_cycles + store.latency_cycles + row / load.bytes_per_cycle + row / store.bytes_per_cycle)
    return math.ceil(c.rows / max(1.0, issuers)) * (tier.latency + dma / chip.clock)


def _inner_tier(system: System, stride: int, outer: str) -> tuple[str, Tier, int] | None:
    """The tier inside `outer` where several group members share a domain: (name, tier, members per domain)."""
    best = None
    for name, tier in system.tiers.items():
        if name == outer:
            break
        members = tier.size // stride
        if members >= 2:
            best = (name, tier, members)
    return best


def _hierarchical(c: Collective, system: System, inner: tuple[str, Tier, int], outer: Tier, eff: float) -> float:
    _, itier, g_in = inner
    g_in = math.gcd(g_in, c.group)
    d = c.group // g_in
    if c.kind == "all_to_all":
        local = c.bytes * (g_in - 1) / c.group
        remote = c.bytes * (c.group - g_in) / c.group
        return max(_flat("all_to_all", local * g_in / max(g_in - 1, 1), g_in, itier, eff, "mesh"),
                   outer.latency + remote / _fan_bw(outer, c.group - g_in, eff))
    if c.kind == "p2p":
        return _flat("p2p", c.bytes, 2, outer, eff, "mesh")
    if c.kind == "all_reduce":
        return 2 * _hier_gather(c.bytes, g_in, d, itier, outer, eff)
    return _hier_gather(c.bytes, g_in, d, itier, outer, eff)


def _hier_gather(size: float, g_in: int, d: int, itier: Tier, outer: Tier, eff: float) -> float:
    """All-gather (or reduce-scatter) of `size` output bytes: across domains on the outer tier, then inside."""
    outer_part = min(_flat("all_gather", size / g_in, d, outer, eff, alg) for alg in ("ring", "mesh"))
    inner_part = min(_flat("all_gather", size, g_in, itier, eff, alg) for alg in ("ring", "mesh"))
    return outer_part + inner_part


# ------------------------------------------------------------------------------------------------ HCCL in a node
def _node_hccl(c: Collective, system: System, span: int) -> Hccl | None:
    """The system's HCCL model when it applies: a group of more than one rank inside one node, a kind it covers,
    and the plain algorithm choice."""
    h = system.hccl
    if h is None or c.kind not in HCCL_KINDS or c.group < 2 or c.algorithm != "auto":
        return None
    if c.kind == "all_to_all" and not c.hccl:
        return None
    return h if span <= system.ranks_per_node else None


def delivered(c: Collective) -> float:
    """Bytes the collective brings into one rank from its peers (what it sends mirrors them): (g-1)/g of the buffer,
    twice for an all-reduce (reduce-scatter then all-gather), the whole message of a p2p or broadcast."""
    if c.group <= 1:
        return 0.0
    if c.kind in ("p2p", "broadcast"):
        return c.bytes
    share = c.bytes * (c.group - 1) / c.group
    return 2 * share if c.kind == "all_reduce" else share


def _per_rank(c: Collective) -> float:
    """HCCL's data size: the per-rank shard of an all-gather / reduce-scatter (of an all-to-all: what each peer
    gets), the whole tensor of an all-reduce."""
    return c.bytes if c.kind == "all_reduce" else c.bytes / c.group


def _hccl_exchange(shard: float, c: Collective, system: System, h: Hccl, aiv: bool) -> float:
    """Every rank's `shard` to each peer: the peers within each tier's domain (and not an inner one's) are served
    at once, so the slowest tier decides; the AIV kernel pays one latency, the AI CPU's ring one per step."""
    times, inner, latency = [], 1, 0.0
    for _, tier in system.tiers.items():
        members = min(c.group, max(1, tier.size // c.stride))
        peers = members - inner
        if peers > 0:
            times.append(shard * peers / _fan_bw(tier, peers, h.efficiency))
            latency = tier.latency
        inner = max(inner, members)
        if members >= c.group:
            break
    return max(times) + latency * (1 if aiv else c.group - 1)


def _hccl_time(c: Collective, system: System, h: Hccl, span: int) -> float:
    chip = system.chip_spec
    shard = c.bytes / c.group
    aiv = _per_rank(c) <= h.aiv_entry[c.kind]
    transfer = _hccl_exchange(shard, c, system, h, aiv)
    reduce = c.group * shard / (chip.hbm.bandwidth * chip.efficiency.hbm)  # sum the g shards a rank holds, in HBM
    body = {"all_gather": transfer, "all_to_all": transfer, "reduce_scatter": transfer + reduce,
            "all_reduce": 2 * transfer + reduce}[c.kind]
    return (h.aiv_setup if aiv else h.aicpu_setup) + body
