"""Co-located (PD-mixed) deployments beside the disaggregated search: which wins at the SLO, and by how much.

A co-located instance prefills and decodes on the same ranks (chunked prefill inside the decode batches, DP
attention + EP MoE), so a prompt's prefill steps stall the decodes running beside it: its TTFT and TPOT are not one
request's figures. They come from the request-level serving simulation (`npusim serve`): the instance serves a
closed loop of as many users as its batch, with its running limit per attention-DP rank and a token budget of one
prompt; TTFT and TPOT are read at the SLO's percentile. The disaggregated side is the recommendation served at the
rate its pools are sized for (`planner.pools`; Poisson arrivals), so both sides of the verdict are served output
tokens per second per chip at the SLO.

Candidates are the decode layouts of the disaggregated frontier (the layouts that decode best), co-located on
their own ranks and grown to the deployment's whole chip count, prefilling in chunks of `chunk` tokens per step:
SGLang's default `--chunked-prefill-size` on Ascend, which it sets from the NPU's memory (`sglang_chunk`). A
co-located TPOT cannot beat the same decode alone (prefills only add to a step), so each layout starts at the batch
its decode met TPOT with and serves fewer users until the served TTFT and TPOT meet the SLO: half as many, or at
once the concurrency the run's completed request rate sustains when a queue built up (Little's law), then bisects
twice between the users met and the fewest missed.
The one-request figures bound the served ones (prompts only add to a decode step, and a prompt served waits for, then
shares, steps with the decodes): one prompt prefilled alone on the idle instance (predict, in the same chunks) is
predicted first, and a layout whose prompt alone misses the TTFT limit is not served at all (a 128K prompt on one DP
group, without the prefill instance's context parallelism). Each served run carries both bounds, the prompt alone
and the decode step at its batch without prompts, beside its served TTFT and TPOT.
Limits: co-located layouts under closed loops only, which start all their users at once (a burst the disaggregated
side's Poisson arrivals do not have: a co-located layout may meet the SLO with more users than its figures show);
one seed; each serving run costs seconds (`npusim plan --no-colocated` skips them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from npusim import api
from npusim.errors import NpusimError
from npusim.planner.space import Layout, plan_document
from npusim.serving import ClosedLoop, Fixed, Slo
from npusim.serving.predicted import ServedPlan
from npusim.serving.steady import run_length
from npusim.spec.system import load_system

GiB = 2**30
# The model's stated error: the median |error| of the documented serving rows of experiments/results/validation.md
# ("25 documented rows: median |error| 5.9 %"; tests/test_planner.py fails when that line moves and this does not).
# A verdict whose winner meets the SLO by less than this says so and names the runner-up with its own margin.
MODEL_ERROR = 0.059


def sglang_chunk(hbm_capacity: float) -> int:
    """SGLang's default `--chunked-prefill-size` on an NPU of this HBM capacity (bytes per device = per die).

    sgl-project/sglang python/sglang/srt/hardware_backend/npu/utils.py `set_default_server_args` @ 019f01320e87
    (read 2026-12-02): <= 32 GiB (910B4) 4096, <= 64 GiB (910B1-B3, the 910C's dies 910_93xx) 8192. Above 64 GiB
    (the 950's 128 / 144 GiB) the NPU defaults leave it unset and server_args.py's GPU-memory rule applies, whose
    80-160 GiB rows (H100 / H200) give 8192 as well. An older server_args.py set 32768 for "Atlas A2 and Atlas A3";
    vLLM's own default token budget (`max_num_batched_tokens`, vllm/engine/arg_utils.py
    EngineArgs.get_batch_defaults: 2048 for `vllm serve` under 70 GiB, 8192 above) also counts the decodes' tokens,
    so it is not the same knob."""
    return 4096 if hbm_capacity <= 32 * GiB else 8192


@dataclass(frozen=True)
class Mixed:
    """A deployment served under a closed loop of `batch` users: its percentile TTFT / TPOT and served rate."""

    kind: str  # co-located | disaggregated
    describe: str
    ranks: int
    chips: float
    batch: int
    ttft: float = math.inf
    tpot: float = math.inf
    served_tokens_per_s_per_chip: float = 0.0
    requests_per_s: float = 0.0  # completed requests per second in the run
    error: str = ""
    # co-located: the one-request bounds of the served figures (predict) -- one prompt prefilled alone on the idle
    # instance, and the decode step at this batch without prompts
    alone_ttft: float = math.nan
    alone_tpot: float = math.nan

    def meets(self, slo: Slo) -> bool:
        return not self.error and self.ttft <= slo.ttft and self.tpot <= slo.tpot

    @property
    def served(self) -> bool:
        """Whether the serving run gave figures (a layout pruned by its prompt alone, or refused, has none)."""
        return not self.error or self.served_tokens_per_s_per_chip > 0

    def margin(self, slo: Slo) -> tuple[float, str]:
        """How far inside the SLO the served figures are, as a share of the tighter limit (negative: a miss), and
        that limit's figure against it."""
        ttft, tpot = 1 - self.ttft / slo.ttft, 1 - self.tpot / slo.tpot
        if ttft <= tpot:
            return ttft, f"TTFT {self.ttft * 1e3:.0f} ms against {slo.ttft * 1e3:g} ms"
        return tpot, f"TPOT {self.tpot * 1e3:.2f} ms against {slo.tpot * 1e3:g} ms"

    def row(self, percentile: str) -> dict:
        """One table row; a deployment not served has no served figures (NaN, JSON null), not zeros and infinities."""
        shown = (lambda v: v) if self.served else (lambda v: math.nan)
        return {"deployment": self.kind, "layout": self.describe, "chips": whole_chips(self.chips),
                "batch": self.batch, f"ttft_{percentile}_ms": shown(self.ttft * 1e3),
                f"tpot_{percentile}_ms": shown(self.tpot * 1e3),
                "served_tok_s_chip": shown(self.served_tokens_per_s_per_chip),
                "alone_ttft_ms": self.alone_ttft * 1e3, "alone_tpot_ms": self.alone_tpot * 1e3, "note": self.error}


def whole_chips(chips: float) -> int:
    """Chips a deployment occupies: a package partly used (an odd die count) is a package taken."""
    return math.ceil(chips - 1e-9)


def _serve(sc, doc: dict, plan_file, describe: str, batch: int, dp: int, slo: Slo, percentile: str,
           requests: int, seed: int, chunk: int, dies: int) -> Mixed:
    """The co-located plan served under a closed loop of `batch` users, `chunk` prompt tokens per step."""
    try:
        setup = api.load_setup(sc.hw, sc.model, plan_file(doc), sc.quant, dict(sc.overrides))
        ranks = setup.plan.ranks
        chips = ranks / setup.system.chip_spec.dies
        served = ServedPlan.of(setup, max_batch=math.ceil(batch / dp), token_budget=min(sc.input, chunk))
        load = ClosedLoop(batch, Fixed(sc.input), Fixed(sc.output), prefix_hit=sc.prefix_hit)
        summary = served.run(load, seed=seed, requests=max(requests, run_length(concurrency=batch)), slo=slo).summary
    except NpusimError as exc:
        ranks = sum(r["ranks"] for r in doc.values() if isinstance(r, dict) and "ranks" in r) or 0
        return Mixed("co-located", describe, ranks, ranks / dies, batch, error=exc.detail)
    return Mixed("co-located", describe, ranks, chips, batch, getattr(summary.steady_ttft, percentile),
                 getattr(summary.steady_tpot, percentile), summary.steady_output_throughput / chips,
                 summary.steady_request_throughput)


def colocated_doc(layout: Layout) -> dict:
    doc = plan_document(None, layout)
    doc["colocated"] = True
    return doc


def _prompt_alone(sc, lay: Layout, plan_file, chunk: int) -> tuple[float, str]:
    """One prompt prefilled alone on the idle co-located instance, in the chunks the served instance runs (predict):
    served TTFT can only be worse, so a layout whose prompt alone misses the TTFT limit is not served."""
    doc = colocated_doc(lay) | ({"prefill_chunk": chunk} if chunk < sc.input else {})
    try:
        return api.predict(sc.hw, sc.model, plan_file(doc), input=sc.input, output=sc.output, batch=lay.dp,
                           quant=sc.quant, prefix_hit=sc.prefix_hit, overrides=dict(sc.overrides)).ttft, ""
    except NpusimError as exc:
        return math.inf, exc.detail


def _decode_alone(sc, lay: Layout, batch: int, plan_file) -> float:
    """The same layout's decode step at `batch` without prompts beside it (predict of the decode-only plan)."""
    try:
        return api.predict(sc.hw, sc.model, plan_file(plan_document(None, lay)), input=1, batch=batch,
                           context=sc.input + sc.output // 2, output=sc.output, quant=sc.quant,
                           overrides=dict(sc.overrides)).tpot
    except NpusimError:
        return math.nan


def _walk(serve, batch: int, slo: Slo, output: int) -> list[Mixed]:
    """Serve at `batch` users, then fewer until the SLO is met: half, or at once the concurrency the run's completed
    request rate sustains within the SLO (Little's law: rate x (TTFT limit + output x TPOT)) when a queue built up."""
    tried = []
    while batch >= 1:  # fewer users than attention-DP ranks leave ranks idle, which may be what the SLO takes
        m = serve(batch)
        tried.append(m)
        if m.meets(slo) or m.error and "HBM" not in m.error:
            break
        fewer = batch // 2
        if m.requests_per_s and not m.error:
            fewer = max(1, min(fewer, int(m.requests_per_s * (slo.ttft + output * min(m.tpot, slo.tpot)))))
        batch = fewer if fewer < batch else 0
    met = [m for m in tried if m.meets(slo)]
    missed = [m.batch for m in tried if not m.meets(slo) and not m.error]
    if met and missed:  # the jump may undershoot: bisect between the users met and the fewest missed, twice
        lo, hi = met[-1].batch, min(b for b in missed if b > met[-1].batch)
        for _ in range(2):
            mid = (lo + hi) // 2
            if mid <= lo:
                break
            m = serve(mid)
            tried.append(m)
            lo, hi = (mid, hi) if m.meets(slo) else (lo, mid)
    return tried


def compare_deployments(sc, slo: Slo, frontier, plan_file, *, percentile: str = "p99", requests: int = 100,
                        seed: int = 0, layouts: int = 2, chunk: int | None = None) -> list[Mixed]:
    """The co-located candidates tried, in order. `chunk`: the co-located token budget per step (its chunked
    prefill; default: SGLang's on the system's NPU, `sglang_chunk`)."""
    system = load_system(sc.hw, api.split_overrides(dict(sc.overrides))["hw"])
    dies = system.chip_spec.dies
    if chunk is None:
        chunk = sglang_chunk(system.chip_spec.hbm.capacity)
    seen, starts = set(), []
    for cand in sorted(frontier, key=lambda c: -c.decode_tokens_per_s_per_chip):
        # o_proj is split over at least the attention-TP group: layouts differing below it are the same deployment
        lay = replace(cand.decode.layout, two_microbatch=False,
                      o_proj_tp=max(cand.decode.layout.o_proj_tp, cand.decode.layout.attention_tp))
        if lay.family in {f for f, _ in seen}:
            continue
        if len({f for f, _ in seen}) >= layouts:
            break
        total = int(round(cand.chips * lay.ranks / cand.decode.chips)) if cand.decode.chips else 0
        for ranks in dict.fromkeys((lay.ranks, total)):
            if ranks and ranks & (ranks - 1) == 0:
                seen.add((lay.family, ranks))
                grown = replace(lay, ranks=ranks)
                starts.append((grown, max(grown.dp, cand.decode.batch * ranks // lay.ranks)))
    tried = []
    for lay, batch in starts:
        doc = colocated_doc(lay)
        alone, why = _prompt_alone(sc, lay, plan_file, chunk)
        if alone > slo.ttft:  # the one-request bound prunes it before any serving run
            tried.append(Mixed("co-located", lay.describe(), lay.ranks, lay.ranks / dies, batch, alone_ttft=alone,
                               error=why or f"not served: one prompt alone takes {alone:.3g} s, above TTFT "
                                            f"{slo.ttft:g} s"))
            continue

        def serve(b, lay=lay, doc=doc, alone=alone):
            m = _serve(sc, doc, plan_file, lay.describe(), b, lay.dp, slo, percentile, requests, seed, chunk, dies)
            return replace(m, alone_ttft=alone, alone_tpot=_decode_alone(sc, lay, b, plan_file))

        tried += _walk(serve, batch, slo, sc.output)
    return tried


def verdict(tried: list[Mixed], disagg: Mixed | None, slo: Slo, percentile: str) -> str:
    """One sentence: which deployment serves more output tokens per chip at the SLO, and by how much."""
    best = max((m for m in tried if m.meets(slo)), key=lambda m: m.served_tokens_per_s_per_chip, default=None)
    pruned = [m for m in tried if m.error.startswith("not served")]
    alone = (f" (one prompt alone takes {min(m.alone_ttft for m in pruned):.3g} s at best)"
             if pruned and len(pruned) == len(tried) else "")
    if disagg is None:
        return "no disaggregated plan meets the SLO, so there is nothing to compare"
    if not disagg.meets(slo):
        why = disagg.error or f"TTFT {disagg.ttft * 1e3:.0f} ms, TPOT {disagg.tpot * 1e3:.1f} ms"
        tail = (f"; co-located {best.describe} meets it at {best.served_tokens_per_s_per_chip:.1f} tok/s per chip"
                if best else f"; no co-located candidate meets it either{alone}")
        return f"the disaggregated recommendation misses the SLO at {percentile} when served ({why})" + tail
    if best is None:
        why = alone or " when prefills share its steps"
        return (f"disaggregated wins: {disagg.served_tokens_per_s_per_chip:.1f} served tok/s per chip at the SLO "
                f"({percentile}); no co-located candidate tried meets TTFT {slo.ttft * 1e3:g} ms and TPOT "
                f"{slo.tpot * 1e3:g} ms{why}" + close_call(disagg, None, slo, percentile))
    a, b = disagg.served_tokens_per_s_per_chip, best.served_tokens_per_s_per_chip
    win, lose, (x, y) = (("disaggregated", "co-located", (a, b)) if a >= b else ("co-located", "disaggregated", (b, a)))
    winner, runner_up = (disagg, best) if a >= b else (best, disagg)
    return (f"{win} wins at the SLO ({percentile}): {x:.1f} vs {y:.1f} served output tok/s per chip "
            f"({100 * (x / y - 1):+.0f} % over {lose}; co-located best {best.describe} at batch {best.batch}, "
            f"{whole_chips(best.chips)} chips)" + close_call(winner, runner_up, slo, percentile))


def close_call(winner: Mixed, runner_up: Mixed | None, slo: Slo, percentile: str) -> str:
    """'' when the winner meets the SLO by at least the model's stated error (`MODEL_ERROR`); else a clause saying
    by how little, and the runner-up with its own margin (a hair's breadth either way could flip the verdict)."""
    share, figure = winner.margin(slo)
    if share >= MODEL_ERROR:
        return ""
    text = (f"; a close call: the winner meets the SLO by {100 * share:.1f} % ({figure} at {percentile}), less than "
            f"the model's {100 * MODEL_ERROR:.1f} % median error")
    if runner_up is None:
        return text + ", and no runner-up meets the SLO"
    other, why = runner_up.margin(slo)
    return (text + f"; runner-up {runner_up.kind} {runner_up.describe} at batch {runner_up.batch}: "
            f"{runner_up.served_tokens_per_s_per_chip:.1f} tok/s per chip, meeting the SLO by {100 * other:.1f} % "
            f"({why})")
