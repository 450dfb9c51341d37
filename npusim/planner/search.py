"""Capacity planning: the plans that meet a TTFT / TPOT SLO, their Pareto frontier, and the one to deploy.

Every number comes from `npusim.api.predict`; the search only decides which candidates to ask about. Three cheap
facts keep the number of predictions small:

- prefill and decode instances are independent under disaggregation (TTFT from the prefill layout, TPOT from the
  decode layout), so N prefill layouts x M decode layouts cost N + M predictions, not N x M;
- within a layout family, TTFT does not improve with fewer ranks, so the rank counts of a family are walked from
  the largest down and the walk stops at the first miss (or the first that does not fit in memory);
- TPOT and memory do not improve with a larger batch, so the largest batch that meets TPOT is found by bisection.

Configurations that do not divide the model or do not fit in HBM are refused by predict before any timing, so they
cost a millisecond. The frontier is then predicted again as complete disaggregated plans with the real scenario.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from itertools import groupby
from pathlib import Path

import numpy as np
import yaml

from npusim import api
from npusim.errors import NpusimError
from npusim.planner.space import Layout, SearchSpace, plan_document
from npusim.spec import units
from npusim.spec.system import load_system


@dataclass(frozen=True)
class Slo:
    ttft: float  # seconds
    tpot: float  # seconds per output token

    @classmethod
    def parse(cls, text: str) -> Slo:
        """'ttft=2s,tpot=30ms' -> Slo(2.0, 0.03)."""
        values = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in ("ttft", "tpot"):
                raise NpusimError(f"'{item}' must be ttft=TIME or tpot=TIME, e.g. ttft=2s,tpot=30ms", field="--slo")
            try:
                values[key.strip()] = units.parse(value.strip(), "time")
            except units.UnitError as exc:
                raise NpusimError(str(exc), field=f"--slo {key.strip()}") from None
        missing = {"ttft", "tpot"} - set(values)
        if missing:
            raise NpusimError(f"needs both ttft and tpot (missing {', '.join(sorted(missing))})", field="--slo")
        return cls(**values)


@dataclass(frozen=True)
class Scenario:
    """What is planned for: the model on the system at these lengths, with the user's --set overrides."""

    hw: str
    model: str
    input: int
    output: int
    quant: str | None = "bf16"
    overrides: tuple[tuple[str, str], ...] = ()

    @property
    def context(self) -> int:
        return self.input + self.output // 2


@dataclass(frozen=True)
class PhasePoint:
    """One prediction of one role: prefill (latency = TTFT of one prompt) or decode (latency = TPOT at `batch`)."""

    layout: Layout
    batch: int
    latency: float = float("inf")
    tokens_per_s_per_chip: float = 0.0
    chips: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def misfit(self) -> bool:
        """Refused for HBM (monotone: fewer ranks or a larger batch cannot fit either), not for a plan rule."""
        return "does not fit in HBM" in self.error


@dataclass(frozen=True)
class Candidate:
    """A deployment: one prefill instance and one decode instance, with their figures."""

    prefill: PhasePoint
    decode: PhasePoint
    ttft: float
    tpot: float
    chips: float
    decode_tokens_per_s_per_chip: float
    served_tokens_per_s_per_chip: float  # output tokens/s per chip with the prefill chips counted
    exact: bool = False  # True once predicted as a complete plan

    def violation(self, slo: Slo) -> float:
        """How far the worse of TTFT and TPOT is from its target (<= 1 meets the SLO)."""
        return max(self.ttft / slo.ttft, self.tpot / slo.tpot)

    def row(self) -> dict:
        return {"chips": self.chips, "prefill": self.prefill.layout.describe(),
                "decode": self.decode.layout.describe(), "batch": self.decode.batch,
                "ttft_ms": self.ttft * 1e3, "tpot_ms": self.tpot * 1e3,
                "decode_tok_s_chip": self.decode_tokens_per_s_per_chip,
                "served_tok_s_chip": self.served_tokens_per_s_per_chip}


def served_tokens_per_s_per_chip(input: int, output: int, prefill_tps_chip: float, decode_tps_chip: float) -> float:
    """Output tokens/s per chip of a deployment whose prefill and decode pools are sized to the same request rate:
    a request costs input / prefill rate + output / decode rate chip-seconds."""
    return output / (input / prefill_tps_chip + output / decode_tps_chip)


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


# ------------------------------------------------------------------------------------------------ evaluation

def _plan_file(doc: dict, workdir: str) -> str:
    text = yaml.safe_dump(doc, sort_keys=False)
    path = Path(workdir) / f"p{hashlib.sha1(text.encode()).hexdigest()[:16]}.yaml"
    if not path.exists():
        path.write_text(text)
    return str(path)


def _predict_role(sc: Scenario, layout: Layout, role: str, batch: int, workdir: str) -> PhasePoint:
    """Predict one role alone, the other phase reduced to one token so that neither its time nor its memory enters:
    prefill beside a decode instance of the same size at context 1; decode co-located with a one-token prompt."""
    doc = (plan_document(layout, replace(layout, cp=1)) if role == "prefill" else plan_document(None, layout))
    kwargs = ({"input": sc.input, "batch": 1, "context": 1} if role == "prefill"
              else {"input": 1, "batch": batch, "context": sc.context})
    try:
        p = api.predict(sc.hw, sc.model, _plan_file(doc, workdir), output=sc.output, quant=sc.quant,
                        overrides=dict(sc.overrides), **kwargs)
    except NpusimError as exc:
        return PhasePoint(layout, batch, error=exc.detail)
    if role == "prefill":
        return PhasePoint(layout, 1, p.ttft, p.prefill_tokens_per_s_per_chip, p.prefill_chips)
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


def _run(tasks, fn, workers: int):
    if workers <= 1:
        return [fn(*t) for t in tasks]
    # neighbouring tasks share kernels (the memo is per process), so each worker takes runs of them
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, *zip(*tasks), chunksize=max(1, len(tasks) // (4 * workers))))


# ------------------------------------------------------------------------------------------------ combining

def _combine(sc: Scenario, pre: PhasePoint, dec: PhasePoint) -> Candidate:
    return Candidate(pre, dec, pre.latency, dec.latency, pre.chips + dec.chips, dec.tokens_per_s_per_chip,
                     served_tokens_per_s_per_chip(sc.input, sc.output, pre.tokens_per_s_per_chip,
                                                  dec.tokens_per_s_per_chip))


def pareto(cands: list[Candidate]) -> list[Candidate]:
    """Candidates no other beats on served tokens/s per chip, TPOT and chips at once."""
    if not cands:
        return []
    m = np.array([(-c.served_tokens_per_s_per_chip, c.tpot, c.chips) for c in cands])
    keep = [i for i in range(len(m)) if not np.any(np.all(m <= m[i], axis=1) & np.any(m < m[i], axis=1))]
    return sorted((cands[i] for i in keep), key=lambda c: (c.chips, c.tpot))


def recommend(frontier: list[Candidate]) -> Candidate | None:
    """Most served tokens/s per chip (the cheapest tokens); fewer chips, then lower TPOT, break ties."""
    return min(frontier, key=lambda c: (-c.served_tokens_per_s_per_chip, c.chips, c.tpot), default=None)


def _exact(sc: Scenario, cand: Candidate, workdir: str) -> Candidate:
    """The candidate predicted as one complete disaggregated plan (TTFT then includes the KV transfer)."""
    p = api.predict(sc.hw, sc.model, _plan_file(plan_document(cand.prefill.layout, cand.decode.layout), workdir),
                    input=sc.input, output=sc.output, batch=cand.decode.batch, quant=sc.quant,
                    overrides=dict(sc.overrides))
    return replace(cand, ttft=p.ttft, tpot=p.tpot, chips=p.prefill_chips + p.decode_chips,
                   decode_tokens_per_s_per_chip=p.tokens_per_s_per_chip,
                   served_tokens_per_s_per_chip=served_tokens_per_s_per_chip(
                       sc.input, sc.output, p.prefill_tokens_per_s_per_chip, p.tokens_per_s_per_chip), exact=True)


def _exact_or_none(sc: Scenario, cand: Candidate, workdir: str) -> Candidate | None:
    try:
        return _exact(sc, cand, workdir)
    except NpusimError:  # e.g. the two instances together exceed the system
        return None


# ------------------------------------------------------------------------------------------------ the search

def _families(layouts: list[Layout]) -> list[list[Layout]]:
    key = lambda x: (x.family, x.ranks)  # noqa: E731
    return [list(g) for _, g in groupby(sorted(layouts, key=key), key=lambda x: x.family)]


def search(hw: str, model: str, *, input: int, output: int, slo: Slo, max_chips: float | None = None,
           quant: str | None = "bf16", overrides: dict[str, str] | None = None, space: SearchSpace | None = None,
           workers: int | None = None, prune: bool = True, closest: int = 5) -> SearchResult:
    """Search disaggregated plans for `model` on `hw`; see the module docstring for how."""
    sc = Scenario(hw, model, input, output, quant, tuple(sorted((overrides or {}).items())))
    system = load_system(hw, api.split_overrides(overrides)["hw"])
    dies = system.chip_spec.dies
    budget = system.ranks if max_chips is None else min(system.ranks, int(max_chips * dies))
    space = space or SearchSpace()
    room = budget - space.min_ranks  # the largest instance that leaves room for the other role
    space = replace(space, max_ranks=min(space.max_ranks, room) if space.max_ranks else room)
    workers = workers if workers is not None else min(2, os.cpu_count() or 1)
    if budget < 2 * space.min_ranks or not space.rank_counts:
        raise NpusimError(f"{budget} ranks cannot hold a prefill and a decode instance of {space.min_ranks} ranks "
                          "each", field="--max-chips")
    with tempfile.TemporaryDirectory(prefix="npusim-plan-") as workdir:
        pre_runs = _run([(sc, fam, slo, prune, workdir) for fam in _families(space.prefill_layouts())],
                        _walk_prefill_family, workers)
        decodes = space.decode_layouts()
        dec_runs = _run([(sc, fam, slo, space.batch_per_replica, prune, workdir) for fam in _families(decodes)],
                        _decode_family, workers)
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
        combos = [_combine(sc, p, d) for p in set(best_pre) for d in dec_points
                  if p.layout.ranks + d.layout.ranks <= budget]
        meeting = [c for c in combos if c.violation(slo) <= 1]
        result = SearchResult(sc, slo, n_cands, predictions, pruned)
        exact = [c for c in _run([(sc, c, workdir) for c in pareto(meeting)], _exact_or_none, workers) if c]
        result.frontier = pareto([c for c in exact if c.violation(slo) <= 1])
        result.recommended = recommend(result.frontier)
        if not combos:
            failed = [p for pts, _ in pre_runs + dec_runs for p in pts if not p.ok]
            worst = max(failed, key=lambda p: p.layout.ranks, default=None)
            result.refusal = f"{worst.layout.describe()}: {worst.error}" if worst else "no candidate in the space"
        if not result.frontier:
            near = sorted(combos, key=lambda c: (c.violation(slo), c.chips))[:closest]
            result.closest = [c for c in _run([(sc, c, workdir) for c in near], _exact_or_none, workers) if c]
        result.predictions = predictions + len(exact) + len(result.closest)
    return result


def write_plan(result: SearchResult, path: str | Path) -> Path:
    """The recommended deployment as a plan file, with the command that reproduces its prediction."""
    c = result.recommended
    if c is None:
        raise NpusimError("no plan meets the SLO, so there is none to write", field="--out")
    sc = result.scenario
    doc = plan_document(c.prefill.layout, c.decode.layout,
                        f"npusim plan: {sc.model} on {sc.hw}, {sc.input} in / {sc.output} out, "
                        f"TTFT {c.ttft * 1e3:.0f} ms <= {result.slo.ttft * 1e3:.0f} ms, "
                        f"TPOT {c.tpot * 1e3:.1f} ms <= {result.slo.tpot * 1e3:.1f} ms")
    path = Path(path)
    sets = "".join(f" --set {k}={v}" for k, v in sc.overrides)
    header = (f"# Written by npusim plan. Reproduce its prediction with:\n#   npusim predict --hw {sc.hw} "
              f"--model {sc.model} --plan {path} --input {sc.input} --output {sc.output} --batch {c.decode.batch}"
              f" --quant {sc.quant or 'model'}{sets}\n")
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False))
    return path
