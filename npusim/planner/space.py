"""The plan search space: instance layouts for prefill and decode, and the plan YAML each candidate becomes.

Prefill and decode run on separate instances (prefill-decode disaggregation), so their layouts are searched apart:
TTFT depends only on the prefill instance and TPOT only on the decode instance, and a candidate deployment is any
pair whose ranks fit the budget. Degrees are ranks (dies on A3), as in plan files.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# Accepted drafts per decode step for each MTP depth the planner may choose, as published (published.md A16/A23:
# MTP1 accepts 0.7; A18/A23: MTP3 accepts 1.44 of 3). Depths without a published acceptance are not searched.
MTP_ACCEPTANCE = {0: 0.0, 1: 0.7, 3: 1.44}


def _powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    out, n = [], 1
    while n <= hi:
        if n >= lo:
            out.append(n)
        n *= 2
    return tuple(out)


@dataclass(frozen=True, order=True)
class Layout:
    """One instance role's layout: the fields of a plan Instance the planner varies (MTP only for decode)."""

    ranks: int
    attention_tp: int = 1
    cp: int = 1
    moe_tp: int = 1
    o_proj_tp: int = 1
    dense_tp: int = 1
    two_microbatch: bool = False
    attention_cores: int = 0  # with two microbatches: AIC of the attention partition (0 = no core split)
    mtp_depth: int = 0

    @property
    def dp(self) -> int:
        return self.ranks // (self.attention_tp * self.cp)

    @property
    def family(self) -> Layout:
        """The layout with its rank count erased: the unit along which TTFT is assumed monotone in ranks."""
        return replace(self, ranks=0, cp=0)

    def instance(self) -> dict:
        """The plan-file mapping of this layout (embedding and LM head split like o_proj, as in A17)."""
        head_tp = min(self.ranks, 16)
        return {"ranks": self.ranks,
                "attention": {"dp": self.dp, "tp": self.attention_tp, "cp": self.cp},
                "moe": {"ep": self.ranks // self.moe_tp, "tp": self.moe_tp},
                "o_proj_tp": self.o_proj_tp, "dense_tp": self.dense_tp,
                "embed_tp": head_tp, "lm_head_tp": head_tp,
                "microbatches": 2 if self.two_microbatch else 1}

    def describe(self) -> str:
        attn = f"CP{self.cp}" if self.cp > 1 else f"DP{self.dp}"
        attn += f"xTP{self.attention_tp}" if self.attention_tp > 1 else ""
        moe = f"EP{self.ranks // self.moe_tp}" + (f"xTP{self.moe_tp}" if self.moe_tp > 1 else "")
        extra = [f"oTP{self.o_proj_tp}"] + ([f"dTP{self.dense_tp}"] if self.dense_tp > 1 else [])
        extra += [f"2mb{self.attention_cores}+" if self.attention_cores else "2mb"] if self.two_microbatch else []
        extra += [f"MTP{self.mtp_depth}"] if self.mtp_depth else []
        return f"{self.ranks}r {attn} {moe} " + " ".join(extra)


def plan_document(prefill: Layout | None, decode: Layout | None, description: str = "",
                  instances: tuple[int, int] = (1, 1)) -> dict:
    """A plan file (the format `npusim predict --plan` reads) for a prefill and/or a decode layout, with
    `instances` of each (prefill, decode). The streams both phases share are plan-level; each role's schedule (two
    microbatches) is its own."""
    doc: dict = {"description": description} if description else {}
    for role, layout, count in (("prefill", prefill, instances[0]), ("decode", decode, instances[1])):
        if layout is not None:
            own = {"two_microbatch": layout.two_microbatch}
            own |= {"attention_cores": layout.attention_cores} if layout.attention_cores else {}
            doc[role] = layout.instance() | ({"instances": count} if count > 1 else {}) | {"streams": own}
    doc["streams"] = {"shared_expert_side_stream": True, "comm_overlap": True}
    depth = decode.mtp_depth if decode is not None else 0
    if depth:
        doc["mtp"] = {"depth": depth, "acceptance": MTP_ACCEPTANCE[depth]}
    return doc


@dataclass(frozen=True)
class SearchSpace:
    """The options searched. Prefill attention is context-parallel (CP fills the ranks TP leaves) because TTFT is
    the latency of one prompt; decode attention is data-parallel. MoE is expert-parallel over the instance."""

    max_ranks: int = 0  # 0 = as many as the chip budget leaves beside the smallest instance of the other role
    min_ranks: int = 8
    attention_tp: tuple[int, ...] = (1, 4, 8)
    moe_tp: tuple[int, ...] = (1,)
    o_proj_tp: tuple[int, ...] = (1, 8)
    dense_tp: tuple[int, ...] = (1, 4)
    two_microbatch: tuple[bool, ...] = (False, True)
    # decode with two microbatches may also split the cores, attention of one microbatch beside the MoE path of the
    # other: the share of a rank's AIC given to attention (CloudMatrix-Infer, arXiv 2506.12708: 16 of 24). Prefill
    # does not split: a long prompt's attention is core-bound (experiments/seed_optimisations.py: slower)
    core_split: tuple[float, ...] = (2 / 3,)
    aic: int = 0  # AIC per rank, set by the search from the chip (0: no core split searched)
    mtp_depths: tuple[int, ...] = (0, 1, 3)
    batch_per_replica: tuple[int, ...] = _powers_of_two(1, 256)
    sizes: tuple[int, ...] = ()  # instance sizes to try; () = every power of two in [min_ranks, max_ranks]

    @property
    def rank_counts(self) -> tuple[int, ...]:
        """Instance sizes: powers of two by default (degrees must divide heads and experts, powers of two)."""
        if self.sizes:
            return tuple(r for r in self.sizes if r <= self.max_ranks)
        return _powers_of_two(self.min_ranks, self.max_ranks)

    def _layouts(self, ranks: int, role: str) -> list[Layout]:
        out = []
        for tp in self.attention_tp:
            for moe_tp in self.moe_tp:
                for o_tp in self.o_proj_tp:
                    for d_tp in self.dense_tp:
                        for two_mb, cores in self._schedules(role):
                            for depth in (self.mtp_depths if role == "decode" else (0,)):
                                if ranks % (tp * moe_tp) or ranks % o_tp or ranks % d_tp or (o_tp > 1 and o_tp % tp):
                                    continue
                                cp = ranks // tp if role == "prefill" else 1
                                out.append(Layout(ranks, tp, cp, moe_tp, o_tp, d_tp, two_mb, cores, depth))
        return out

    def _schedules(self, role: str) -> list[tuple[bool, int]]:
        """(two microbatches, attention AIC) pairs searched for a role."""
        out = [(two_mb, 0) for two_mb in self.two_microbatch]
        if role == "decode" and True in self.two_microbatch and self.aic:
            cores = (round(share * self.aic) for share in self.core_split)
            out += [(True, n) for n in cores if 0 < n < self.aic]
        return out

    def prefill_layouts(self) -> list[Layout]:
        return [x for r in self.rank_counts for x in self._layouts(r, "prefill")]

    def decode_layouts(self) -> list[Layout]:
        return [x for r in self.rank_counts for x in self._layouts(r, "decode")]
