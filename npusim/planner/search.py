"""Capacity planning: the plans that meet a TTFT / TPOT SLO, their Pareto frontier, and the one to deploy.

Every number comes from `npusim.api.predict`; the search only decides which candidates to ask about. Three cheap
facts keep the number of predictions small:

- prefill and decode instances are independent under disaggregation (TTFT from the prefill layout, TPOT from the
  decode layout), so N prefill layouts x M decode layouts cost N + M predictions, not N x M;
- within a layout family, TTFT does not improve with fewer ranks, so the rank counts of a family are walked from
  the largest down and the walk stops at the first miss (or the first that does not fit in memory);
- TPOT and memory do not improve with a larger batch, so the largest batch that meets TPOT is found by bisection.

Configurations that do not divide the model or do not fit in HBM are refused by predict before any timing, so they
cost a millisecond. Each pair of a prefill and a decode layout becomes a deployment of pools (`planner.pools`: how
many prefill and decode instances, sized to the request rate they carry with the queueing waits inside the TTFT
limit at the SLO's percentile), whose output tokens per chip are the frontier's measure. The frontier is then
predicted again as complete disaggregated plans, pools included, with the real scenario; the recommendation is served
at its pools' rate (Poisson arrivals) to confirm it, and co-located deployments are served beside it for the verdict
(`planner.colocated`; `colocated=False` skips them).

Given a load (`Traffic`), meeting the SLO for one request is necessary, not sufficient: under a request rate TTFT
gains queueing and TPOT the spread of contexts and MTP draws. The frontier (which then also keeps larger deployments
for their total throughput) is served in the request-level simulation, cheapest first, until one plan meets the SLO
at the chosen percentile; that plan is recommended. At a given load every plan serves the same tokens, so a plan's
cost per token is proportional to its chips: that is the order.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from itertools import groupby
from pathlib import Path

import numpy as np
import yaml

from npusim import api
from npusim.errors import NpusimError
from npusim.planner.colocated import Mixed, compare_deployments, verdict
from npusim.planner.pools import Pools, size_pools
from npusim.planner.space import Layout, SearchSpace, plan_document
from npusim.progress import progress as progress_bar
from npusim.serving import ClosedLoop, Fixed, OpenLoop, Percentiles, Slo
from npusim.serving.predicted import ServedPlan
from npusim.serving.steady import run_length
from npusim.spec.catalog import files_pinned
from npusim.spec.system import load_system


@dataclass(frozen=True)
class Scenario:
    """What is planned for: the model on the system at these lengths, with the user's --set overrides."""

    hw: str
    model: str
    input: int
    output: int
    quant: str | None = "bf16"
    overrides: tuple[tuple[str, str], ...] = ()
    prefix_hit: float = 0.0  # share of each prompt already in the prefix cache (api.predict's prefix_hit)

    @property
    def context(self) -> int:
        return self.input + self.output // 2


PERCENTILES = tuple(f.name for f in fields(Percentiles))  # what an SLO may be judged at: mean, p50, p90, p99


@dataclass(frozen=True)
class Traffic:
    """The load a plan must serve, with requests of the planned lengths: `rate` requests/s arriving as a Poisson
    process (open loop) or `concurrency` users each waiting for their last answer (closed loop). The SLO is judged at
    `percentile` over the steady window of one seeded run of at least `requests` requests, and as many as a steady
    window needs (`sized`); an overloaded run misses it."""

    rate: float | None = None
    concurrency: int | None = None
    percentile: str = "p99"
    requests: int = 200
    seed: int = 0
    sized_: bool = False  # `requests` is the run's length, sized for a steady window (`sized`); else its least

    def __post_init__(self):
        if (self.rate is None) == (self.concurrency is None):
            raise NpusimError("give either a request rate or a concurrency", field="--rate")
        if self.percentile not in PERCENTILES:
            raise NpusimError(f"'{self.percentile}' is not one of {', '.join(PERCENTILES)}", field="--percentile")
        if self.requests < 1:
            raise NpusimError(f"must be at least 1, got {self.requests}", field="--requests")
        try:
            self.load(1, 1)  # the serving load checks its own rate / concurrency
        except NpusimError as exc:
            raise NpusimError(exc.detail, field=f"--{exc.field}") from None

    def load(self, input: int, output: int, prefix_hit: float = 0.0) -> OpenLoop | ClosedLoop:
        if self.rate is not None:
            return OpenLoop(self.rate, Fixed(input), Fixed(output), prefix_hit=prefix_hit)
        return ClosedLoop(self.concurrency, Fixed(input), Fixed(output), prefix_hit=prefix_hit)

    def sized(self, e2e: float) -> Traffic:
        """This load over as many requests as a steady window needs when a request takes `e2e` seconds (a plan's
        predicted TTFT + output x TPOT; `steady.run_length`), at least `requests`, at most MAX_SERVED."""
        need = run_length(e2e=e2e, rate=self.rate) if self.rate is not None else \
            run_length(concurrency=self.concurrency)
        return replace(self, requests=max(self.requests, min(MAX_SERVED, need)), sized_=True)

    def describe(self) -> str:
        kind = (f"{self.rate:g} requests/s (Poisson)" if self.rate is not None
                else f"{self.concurrency} concurrent users")
        least = "" if self.sized_ else "+"
        return f"{kind}, {self.requests}{least} requests, seed {self.seed}, SLO at {self.percentile}"

    def args(self) -> str:
        """The same load as `npusim serve` options."""
        kind = f"--rate {self.rate!r}" if self.rate is not None else f"--concurrency {self.concurrency}"
        return f"{kind} --requests {self.requests} --seed {self.seed}"


def violation(ttft: float, tpot: float, slo: Slo) -> float:
    """How far the worse of TTFT and TPOT is from its target (<= 1 meets the SLO)."""
    return max(ttft / slo.ttft, tpot / slo.tpot)


@dataclass(frozen=True)
class PhasePoint:
    """One prediction of one role: prefill (latency = TTFT of one prompt) or decode (latency = TPOT at `batch`)."""

    layout: Layout
    batch: int
    latency: float = float("inf")
    tokens_per_s_per_chip: float = 0.0
    chips: float = 0.0
    error: str = ""
    step: float = float("inf")  # prefill: the prompt's step, which holds the instance (TTFT less the KV transfer)

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def misfit(self) -> bool:
        """Refused for HBM (monotone: fewer ranks or a larger batch cannot fit either), not for a plan rule."""
        return "does not fit in HBM" in self.error


@dataclass(frozen=True)
class Candidate:
    """A deployment: a pool of prefill instances and a pool of decode instances of one layout each (`pools`: how
    many of each, sized to the rate they carry together), with their figures."""

    prefill: PhasePoint
    decode: PhasePoint  # one decode instance at its batch
    ttft: float
    tpot: float
    chips: float  # both pools
    decode_tokens_per_s_per_chip: float
    served_tokens_per_s_per_chip: float  # output tokens/s per chip of the pools at their rate, prefill chips counted
    exact: bool = False  # True once predicted as a complete plan
    pools: Pools = Pools()

    @property
    def batch(self) -> int:
        """The global decode batch: every decode instance at its batch."""
        return self.decode.batch * self.pools.decode

    def violation(self, slo: Slo) -> float:
        return violation(self.ttft, self.tpot, slo)

    @property
    def served_tokens_per_s(self) -> float:
        """Output tokens/s of the whole deployment at full batch: the load it can carry."""
        return self.served_tokens_per_s_per_chip * self.chips

    def scheduler(self, sc: Scenario) -> dict[str, int]:
        """Serving limits as planned: the decode batch per attention-DP rank, and a prefill step of one prompt (the
        step predict sized the prefill instance for)."""
        return {"max_batch": math.ceil(self.decode.batch / self.decode.layout.dp), "token_budget": sc.input}

    def row(self) -> dict:
        return {"chips": self.chips, "pools": self.pools.describe(), "prefill": self.prefill.layout.describe(),
                "decode": self.decode.layout.describe(), "batch": self.batch,
                "ttft_ms": self.ttft * 1e3, "tpot_ms": self.tpot * 1e3,
                "decode_tok_s_chip": self.decode_tokens_per_s_per_chip,
                "served_tok_s_chip": self.served_tokens_per_s_per_chip}


@dataclass(frozen=True)
class Served:
    """A candidate run in the serving simulation under the Traffic: TTFT and TPOT at its percentile, the limits they
    miss, or why the plan could not be served at all."""

    candidate: Candidate
    ttft: float = math.inf
    tpot: float = math.inf
    misses: tuple[str, ...] = ()  # 'ttft', 'tpot'
    error: str = ""
    tokens_per_s_per_chip: float = 0.0  # output tokens/s per chip over the run's steady window
    traffic: Traffic | None = None

    @property
    def ok(self) -> bool:
        return not (self.error or self.misses)

    def verdict(self, percentile: str) -> str:
        if self.error:
            return self.error
        late = " and ".join(f"{m.upper()} {percentile}" for m in self.misses if m != "steady")
        if "steady" in self.misses:  # an overloaded run: its queue grew over the steady window
            return "no steady state (overloaded)" + (f"; {late} above SLO" if late else "")
        return "meets" if self.ok else late + " above SLO"

    def row(self, percentile: str) -> dict:
        return {**self.candidate.row(), f"ttft_{percentile}_ms": self.ttft * 1e3,
                f"tpot_{percentile}_ms": self.tpot * 1e3, "served_tok_s_chip_under_load": self.tokens_per_s_per_chip,
                "under_load": self.verdict(percentile)}


@dataclass
class SearchResult:
    scenario: Scenario
    slo: Slo
    candidates: int  # deployments in the space (prefill layouts x decode layouts x batches, within the budget)
    predictions: int  # predict calls made
    pruned: int  # role points skipped by a monotone bound
    frontier: list[Candidate] = field(default_factory=list)  # meeting the SLO, Pareto-optimal, exact
    closest: list[Candidate] = field(default_factory=list)  # when nothing meets: the nearest misses, exact
    recommended: Candidate | None = None
    refusal: str = ""  # when no candidate could run at all: predict's reason for the largest one
    traffic: Traffic | None = None
    served: list[Served] = field(default_factory=list)  # frontier plans served under the traffic, in the order tried
    percentile: str = "p99"  # the TTFT limit's percentile the pools are sized for (the traffic's, when given)
    colocated: list[Mixed] = field(default_factory=list)  # co-located deployments served, in the order tried
    disaggregated: Mixed | None = None  # the recommendation as served beside them
    verdict: str = ""  # which wins at the SLO, and by how much

    @property
    def verified(self) -> Served | None:
        """The recommended plan's run under the traffic."""
        return next((s for s in self.served if s.ok), None)

    @property
    def confirmed(self) -> Served | None:
        """The recommended plan served: under the traffic, else at its pools' rate (`served_load`)."""
        return next((s for s in self.served if s.candidate is self.recommended), None)

    def closest_served(self, n: int = 5) -> list[Served]:
        """The served plans nearest to the SLO at the traffic's percentile (the worse of the two ratios)."""
        return sorted(self.served, key=lambda s: violation(s.ttft, s.tpot, self.slo))[:n]


# ------------------------------------------------------------------------------------------------ evaluation

_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's emitter: the same text as safe_dump, 4x faster
_PLAN_FILES: dict[tuple[str, str], str] = {}  # (workdir, repr(doc)) -> its file: a decode layout's batches share one


def _plan_file(doc: dict, workdir: str) -> str:
    """The plan file of `doc` in the search's `workdir`, named by its text (written once, looked up after)."""
    key = (workdir, repr(doc))
    if key in _PLAN_FILES and os.path.exists(_PLAN_FILES[key]):
        return _PLAN_FILES[key]
    text = yaml.dump(doc, Dumper=_DUMPER, sort_keys=False)
    path = Path(workdir) / f"p{hashlib.sha1(text.encode()).hexdigest()[:16]}.yaml"
    if not path.exists():
        path.write_text(text)
    _PLAN_FILES[key] = str(path)
    return str(path)


def _predict_role(sc: Scenario, layout: Layout, role: str, batch: int, workdir: str) -> PhasePoint:
    """Predict one role alone, the other phase reduced to one token so that neither its time nor its memory enters:
    prefill beside a decode instance of the same size at context 1; decode co-located with a one-token prompt."""
    doc = (plan_document(layout, replace(layout, cp=1)) if role == "prefill" else plan_document(None, layout))
    kwargs = ({"input": sc.input, "batch": 1, "context": 1} if role == "prefill"
              else {"input": 1, "batch": batch, "context": sc.context})
    try:
        p = api.predict(sc.hw, sc.model, _plan_file(doc, workdir), output=sc.output, quant=sc.quant,
                        prefix_hit=sc.prefix_hit if role == "prefill" else 0.0, overrides=dict(sc.overrides),
                        **kwargs)
    except NpusimError as exc:
        return PhasePoint(layout, batch, error=exc.detail)
    if role == "prefill":
        return PhasePoint(layout, 1, p.ttft, p.prefill_tokens_per_s_per_chip, p.prefill_chips, step=p.prefill.time)
    return PhasePoint(layout, batch, p.tpot, p.tokens_per_s_per_chip, p.decode_chips)


def _walk_prefill_family(sc: Scenario, layouts: list[Layout], slo: Slo, prune: bool, workdir: str):
    """Largest rank count first; with pruning, stop at the first TTFT miss or HBM misfit: fewer ranks cannot do
    better. A size the plan rules refuse (e.g. EP above the expert count) is skipped, not a bound."""
    points = []
    for i, layout in enumerate(sorted(layouts, key=lambda x: -x.ranks)):
        pt = _predict_role(sc, layout, "prefill", 1, workdir)
        points.append(pt)
        if prune and (pt.misfit or (pt.ok and pt.latency > slo.ttft)):
            return points, len(layouts) - i - 1
    return points, 0


def _bisect_decode_batch(sc: Scenario, layout: Layout, slo: Slo, batches: tuple[int, ...], prune: bool,
                         workdir: str):
    """The batches of one decode layout; with pruning, only those a bisection for the largest batch meeting
    TPOT (and fitting in memory) visits."""
    def at(i):
        return _predict_role(sc, layout, "decode", batches[i] * layout.dp, workdir)

    if not prune:
        return [at(i) for i in range(len(batches))], 0
    meets = lambda pt: pt.ok and pt.latency <= slo.tpot  # noqa: E731
    points = {0: at(0)}
    if meets(points[0]):
        lo, hi = 0, len(batches) - 1
        points[hi] = at(hi)
        if not meets(points[hi]):
            while hi - lo > 1:  # invariant: lo meets, hi does not
                mid = (lo + hi) // 2
                points[mid] = at(mid)
                lo, hi = (mid, hi) if meets(points[mid]) else (lo, mid)
    return list(points.values()), len(batches) - len(points)


def _decode_family(sc: Scenario, layouts: list[Layout], slo: Slo, batches: tuple[int, ...], prune: bool,
                   workdir: str):
    """Every rank count of one decode family in one process: their per-rank kernels repeat (the memo hits)."""
    runs = [_bisect_decode_batch(sc, x, slo, batches, prune, workdir) for x in layouts]
    return [p for pts, _ in runs for p in pts], sum(n for _, n in runs)


def _run(tasks, fn, workers: int, what: str = "", show: bool = False):
    """fn over the tasks, in order; `show`: a progress bar of `what` on a terminal."""
    with progress_bar(len(tasks), what, "task", enabled=show) as bar:
        if workers <= 1:
            out = []
            for t in tasks:
                out.append(fn(*t))
                bar.update()
            return out
        # neighbouring tasks share kernels (the memo is per process), so each worker takes runs of them
        with ProcessPoolExecutor(max_workers=workers) as pool:
            out = []
            for r in pool.map(fn, *zip(*tasks), chunksize=max(1, len(tasks) // (4 * workers))):
                out.append(r)
                bar.update()
            return out


# ------------------------------------------------------------------------------------------------ combining

@dataclass(frozen=True)
class Budget:
    """What the pools are sized within: ranks of the system (or --max-chips), dies per chip, and the percentile the
    TTFT limit is judged at (the prefill queue's wait)."""

    ranks: int
    dies: int
    percentile: str = "p99"
    load: Traffic | None = None  # the pools then carry its rate (a closed loop's: users / one request's cycle)


def _sized(sc: Scenario, slo: Slo, budget: Budget, pre: PhasePoint, dec: PhasePoint, ttft: float, tpot: float,
           step: float, exact: bool = False) -> Candidate:
    """The pair with its pools sized (`pools.size_pools`); one instance of each, at the rate the slower carries
    with no queue, when no pools meet the TTFT limit (a candidate that misses the SLO anyway)."""
    load = budget.load
    rate = None if load is None else load.rate or load.concurrency / (ttft + sc.output * tpot)
    alone = Pools(1, 1, min(1 / step, dec.batch / (sc.output * tpot)), rate)
    pools = size_pools(sc.output, step, pre.layout.ranks, slo.ttft - ttft, dec.batch, tpot, dec.layout.ranks,
                       budget.ranks, budget.percentile, rate) or alone
    chips = (pools.prefill * pre.layout.ranks + pools.decode * dec.layout.ranks) / budget.dies
    return Candidate(pre, dec, ttft, tpot, chips, dec.tokens_per_s_per_chip,
                     sc.output * pools.requests_per_s / chips, exact, pools)


def _combine(sc: Scenario, slo: Slo, budget: Budget, pre: PhasePoint, dec: PhasePoint) -> Candidate:
    return _sized(sc, slo, budget, pre, dec, pre.latency, dec.latency, pre.step)


def pareto(cands: list[Candidate], by_total: bool = False) -> list[Candidate]:
    """Candidates no other beats on served tokens/s per chip, TPOT and chips at once (`by_total`: and on the served
    tokens/s of the whole deployment, so that a larger deployment is kept for the load it can carry)."""
    if not cands:
        return []
    m = np.array([(-c.served_tokens_per_s_per_chip, c.tpot, c.chips) + ((-c.served_tokens_per_s,) if by_total else ())
                  for c in cands])
    keep = [i for i in range(len(m)) if not np.any(np.all(m <= m[i], axis=1) & np.any(m < m[i], axis=1))]
    return sorted((cands[i] for i in keep), key=lambda c: (c.chips, c.tpot))


def recommend(frontier: list[Candidate]) -> Candidate | None:
    """Most served tokens/s per chip (the cheapest tokens); fewer chips, then lower TPOT, break ties."""
    return min(frontier, key=lambda c: (-c.served_tokens_per_s_per_chip, c.chips, c.tpot), default=None)


def candidate_plan(cand: Candidate, description: str = "") -> dict:
    """The plan file of a candidate: its two layouts with their pools' instance counts."""
    return plan_document(cand.prefill.layout, cand.decode.layout, description,
                         instances=(cand.pools.prefill, cand.pools.decode))


def _exact(sc: Scenario, slo: Slo, budget: Budget, cand: Candidate, workdir: str) -> Candidate:
    """The candidate predicted as one complete disaggregated plan with its pools (TTFT then includes the KV
    transfer over the tier the pools span), the pools sized again from those figures until they stay put."""
    for _ in range(3):
        p = api.predict(sc.hw, sc.model, _plan_file(candidate_plan(cand), workdir), input=sc.input,
                        output=sc.output, batch=cand.batch, quant=sc.quant, prefix_hit=sc.prefix_hit,
                        overrides=dict(sc.overrides))
        sized = _sized(sc, slo, budget, cand.prefill, cand.decode, p.ttft, p.tpot, p.prefill.time, exact=True)
        settled = sized.pools.prefill == cand.pools.prefill and sized.pools.decode == cand.pools.decode
        cand = replace(sized, decode_tokens_per_s_per_chip=p.tokens_per_s_per_chip)
        if settled:
            break
    return cand


def _exact_or_none(sc: Scenario, slo: Slo, budget: Budget, cand: Candidate, workdir: str) -> Candidate | None:
    try:
        return _exact(sc, slo, budget, cand, workdir)
    except NpusimError:  # e.g. the two instances together exceed the system
        return None


def _serve(sc: Scenario, cand: Candidate, slo: Slo, traffic: Traffic, workdir: str) -> Served:
    """The candidate's plan file served under the traffic, as the `npusim serve` command of `commands` does. Pools
    sized short of an open loop's rate are not served (`Pools.unmet`); a closed loop slows its users instead."""
    if traffic.rate is not None and cand.pools.unmet:
        return Served(cand, error=cand.pools.unmet, traffic=traffic)
    traffic = traffic.sized(cand.ttft + sc.output * cand.tpot)
    plan = _plan_file(candidate_plan(cand), workdir)
    try:
        served = ServedPlan.of(api.load_setup(sc.hw, sc.model, plan, sc.quant, dict(sc.overrides)),
                               **cand.scheduler(sc))
        summary = served.run(traffic.load(sc.input, sc.output, sc.prefix_hit), seed=traffic.seed, requests=traffic.requests,
                             slo=slo).summary
    except NpusimError as exc:  # e.g. no HBM left for the KV cache beside the planned batch
        return Served(cand, error=exc.detail, traffic=traffic)
    pct = traffic.percentile
    return Served(cand, getattr(summary.steady_ttft, pct), getattr(summary.steady_tpot, pct), summary.misses(slo, pct),
                  tokens_per_s_per_chip=summary.steady_output_throughput / cand.chips, traffic=traffic)


CONFIRM_TRIES = 4  # frontier plans served at their pools' rate, at most, for one that meets the SLO


def _serve_best_first(sc: Scenario, result: SearchResult, workdir: str) -> list[Served]:
    """Without a load: the frontier served at each plan's pools' rate, the cheapest tokens first, until one meets the
    SLO at the percentile (a TPOT met at the mean context may miss at p99); the best is kept when none of the first
    `CONFIRM_TRIES` does."""
    out = []
    for cand in sorted(result.frontier, key=lambda c: (-c.served_tokens_per_s_per_chip, c.chips, c.tpot)):
        out.append(_serve(sc, cand, result.slo, served_load(result, cand), workdir))
        if out[-1].ok or len(out) == CONFIRM_TRIES:
            break
    return out


def _serve_cheapest_first(sc: Scenario, frontier: list[Candidate], slo: Slo, traffic: Traffic,
                          workdir: str) -> list[Served]:
    """Serve the frontier in order of chips (at a fixed load, of cost), the most served tokens per chip first among
    equals, and stop at the first plan that meets the SLO."""
    out = []
    for cand in sorted(frontier, key=lambda c: (c.chips, -c.served_tokens_per_s_per_chip, c.tpot)):
        out.append(_serve(sc, cand, slo, traffic, workdir))
        if out[-1].ok:
            break
    return out


# ------------------------------------------------------------------------------------------------ the search

def _families(layouts: list[Layout]) -> list[list[Layout]]:
    key = lambda x: (x.family, x.ranks)  # noqa: E731
    return [list(g) for _, g in groupby(sorted(layouts, key=key), key=lambda x: x.family)]


def search(hw: str, model: str, *, input: int, output: int, slo: Slo, max_chips: float | None = None,
           quant: str | None = "bf16", overrides: dict[str, str] | None = None, space: SearchSpace | None = None,
           workers: int | None = None, prune: bool = True, closest: int = 5,
           load: Traffic | None = None, percentile: str = "p99", colocated: bool = True,
           progress: bool = False, prefix_hit: float = 0.0) -> SearchResult:
    """Search disaggregated plans for `model` on `hw`; see the module docstring for how. With a `load`, the
    recommended plan is the cheapest on the frontier that also meets the SLO under it in the serving simulation.
    `colocated`: also serve co-located deployments of the frontier's decode layouts and say which wins
    (`planner.colocated`)."""
    if slo.ttft is None or slo.tpot is None:
        raise NpusimError("the planner needs both a ttft and a tpot limit, e.g. ttft=2s,tpot=30ms", field="--slo")
    if not 0.0 <= prefix_hit < 1.0:
        raise NpusimError(f"must be a fraction in [0, 1), got {prefix_hit}", field="--prefix-hit")
    sc = Scenario(hw, model, input, output, quant, tuple(sorted((overrides or {}).items())), prefix_hit)
    system = load_system(hw, api.split_overrides(overrides)["hw"])
    dies = system.chip_spec.dies
    budget = system.ranks if max_chips is None else min(system.ranks, int(max_chips * dies))
    space = space or SearchSpace()
    room = budget - space.min_ranks  # the largest instance that leaves room for the other role
    space = replace(space, max_ranks=min(space.max_ranks, room) if space.max_ranks else room,
                    aic=space.aic or system.chip_spec.aic.count)
    workers = workers if workers is not None else min(2, os.cpu_count() or 1)
    if budget < 2 * space.min_ranks or not space.rank_counts:
        raise NpusimError(f"{budget} ranks cannot hold a prefill and a decode instance of {space.min_ranks} ranks "
                          "each", field="--max-chips")
    with tempfile.TemporaryDirectory(prefix="npusim-plan-") as workdir, files_pinned():
        pre_runs = _run([(sc, fam, slo, prune, workdir) for fam in _families(space.prefill_layouts())],
                        _walk_prefill_family, workers, "prefill layouts", progress)
        decodes = space.decode_layouts()
        dec_runs = _run([(sc, fam, slo, space.batch_per_replica, prune, workdir) for fam in _families(decodes)],
                        _decode_family, workers, "decode layouts", progress)
        pre_points = [p for pts, _ in pre_runs for p in pts if p.ok]
        dec_points = [p for pts, _ in dec_runs for p in pts if p.ok]
        predictions = sum(len(pts) for pts, _ in pre_runs + dec_runs)
        pruned = sum(n for _, n in pre_runs + dec_runs)
        n_batches = len(space.batch_per_replica)
        n_cands = sum(n_batches for p in space.prefill_layouts() for d in decodes if p.ranks + d.ranks <= budget)

        # per prefill size, only the best meeting point and the fastest matter to a pairing
        best_pre = []
        for _, g in groupby(sorted(pre_points, key=lambda p: p.layout.ranks), key=lambda p: p.layout.ranks):
            g = list(g)
            meeting = [p for p in g if p.latency <= slo.ttft]
            if meeting:
                best_pre.append(max(meeting, key=lambda p: p.tokens_per_s_per_chip))
            best_pre.append(min(g, key=lambda p: p.latency))
        sizing = Budget(budget, dies, load.percentile if load is not None else percentile, load)
        combos = [_combine(sc, slo, sizing, p, d) for p in set(best_pre) for d in dec_points
                  if p.layout.ranks + d.layout.ranks <= budget]
        meeting = [c for c in combos if c.violation(slo) <= 1]
        result = SearchResult(sc, slo, n_cands, predictions, pruned, traffic=load, percentile=sizing.percentile)
        by_total = load is not None
        frontier_tasks = [(sc, slo, sizing, c, workdir) for c in pareto(meeting, by_total)]
        exact = [c for c in _run(frontier_tasks, _exact_or_none, workers, "frontier as complete plans", progress) if c]
        result.frontier = pareto([c for c in exact if c.violation(slo) <= 1], by_total)
        # without a load the co-located runs are served whenever the frontier is not empty: with a second worker
        # they run in it while this process serves the frontier (their seeds fixed, the same runs either way)
        with _ahead(colocated and load is None and bool(result.frontier) and workers > 1, _colocated_runs, sc, slo,
                    result.frontier, workdir, sizing.percentile, load) as colocated_runs:
            if load is None:
                result.served = _serve_best_first(sc, result, workdir)
                result.recommended = (result.verified.candidate if result.verified else
                                      recommend(result.frontier))
            else:
                result.served = _serve_cheapest_first(sc, result.frontier, slo, load, workdir)
                result.recommended = result.verified.candidate if result.verified else None
            if not combos:
                failed = [p for pts, _ in pre_runs + dec_runs for p in pts if not p.ok]
                worst = max(failed, key=lambda p: p.layout.ranks, default=None)
                result.refusal = f"{worst.layout.describe()}: {worst.error}" if worst else "no candidate in the space"
            if not result.frontier:
                near = sorted(combos, key=lambda c: (c.violation(slo), c.chips))[:closest]
                result.closest = [c for c in _run([(sc, slo, sizing, c, workdir) for c in near], _exact_or_none,
                                                  workers) if c]
            result.predictions = predictions + len(exact) + len(result.closest)
            if colocated and result.confirmed is not None:
                result.disaggregated = _as_mixed(result.confirmed, dies)
                result.colocated = colocated_runs()
                result.verdict = verdict(result.colocated, result.disaggregated, slo, sizing.percentile)
    _PLAN_FILES.clear()
    return result


def _colocated_runs(sc: Scenario, slo: Slo, frontier: list[Candidate], workdir: str, percentile: str,
                    load: Traffic | None) -> list[Mixed]:
    """The co-located deployments of the frontier served (`planner.colocated.compare_deployments`)."""
    return compare_deployments(sc, slo, frontier, functools.partial(_plan_file, workdir=workdir), percentile=percentile,
                               requests=load.requests if load else Traffic.requests,
                               seed=load.seed if load else Traffic.seed)


@contextmanager
def _ahead(enabled: bool, fn, *args):
    """Yields a function returning fn(*args): started at once in a worker process when `enabled` (the caller works
    meanwhile; its result, or its exception, is taken when asked), else run when asked."""
    if not enabled:
        yield lambda: fn(*args)
        return
    with ProcessPoolExecutor(max_workers=1) as pool:
        yield pool.submit(fn, *args).result


def _as_mixed(served: Served, dies: int) -> Mixed:
    """The served disaggregated recommendation as a row beside the co-located deployments."""
    c = served.candidate
    return Mixed("disaggregated", f"{c.pools.describe()}: prefill {c.prefill.layout.describe()} + decode "
                                  f"{c.decode.layout.describe()}", round(c.chips * dies), c.chips, c.batch, served.ttft,
                 served.tpot, served.tokens_per_s_per_chip, c.pools.requests_per_s, served.error or
                 (f"{served.verdict(served.traffic.percentile)}" if served.misses else ""))


def commands(result: SearchResult, path: str | Path) -> list[str]:
    """The `npusim predict` command that reproduces the recommended plan's figures and the `npusim serve` command
    that confirms it under its load (`served_load`; same plan file, scheduler limits, load and seed)."""
    c, sc = result.recommended, result.scenario
    common = f"--hw {sc.hw} --model {sc.model} --plan {path} --input {sc.input} --output {sc.output}"
    tail = f" --quant {sc.quant or 'model'}" + "".join(f" --set {k}={v}" for k, v in sc.overrides)
    tail += f" --prefix-hit {sc.prefix_hit:g}" if sc.prefix_hit else ""
    limits = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in c.scheduler(sc).items())
    return [f"npusim predict {common} --batch {c.batch}{tail}",
            f"npusim serve {common} {served_load(result).args()} {limits} --slo {result.slo}{tail}"]


def served_rate(requests_per_s: float) -> float:
    """A pools' rate as the `npusim serve` command line carries it (four significant digits)."""
    return float(f"{requests_per_s:.4g}")


HOLDS_SERVED = 10  # the confirming run's arrivals span this many decode holds: its ramp-up costs ~1/20 of the rate
MAX_SERVED = 5000  # requests, at most (seconds of serving simulation)


def served_load(result: SearchResult, cand: Candidate | None = None) -> Traffic:
    """The load a plan (the recommended one by default) is served under: the search's, else Poisson arrivals at the
    rate its pools are sized for (a closed loop would start all its users at once, a burst the pools are not sized
    for), over `HOLDS_SERVED` times a request's decode (at least Traffic's 200 requests); either sized for a steady
    window (`Traffic.sized`)."""
    c = cand or result.recommended
    e2e = c.ttft + result.scenario.output * c.tpot
    if result.traffic is not None:
        return result.traffic.sized(e2e)
    rate = served_rate(c.pools.requests_per_s)
    hold = result.scenario.output * c.tpot
    return Traffic(rate=rate, requests=min(MAX_SERVED, max(Traffic.requests, math.ceil(HOLDS_SERVED * rate * hold))),
                   percentile=result.percentile).sized(e2e)


def write_plan(result: SearchResult, path: str | Path) -> Path:
    """The recommended deployment as a plan file, with the commands that reproduce its prediction (and confirm it
    under the load)."""
    c = result.recommended
    if c is None:
        raise NpusimError("no plan meets the SLO, so there is none to write", field="--out")
    sc = result.scenario
    description = (f"npusim plan: {sc.model} on {sc.hw}, {sc.input} in / {sc.output} out, "
                   f"TTFT {c.ttft * 1e3:.0f} ms <= {result.slo.ttft * 1e3:.0f} ms, "
                   f"TPOT {c.tpot * 1e3:.1f} ms <= {result.slo.tpot * 1e3:.1f} ms")
    v = result.confirmed
    if v is not None and not v.error:
        pct = v.traffic.percentile
        description += (f"; {c.pools.describe()} served under {v.traffic.describe()}: TTFT {pct} "
                        f"{v.ttft * 1e3:.0f} ms, TPOT {pct} {v.tpot * 1e3:.1f} ms, {v.tokens_per_s_per_chip:.1f} tok/s "
                        f"per chip (planned {c.served_tokens_per_s_per_chip:.1f})")
    doc = candidate_plan(c, description)
    path = Path(path)
    header = "# Written by npusim plan. Reproduce its prediction (and confirm it under the load) with:\n" + \
        "".join(f"#   {cmd}\n" for cmd in commands(result, path))
    try:
        path.write_text(header + yaml.safe_dump(doc, sort_keys=False))
    except OSError as exc:
        raise NpusimError(f"cannot write the plan file '{path}' ({exc.strerror})", field="--out") from None
    return path
