"""A plan served under load, with every step timed by the kernel/engine stack.

Nothing here computes a latency. A step is `shard` + `step_time` of exactly the shape the scheduler asks for (the
busiest rank of that phase's instance), the HBM left for the cache comes from `memory`, and the prefill-to-decode
link from `parallel.transfer`; `GridStepModel` memoises the calls. Any `--set` override flows through `api.load_setup`.

An attention-FFN disaggregated decode instance is timed by `parallel.af` (both sides' schedule) and its cache
capacity counted on an attention die. A serving rank is one attention-DP group of the plan: the dies that hold a sequence's cache between them (one die
under pure DP; tp x cp dies per pipeline stage otherwise). Its KV capacity is counted on one of those dies, with a
token's cache split over the pipeline stages, CP chunks and GQA's KV heads, and replicated over attention TP
beyond them (MLA's latent is shared by all heads), as `parallel.memory` counts it.

    served = ServedPlan.of(api.load_setup("cloudmatrix384", "deepseek-v3.2-exp", "v32-a3-pd-a17"))
    served.run(OpenLoop(rate=2.0, input=Fixed(8192), output=Fixed(1024)), requests=200, slo=Slo(ttft=2.0)).summary
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from npusim.api import Setup
from npusim.errors import NpusimError
from npusim.graph.accounting import cache_footprint
from npusim.parallel.af import af_step
from npusim.parallel.memory import memory
from npusim.parallel.shard import shard
from npusim.parallel.step import step_time
from npusim.parallel.transfer import kv_path, shards
from npusim.serving.deployment import Deployment, Link, Mtp, Pool, Scheduler
from npusim.serving.load import Load
from npusim.serving.result import ServingResult, Slo
from npusim.serving.sim import simulate
from npusim.serving.stepmodel import Capacity, GridStepModel, StepModel
from npusim.spec import units
from npusim.spec.plan import Plan

MAX_BATCH = 64  # sequences per rank (vLLM max_num_seqs)
TOKEN_BUDGET = 16384  # tokens per rank and step (vLLM max_num_batched_tokens)


@dataclass(frozen=True)
class EngineStepModel:
    """StepModel of one pool of a plan: shard the asked shape onto the busiest rank and time it on the engine.

    Shapes arrive per serving rank; `shard` wants the instance's global batch, so batches are multiplied by the
    attention-DP replicas. A prefill step's totals become per-sequence lengths (batched prompts are timed as equal).
    """

    setup: Setup
    capacity: Capacity

    def prefill_time(self, new_tokens: int, cached_tokens: int, batch: int) -> float:
        return self._time("prefill", self.setup.plan, batch, max(1, round(new_tokens / batch)),
                          round(cached_tokens / batch))

    def decode_time(self, batch: int, context: int, tokens_per_seq: int = 1) -> float:
        plan = self.setup.plan
        if tokens_per_seq - 1 != plan.mtp.depth:  # a what-if MTP depth beside the plan's own
            depth = tokens_per_seq - 1
            plan = dataclasses.replace(plan, mtp=dataclasses.replace(plan.mtp, depth=depth,
                                                                     acceptance=min(plan.mtp.acceptance, depth)))
        return self._time("decode", plan, batch, max(1, context))

    def _time(self, phase: str, plan: Plan, batch: int, length: int, cached: int = 0) -> float:
        s = self.setup
        if phase == "decode" and plan.instance("decode").ffn_ranks:  # attention-FFN disaggregated decode
            return af_step(s.model, plan, s.system, batch=batch * _replicas(plan, phase), context=length,
                           quant=s.quant).time
        step = shard(s.model, plan, phase, batch=batch * _replicas(plan, phase), length=length, quant=s.quant,
                     cached=cached)
        return step_time(step, plan, s.system).time


def _replicas(plan: Plan, phase: str) -> int:
    """Attention-DP ranks of every instance serving `phase`."""
    inst = plan.instance(phase)
    return inst.attention.dp * inst.instances


def _kv_bytes_per_token(setup: Setup, phase: str) -> float:
    """Cache bytes one token costs each die of its DP group: split over pipeline stages, CP chunks and GQA's KV
    heads (`parallel.transfer.shards`)."""
    inst = setup.plan.instance(phase)
    return cache_footprint(setup.model, setup.quant).bytes_per_token / shards(setup.model, inst)


def _free_hbm(setup: Setup, phase: str, max_batch: int, step_tokens: int) -> float:
    """HBM per die left for the cache beside weights, communication buffers and the activations of the largest step
    the scheduler runs (`step_tokens` of prompt; a full batch of decodes)."""
    batch, length = (1, step_tokens) if phase == "prefill" else (max_batch, 1)
    s = setup
    if phase == "decode" and s.plan.instance("decode").ffn_ranks:  # the cache lives on the attention dies
        mem = af_step(s.model, s.plan, s.system, batch=batch * _replicas(s.plan, phase), context=length,
                      quant=s.quant).attention_memory
        return mem.capacity - mem.weights - mem.activations - mem.comm_buffers
    step = shard(s.model, s.plan, phase, batch=batch * _replicas(s.plan, phase), length=length, quant=s.quant)
    mem = memory(s.model, s.plan, step, s.quant, s.system.chip_spec, length)
    return mem.capacity - mem.weights - mem.activations - mem.comm_buffers


def engine_capacity(setup: Setup, phases: tuple[str, ...], *, max_batch: int = MAX_BATCH,
                    token_budget: int = TOKEN_BUDGET, step_tokens: int | None = None) -> Capacity:
    """What one rank of the pool running `phases` holds: the tighter phase decides (co-located pools run both).
    Activations are reserved for the largest prefill step, `step_tokens` (default the budget: with chunking SGLang's
    PrefillAdder and vLLM cap a step's prompt tokens at the chunk). Sliding-window rings (V4) are reserved for a
    full batch up front."""
    inst = setup.plan.instance(phases[0])
    fixed = cache_footprint(setup.model, setup.quant).fixed_bytes_per_sequence / inst.pp
    step = step_tokens or token_budget
    free = min(_free_hbm(setup, phase, max_batch, step) for phase in phases) - max_batch * fixed
    if free <= 0:
        raise NpusimError(f"the {'/'.join(phases)} ranks have no HBM left for the KV cache ("
                          f"{units.format(-free, 'bytes', 3)} short with {max_batch} sequences and a {token_budget}-"
                          "token budget per rank); use more ranks, a lighter quantisation or a smaller batch",
                          file=setup.plan.provenance.file)
    return Capacity(kv_bytes_per_token=_kv_bytes_per_token(setup, phases[0]), kv_capacity=free,
                    max_batch=max_batch, token_budget=token_budget)


def mtp_from_plan(plan: Plan) -> Mtp:
    """The plan gives the mean drafts accepted per step; drafts checked in order, each accepted with probability p,
    give p + p^2 + ... + p^depth of them: solve that for p (bisection, monotone in p)."""
    depth, target = plan.mtp.depth, plan.mtp.acceptance
    if depth == 0:
        return Mtp()
    if target >= depth:
        return Mtp(depth=depth, acceptance=1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid**k for k in range(1, depth + 1)) < target else (lo, mid)
    return Mtp(depth=depth, acceptance=hi)


def kv_link(setup: Setup) -> Link:
    """The prefill-to-decode link of the plan on its system (`parallel.transfer.kv_path`): a request's whole cache
    at the slowest of egress, link and ingress, plus the tier's latency and the transfer engine's fixed costs."""
    s = setup
    path = kv_path(s.model, s.plan, s.system, s.quant)
    return Link(bandwidth=path.bandwidth, latency=path.latency, bytes_per_token=path.bytes_per_token,
                layers=max(1, s.model.num_hidden_layers // s.plan.instance("decode").pp))


def deployment_from_plan(setup: Setup, *, chunk_size: int | None = None, kv_headroom: float = 0.01,
                         scheduler: Scheduler = Scheduler()) -> Deployment:
    """Pools from the plan's instances (a rank = an attention-DP group), the link from the tier joining them, MTP
    from the plan. The plan's own `prefill_chunk`, when set, decides the chunk size (as it does for predict)."""
    plan = setup.plan
    chunk_size = plan.prefill_chunk or chunk_size
    pre, dec = plan.instance("prefill"), plan.instance("decode")
    disaggregated = plan.disaggregated
    if dec.ffn_ranks and not disaggregated:
        raise NpusimError("an attention-FFN disaggregated instance (decode.ffn_ranks) only decodes; the serving "
                          "simulation needs a prefill instance beside it", file=plan.provenance.file,
                          field="decode.ffn_ranks")
    return Deployment(prefill=Pool(instances=pre.instances, ranks=pre.attention.dp),
                      decode=Pool(instances=dec.instances, ranks=dec.attention.dp) if disaggregated else None,
                      link=kv_link(setup) if disaggregated else None, chunk_size=chunk_size, mtp=mtp_from_plan(plan),
                      kv_headroom=kv_headroom, scheduler=scheduler)


@dataclass(frozen=True, eq=False)
class ServedPlan:
    """A plan ready to serve loads: its Deployment and one memoised engine StepModel per pool (the same object for
    both phases when co-located). Reuse one ServedPlan across runs (a rate sweep) so grid nodes are paid once."""

    setup: Setup
    deployment: Deployment
    models: dict[str, GridStepModel]

    @classmethod
    def of(cls, setup: Setup, *, max_batch: int = MAX_BATCH, token_budget: int = TOKEN_BUDGET,
           chunked: bool = True, chunk_size: int | None = None, points_per_octave: int = 4,
           scheduler: Scheduler = Scheduler(), running: Mapping[str, int] | None = None) -> ServedPlan:
        """`chunked`: prompts longer than the chunk run in chunks of `chunk_size` (SGLang's --chunked-prefill-size;
        default the token budget, vLLM V1's) and a step's prompt tokens stay within the chunk, so activations are
        reserved for the smaller of chunk and budget; otherwise whole, alone in their step (activations are still
        reserved for one budget only). `running` sets the running limit per rank of the prefill and/or decode pool
        of a disaggregated plan apart from `max_batch` (SGLang's --max-running-requests of each instance, divided by
        its DP size)."""
        if chunk_size is not None and chunk_size < 1:
            raise NpusimError(f"must be a positive number of tokens, got {chunk_size}", field="--chunk-size")
        deployment = deployment_from_plan(setup, chunk_size=(chunk_size or token_budget) if chunked else None,
                                          scheduler=scheduler)
        step_tokens = min(token_budget, deployment.chunk_size) if deployment.chunk_size else token_budget
        running = dict(running or {})
        if running and not deployment.disaggregated:
            raise NpusimError("a co-located plan has one pool: give its running limit as max_batch",
                              field="--prefill-max-batch / --decode-max-batch")
        roles = {"prefill": ("prefill",), "decode": ("decode",)} if deployment.disaggregated else \
            {"both": ("prefill", "decode")}
        grids = {role: GridStepModel(EngineStepModel(setup, engine_capacity(setup, phases,
                                                                            max_batch=running.get(role, max_batch),
                                                                            token_budget=token_budget,
                                                                            step_tokens=step_tokens)),
                                     points_per_octave=points_per_octave)
                 for role, phases in roles.items()}
        models = grids if deployment.disaggregated else {"prefill": grids["both"], "decode": grids["both"]}
        return cls(setup, deployment, models)

    @property
    def evaluations(self) -> int:
        """Engine step predictions paid so far (grid nodes)."""
        return sum(m.evaluations for m in {id(m): m for m in self.models.values()}.values())

    def run(self, load: Load, *, seed: int = 0, requests: int | None = None, duration: float | None = None,
            slo: Slo | None = None, progress: bool = False) -> ServingResult:
        models: dict[str, StepModel] = dict(self.models)
        return simulate(self.deployment, load, models, seed, requests=requests, duration=duration, slo=slo,
                        progress=progress)
