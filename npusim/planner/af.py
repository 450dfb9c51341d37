"""Sizing the two sides of an attention-FFN disaggregated decode instance (npusim.parallel.af) at a fixed rank
count: how many dies run attention and how many hold the experts, and how many microbatches flow between them.

The expert side's size is an EP degree that divides the routed experts (plus EPLB's redundant ones); the attention
side takes the remaining ranks as DP attention. Every split and microbatch count is predicted (the kernels are
memoised, so a split costs the schedule and a few new shapes); splits whose attention or expert dies do not fit in
HBM are kept with the reason. The best is the shortest step: at a fixed batch and chip count that is the most
tokens per chip.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from npusim.errors import NpusimError
from npusim.parallel.af import AfStep, af_step
from npusim.spec.model import ModelConfig
from npusim.spec.plan import Attention, Moe, Plan
from npusim.spec.quant import QuantScheme
from npusim.spec.system import System


@dataclass(frozen=True)
class AfSplit:
    attention_ranks: int
    expert_ranks: int
    microbatches: int
    domains: int
    step: AfStep | None  # None when a side does not fit
    reason: str = ""

    @property
    def time(self) -> float:
        return self.step.time if self.step else float("inf")


def af_plan(plan: Plan, attention_ranks: int, expert_ranks: int, microbatches: int, domains: int = 1) -> Plan:
    """The plan with its decode instance laid out as AF with these sides (DP attention, EP experts)."""
    inst = plan.instance("decode")
    decode = dataclasses.replace(inst, ranks=attention_ranks, ffn_ranks=expert_ranks, microbatches=microbatches,
                                 attention_domains=domains, attention=Attention(dp=attention_ranks),
                                 moe=Moe(ep=expert_ranks), pp=1)
    return dataclasses.replace(plan, decode=decode)


def size_af(model: ModelConfig, plan: Plan, system: System, *, ranks: int, batch: int, context: int,
            quant: QuantScheme, microbatches: tuple[int, ...] = (1, 2, 3, 4),
            domains: tuple[int, ...] = (1,)) -> list[AfSplit]:
    """Every split of `ranks` decode dies into attention (in `domains` domains dividing them) and experts (EP
    dividing the experts), with each microbatch count, fastest first."""
    experts = model.n_routed_experts + plan.eplb.redundant_experts
    splits = []
    for ep in range(1, ranks):
        if experts % ep:
            continue
        for d in (d for d in domains if (ranks - ep) % d == 0):
            for m in microbatches:
                splits.append(_split(model, af_plan(plan, ranks - ep, ep, m, d), system, batch, context, quant))
    return sorted(splits, key=lambda s: (s.time, s.expert_ranks, s.domains, s.microbatches))


def _split(model: ModelConfig, plan: Plan, system: System, batch: int, context: int, quant: QuantScheme) -> AfSplit:
    inst = plan.decode
    sizes = (inst.ranks, inst.ffn_ranks, inst.microbatches, inst.attention_domains)
    try:
        step = af_step(model, plan, system, batch=batch, context=context, quant=quant)
    except NpusimError as exc:
        return AfSplit(*sizes, None, str(exc))
    full = [side for side, mem in (("attention", step.attention_memory), ("expert", step.expert_memory))
            if not mem.fits]
    return AfSplit(*sizes, None if full else step, f"{' and '.join(full)} dies do not fit in HBM" if full else "")
