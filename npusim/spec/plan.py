"""Parallel plans: how the ranks of an instance split attention, MoE and the dense parts, and how instances serve.

A plan names up to two instance roles. `prefill` and `decode` run on separate ranks under prefill-decode
disaggregation. A plan with one instance serves both phases on it when `colocated` (PD mixed) or when that instance
is a prefill; a plan with only a decode instance and not colocated is a decode-only deployment (the decode pool of
a disaggregated service): it runs no prefill, so predict reports no TTFT for it. The serving simulation runs a
one-instance plan co-located either way (requests must be prefilled somewhere). Degrees count ranks: dies on
Atlas A3 (a 910C = 2 ranks), chips elsewhere (published.md §0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npusim.spec.catalog import Catalog, Provenance
from npusim.spec.schema import count, flag, internal, merge, quantity, text

CP_MODES = ("allgather", "ring")
TP_REDUCE = ("reduce_scatter", "all_reduce")
PREFILL_KERNELS = ("sparse", "dense", "auto")
ROUTER_DTYPES = ("bf16", "fp32")


@dataclass(frozen=True, kw_only=True)
class Attention:
    dp: int = count(default=1, doc="data-parallel attention replicas")
    tp: int = count(default=1, doc="heads split across ranks")
    cp: int = count(default=1, doc="context parallel: the sequence split zig-zag into 2*cp chunks")
    sp: int = count(default=1, doc="sequence parallel for norms and the residual")
    cp_mode: str = text(default="allgather", choices=CP_MODES, doc="KV all-gather, or ring P2P overlapped with compute")
    tp_reduce: str = text(default="reduce_scatter", choices=TP_REDUCE,
                          doc="how the row-parallel o_proj's partial sums leave the attention-TP group before the "
                              "group's tokens are split over its dies: reduce_scatter (SGLang DP attention, each die "
                              "keeps its share) or all_reduce (vLLM sequence-parallel MoE, each die takes its chunk "
                              "of the sum); either way the next attention all-gathers the group's tokens")


@dataclass(frozen=True, kw_only=True)
class Moe:
    ep: int = count(default=1)
    tp: int = count(default=1)
    fused_dispatch_tokens: int = count(
        default=512, minimum=0,
        doc="tokens per die up to which a prefill step's MoE uses the fused low-latency dispatch / combine (MC2) "
            "as decode does; above it, the bulk all-to-all with its routing passes. vllm-ascend on A3 switches at "
            "its mc2_tokens_capacity, at most 512; 0 = always bulk (SGLang DeepEP auto mode: normal for prefill)")


@dataclass(frozen=True, kw_only=True)
class Streams:
    shared_expert_side_stream: bool = flag(default=False, doc="shared expert overlaps gating + dispatch")
    comm_overlap: bool = flag(default=True, doc="collectives on their own stream, overlapping compute")
    two_microbatch: bool = flag(default=False, doc="two microbatches interleave compute and communication")
    graph_mode: bool = flag(default=True, doc="captured graph launch instead of eager per-kernel launch")
    attention_cores: int = count(default=0, minimum=0,
                                 doc="AIC (with their AIVs) given to the attention stream; the FFN/MoE stream gets the "
                                     "rest and the two run side by side. 0 = every kernel on all cores, one stream")


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
    ffn_ranks: int = count(default=0, minimum=0,
                           doc="attention-FFN disaggregation (decode): this many further ranks hold the routed and "
                               "shared experts (moe.ep x moe.tp of them) while `ranks` run attention; 0 = co-located")
    attention_domains: int = count(default=1, doc="AF: the attention ranks split into this many domains of their own "
                                                  "sequences, which take turns on the shared expert dies")
    streams: Streams | None = field(default=None, metadata={
        "doc": "this role's streams and schedule, over the plan-level `streams` (fields not written here keep the "
               "plan's); none: the plan's"})

    @property
    def stage_ranks(self) -> int:
        return self.ranks // self.pp

    def busiest_stage(self, total: float, layers: int) -> float:
        """The busiest pipeline stage's part of `total`, spread over `layers` decoder layers: total / pp when pp
        divides them, else ceil(layers / pp) of them (SGLang's get_pp_indices gives the first layers mod pp stages
        one more)."""
        return total / self.pp if layers % self.pp == 0 else total * -(-layers // self.pp) / layers

    @property
    def o_proj_group(self) -> int:
        """Ranks one o_proj is split over: its own TP, or at least the attention-TP group whose heads it reduces."""
        return max(self.o_proj_tp, self.attention.tp)

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
        experts = self.ffn_ranks or n
        if self.moe.ep * self.moe.tp != experts:
            what = f"ffn_ranks ({experts})" if self.ffn_ranks else f"the ranks of a stage ({n})"
            p.append((f"{role}.moe", f"ep x tp = {self.moe.ep}x{self.moe.tp} must equal {what}"))
        if self.attention_domains > 1 and (not self.ffn_ranks or n % self.attention_domains):
            p.append((f"{role}.attention_domains", f"{self.attention_domains} must divide the attention ranks ({n}) of "
                                                   "an attention-FFN disaggregated instance (ffn_ranks > 0)"))
        if self.ffn_ranks and (role != "decode" or self.pp > 1):
            p.append((f"{role}.ffn_ranks", "attention-FFN disaggregation is modelled for a decode instance without "
                                           "pipeline stages"))
        for name in ("dense_tp", "o_proj_tp", "embed_tp", "lm_head_tp"):
            v = getattr(self, name)
            if n % v:
                p.append((f"{role}.{name}", f"{v} does not divide the ranks of a stage ({n})"))
        if a.tp > 1 and self.o_proj_tp > 1 and self.o_proj_tp % a.tp:
            p.append((f"{role}.o_proj_tp", f"{self.o_proj_tp} must be 1 or a multiple of attention.tp ({a.tp}): the "
                                           "o_proj group holds whole attention-TP groups"))
        if a.sp > 1 and n % a.sp:
            p.append((f"{role}.attention.sp", f"{a.sp} does not divide the ranks of a stage ({n})"))
        return p


@dataclass(frozen=True, kw_only=True)
class Mtp:
    depth: int = count(default=0, minimum=0, doc="draft tokens per step (multi-token prediction)")
    acceptance: float = quantity("number", default=0.0, minimum=0.0, strict=False,
                                 doc="accepted drafts per step, on average (e.g. 1.44 of 3)")
    draft: str = text(default="", doc="an EAGLE-3 draft model's config.json that proposes the drafts (SGLang / vLLM "
                                      "EAGLE3, BF16; depth = --speculative-num-steps; unused at depth 0); '' = "
                                      "the model's own MTP layer (NEXTN)")


@dataclass(frozen=True, kw_only=True)
class Eplb:
    redundant_experts: int = count(default=0, minimum=0, doc="extra expert replicas placed by EPLB, per layer")
    imbalance: float = quantity("number", default=1.0, minimum=1.0, strict=False,
                                doc="busiest rank's routed tokens / mean (1 = perfectly balanced)")


@dataclass(frozen=True, kw_only=True)
class KernelOptions:
    """Tiling options of one kernel, passed to it as written (0 = the kernel's own choice)."""

    block_m: int = count(default=0, minimum=0, doc="query rows per block (attention, lightning indexer)")
    block_n: int = count(default=0, minimum=0, doc="keys per block (attention, lightning indexer)")
    base_m: int = count(default=0, minimum=0, doc="GEMM L0 block rows")
    base_n: int = count(default=0, minimum=0, doc="GEMM L0 block columns")
    base_k: int = count(default=0, minimum=0, doc="GEMM L0 block depth")
    step_k: int = count(default=0, minimum=0, doc="GEMM L0 blocks per L1 tile")
    block_rows: int = count(default=0, minimum=0, doc="rows per block of a row-wise vector kernel")
    buffering: int = count(default=2, minimum=1,
                           doc="buffer depth of the pipelined loops: 1 single, 2 double, 3 triple buffering")

    def tiling(self) -> dict[str, int]:
        """The tile sizes that were set (buffering apart: it reaches the kernel through optime.kernel_trace)."""
        return {k: v for k, v in vars(self).items() if k != "buffering" and v}


@dataclass(frozen=True, kw_only=True)
class Fusion:
    """Fused operators: a fused group is one launch whose intermediate tensors stay on chip (L2) instead of a round
    trip through HBM per op. Defaults are the graph as built (unfused prologs, the indexer's top-k in its kernel)."""

    mla_prolog: bool = flag(default=False, doc="norm, q/kv down and up projections, norms, RoPE, cache write as one")
    indexer_prolog: bool = flag(default=False, doc="indexer q/k projections, norm, RoPE, Hadamard, weights as one")
    li_topk: bool = flag(default=True, doc="top-k selected inside the indexer kernel (else scores go through HBM)")
    moe_gating_dispatch: bool = flag(default=False,
                                     doc="gating fused into the dispatch: tokens leave as their routing is known")


@dataclass(frozen=True, kw_only=True)
class ModelCode:
    """Ops a deployment's model code runs beside the model's math, read from its source (defaults: none of them,
    the graph as the model defines it)."""

    router_dtype: str = text(default="bf16", choices=ROUTER_DTYPES,
                             doc="the MoE gate GEMM's operands; fp32 casts the hidden states to fp32 first (the "
                                 "cann-recipes DeepSeek models: an fp32 gate weight and hidden_states.to(float32))")
    ntd_copies: bool = flag(default=False,
                            doc="MHA-mode prefill: the copies that make q_pe contiguous for interleave_rope and "
                                "q_nope contiguous in NTD for flash attention, and k_rope repeated over the heads "
                                "(the cann-recipes R1 prefill's NTD_TND attention)")
    split_exchanges: bool = flag(default=False,
                                 doc="a prefill's bulk MoE all-to-all as torch all_to_all_single calls: the "
                                     "tokens-per-expert counts exchanged first (the rows' splits), and the INT8 "
                                     "rows' scales in an all-to-all of their own (the cann-recipes R1 double routing)")


@dataclass(frozen=True, kw_only=True)
class PrefillAttention:
    """Attention kernel of a DSA (V3.2) prefill (models.md §1.4). Below index_topk keys the indexer selects every
    earlier token, so its scoring is wasted: DeepSeek's service runs short prefills in masked MHA mode, SGLang plain MHA
    below 2048 tokens, Huawei sparse (SFA) at every length. Models without an indexer always prefill dense."""

    kernel: str = text(default="sparse", choices=PREFILL_KERNELS,
                       doc="sparse: Lightning Indexer + sparse flash attention; dense: MHA mode as V3.1 (kv_b "
                           "up-projection + causal flash attention), the indexer only writing its key cache; auto: "
                           "dense below dense_below keys, sparse from there")
    dense_below: int = count(default=2048, doc="auto: a prefill step whose keys (its tokens plus the cached prefix) "
                                                "are fewer than this runs dense")

    def dense(self, keys: int) -> bool:
        """Whether a prefill step whose last query sees `keys` keys runs in MHA mode."""
        return self.kernel == "dense" or (self.kernel == "auto" and keys < self.dense_below)


@dataclass(frozen=True, kw_only=True)
class KvOffload:
    """Decode KV cache held in host memory; each step gathers the rows the indexer selects over the host link."""

    enabled: bool = flag(default=False)
    reuse: float = quantity("number", default=0.0, minimum=0.0, strict=False,
                            doc="fraction of a step's selected rows already on the device from earlier steps (0-1)")


PHASE_NAMES = ("prefill", "decode")


@dataclass(frozen=True, kw_only=True)
class PhaseOptions:
    """What one phase runs with, whichever instance runs it: a co-located plan's one instance serves both phases,
    and the frameworks run them apart (SGLang and vLLM-Ascend capture NPU graphs for decode batches only; a prefill
    launches eagerly)."""

    streams: Streams | None = field(default=None, metadata={
        "doc": "this phase's streams and schedule, over those of the instance that runs it (fields not written here "
               "keep the instance's, or the plan's)"})


@dataclass(frozen=True, kw_only=True)
class Plan:
    name: str = text()
    description: str = text(default="")
    prefill: Instance | None = None
    decode: Instance | None = None
    mtp: Mtp = Mtp()
    eplb: Eplb = Eplb()
    streams: Streams = Streams()
    phases: dict[str, PhaseOptions] = field(default_factory=dict, metadata={
        "doc": "per phase (prefill, decode): settings over the instance's, e.g. a co-located plan's eager prefill "
               "beside its graph-mode decode"})
    kernels: dict[str, KernelOptions] = field(default_factory=dict, metadata={"doc": "options per kernel name"})
    fusion: Fusion = Fusion()
    model_code: ModelCode = ModelCode()
    prefill_chunk: int = count(default=0, minimum=0,
                               doc="chunked prefill: prompt tokens per chunk, each attending to the cached prefix "
                                   "(0 = the whole prompt at once)")
    prefill_attention: PrefillAttention = PrefillAttention()
    kv_offload: KvOffload = KvOffload()
    comm_buffer: float = quantity("bytes", default=200 * 2**20,
                                  doc="HCCL buffer per communication group (HCCL_BUFFSIZE default 200 MB)")
    kv_transfer_tier: str = text(default="", doc="system tier that carries prefill->decode KV; '' = innermost holding both")
    colocated: bool = flag(default=False, doc="the one instance serves prefill and decode (PD mixed); without it a "
                                              "plan with only a decode instance has no prefill and no TTFT")
    provenance: Provenance = internal()

    @staticmethod
    def prepare(tree: dict) -> dict:
        """A role's `streams` written in the file is laid over the plan-level `streams`, field by field, so that a
        plan-level switch (or `--set plan.streams.X`) reaches both phases unless the role sets it itself."""
        common = tree.get("streams")
        for role in ("prefill", "decode"):
            inst = tree.get(role)
            if isinstance(inst, dict) and isinstance(inst.get("streams"), dict) and isinstance(common, dict):
                inst["streams"] = merge(common, inst["streams"])
        phases = tree.get("phases")
        for phase, opts in (phases.items() if isinstance(phases, dict) else ()):
            if not (isinstance(opts, dict) and isinstance(opts.get("streams"), dict)):
                continue
            runs = tree.get(phase) if isinstance(tree.get(phase), dict) else tree.get("decode") or tree.get("prefill")
            own = runs.get("streams") if isinstance(runs, dict) else None
            base = own if isinstance(own, dict) else common
            if isinstance(base, dict):
                opts["streams"] = merge(base, opts["streams"])
        return tree

    def streams_of(self, phase: str) -> Streams:
        """The streams `phase` runs with: the phase's own (`phases`), else those of the instance that runs it, else
        the plan's."""
        own = self.phases.get(phase)
        if own is not None and own.streams is not None:
            return own.streams
        inst = self.instance(phase)
        return inst.streams if inst is not None and inst.streams is not None else self.streams

    def instance(self, phase: str) -> Instance:
        """The layout that runs `phase`; a co-located plan runs both phases on its one instance."""
        own = self.prefill if phase == "prefill" else self.decode
        return own or self.decode or self.prefill

    @property
    def runs_prefill(self) -> bool:
        """Whether the plan has ranks that prefill: a prefill instance, or its one instance when co-located."""
        return self.prefill is not None or self.colocated

    @property
    def disaggregated(self) -> bool:
        return self.prefill is not None and self.decode is not None

    @property
    def ranks(self) -> int:
        if self.disaggregated:
            return sum((i.ranks + i.ffn_ranks) * i.instances for i in (self.prefill, self.decode))
        inst = self.instance("decode")
        return (inst.ranks + inst.ffn_ranks) * inst.instances

    def check(self) -> list[tuple[str, str]]:
        p = []
        if self.prefill is None and self.decode is None:
            p.append(("decode", "is missing: a plan needs a prefill or a decode instance (or both)"))
        for role in ("prefill", "decode"):
            inst = getattr(self, role)
            if inst is not None:
                p += inst.check(role)
        for phase in self.phases:
            if phase not in PHASE_NAMES:
                p.append((f"phases.{phase}", f"is not a phase; allowed: {', '.join(PHASE_NAMES)}"))
        if self.colocated and self.disaggregated:
            p.append(("colocated", "a plan with both a prefill and a decode instance is disaggregated; colocated "
                                   "needs one instance"))
        if self.kv_offload.reuse > 1:
            p.append(("kv_offload.reuse", f"is a fraction (0-1), got {self.kv_offload.reuse:g}"))
        if self.mtp.acceptance > self.mtp.depth:
            p.append(("mtp.acceptance", f"{self.mtp.acceptance:g} accepted drafts is more than mtp.depth ({self.mtp.depth})"))
        return p


PLANS = Catalog("plan", "workloads/plans", Plan, require_sources=False)


def load_plan(name: str, overrides: dict[str, str] | None = None) -> Plan:
    return PLANS.load(name, overrides)
