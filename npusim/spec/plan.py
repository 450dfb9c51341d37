"""Parallel plans: how the ranks of an instance split attention, MoE and the dense parts, and how instances serve.

A plan names up to two instance roles. `prefill` and `decode` run on separate ranks under prefill-decode
disaggregation; a plan with only `decode` (or only `prefill`) describes a co-located deployment that serves both
phases on the same ranks with that one layout. Degrees count ranks: dies on Atlas A3 (a 910C = 2 ranks), chips
elsewhere (published.md §0).
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.spec.catalog import Catalog, Provenance
from npusim.spec.schema import count, flag, internal, quantity, text

CP_MODES = ("allgather", "ring")


@dataclass(frozen=True, kw_only=True)
class Attention:
    dp: int = count(default=1, doc="data-parallel attention replicas")
    tp: int = count(default=1, doc="heads split across ranks")
    cp: int = count(default=1, doc="context parallel: the sequence split zig-zag into 2*cp chunks")
    sp: int = count(default=1, doc="sequence parallel for norms and the residual")
    cp_mode: str = text(default="allgather", choices=CP_MODES, doc="KV all-gather, or ring P2P overlapped with compute")


@dataclass(frozen=True, kw_only=True)
class Moe:
    ep: int = count(default=1)
    tp: int = count(default=1)


@dataclass(frozen=True, kw_only=True)
class Instance:
    """The layout of one instance (a group of ranks that runs one copy of the model)."""

    ranks: int = count()
    attention: Attention = Attention()
    moe: Moe = Moe()
    dense_tp: int = count(default=1, doc="TP of the dense FFN layers")
    o_proj_tp: int = count(default=1, doc="TP of the attention output projection")
    embed_tp: int = count(default=1)
    lm_head_tp: int = count(default=1)
    pp: int = count(default=1, doc="pipeline stages")
    microbatches: int = count(default=1, doc="microbatches in flight (PP), or the two-microbatch overlap when 2")
    instances: int = count(default=1, doc="identical instances of this role")

    @property
    def stage_ranks(self) -> int:
        return self.ranks // self.pp

    def check(self, role: str) -> list[tuple[str, str]]:
        p = []
        if self.ranks % self.pp:
            p.append((f"{role}.pp", f"{self.pp} does not divide ranks ({self.ranks})"))
            return p
        n = self.stage_ranks
        a = self.attention
        if a.dp * a.tp * a.cp != n:
            p.append((f"{role}.attention", f"dp x tp x cp = {a.dp}x{a.tp}x{a.cp} = {a.dp * a.tp * a.cp} must equal "
                                           f"the ranks of a stage ({n})"))
        if self.moe.ep * self.moe.tp != n:
            p.append((f"{role}.moe", f"ep x tp = {self.moe.ep}x{self.moe.tp} must equal the ranks of a stage ({n})"))
        for name in ("dense_tp", "o_proj_tp", "embed_tp", "lm_head_tp"):
            v = getattr(self, name)
            if n % v:
                p.append((f"{role}.{name}", f"{v} does not divide the ranks of a stage ({n})"))
        if a.sp > 1 and n % a.sp:
            p.append((f"{role}.attention.sp", f"{a.sp} does not divide the ranks of a stage ({n})"))
        return p


@dataclass(frozen=True, kw_only=True)
class Mtp:
    depth: int = count(default=0, minimum=0, doc="draft tokens per step (multi-token prediction)")
    acceptance: float = quantity("number", default=0.0, minimum=0.0, strict=False,
                                 doc="accepted drafts per step, on average (e.g. 1.44 of 3)")


@dataclass(frozen=True, kw_only=True)
class Eplb:
    redundant_experts: int = count(default=0, minimum=0, doc="extra expert replicas placed by EPLB, per layer")
    imbalance: float = quantity("number", default=1.0, minimum=1.0, strict=False,
                                doc="busiest rank's routed tokens / mean (1 = perfectly balanced)")


@dataclass(frozen=True, kw_only=True)
class Streams:
    shared_expert_side_stream: bool = flag(default=False, doc="shared expert overlaps gating + dispatch")
    comm_overlap: bool = flag(default=True, doc="collectives on their own stream, overlapping compute")
    two_microbatch: bool = flag(default=False, doc="two microbatches interleave compute and communication")
    graph_mode: bool = flag(default=True, doc="captured graph launch instead of eager per-kernel launch")


@dataclass(frozen=True, kw_only=True)
class Plan:
    name: str = text()
    description: str = text(default="")
    prefill: Instance | None = None
    decode: Instance | None = None
    mtp: Mtp = Mtp()
    eplb: Eplb = Eplb()
    streams: Streams = Streams()
    comm_buffer: float = quantity("bytes", default=200 * 2**20,
                                  doc="HCCL buffer per communication group (HCCL_BUFFSIZE default 200 MB)")
    kv_transfer_tier: str = text(default="", doc="system tier that carries prefill->decode KV; '' = innermost holding both")
    provenance: Provenance = internal()

    def instance(self, phase: str) -> Instance:
        """The layout that runs `phase`; a co-located plan runs both phases on its one instance."""
        own = self.prefill if phase == "prefill" else self.decode
        return own or self.decode or self.prefill

    @property
    def disaggregated(self) -> bool:
        return self.prefill is not None and self.decode is not None

    @property
    def ranks(self) -> int:
        if self.disaggregated:
            return self.prefill.ranks * self.prefill.instances + self.decode.ranks * self.decode.instances
        inst = self.instance("decode")
        return inst.ranks * inst.instances

    def check(self) -> list[tuple[str, str]]:
        p = []
        if self.prefill is None and self.decode is None:
            p.append(("decode", "is missing: a plan needs a prefill or a decode instance (or both)"))
        for role in ("prefill", "decode"):
            inst = getattr(self, role)
            if inst is not None:
                p += inst.check(role)
        if self.mtp.acceptance > self.mtp.depth:
            p.append(("mtp.acceptance", f"{self.mtp.acceptance:g} accepted drafts is more than mtp.depth ({self.mtp.depth})"))
        return p


PLANS = Catalog("plan", "workloads/plans", Plan, require_sources=False)


def load_plan(name: str, overrides: dict[str, str] | None = None) -> Plan:
    return PLANS.load(name, overrides)
