"""Out-of-sample serving rows: every SGLang bench_serving log of DeepSeek on Atlas 800I A3 the project has
(published.md §1b S01-S08, PD disaggregated, and the two co-located "PD mixed" R1 W4A8 runs), served by the
request-level simulation with every step timed by the engine, under SGLang's scheduler as launched, and each row's
mean TTFT split into the terms of the request's path.

Run: python experiments/serving_validation.py   -> experiments/results/serving_validation.{csv,md}
Source of every row: sgl-project/sglang docs/platforms/ascend_npu_best_practice.md, the version with the TPOT /
Output TPS table and a bench_serving log per run (launch flags, bench arguments, and from the log: request rate,
--max-concurrency, prompts, lengths, accept length, mean / median TTFT, mean TPOT, output throughput). The
deployments are the plan files named (their headers list the flags they encode); the serving limits are the launch
flags: --max-running-requests / --dp-size per rank of each instance, --max-prefill-tokens, --chunked-prefill-size.
Systems: Atlas 800 A3 nodes (8 cards each, RoCE between nodes), `--set chips=` the run's card count. Reported,
never fitted.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from npusim import api
from npusim.serving import ClosedLoop, Fixed, OpenLoop, Scheduler
from npusim.serving.predicted import ServedPlan, mtp_from_plan

OUT = Path(__file__).parent / "results"
SYSTEM = "atlas-800-a3"
R1, V32 = "deepseek-v3.1", "deepseek-v3.2-exp"  # R1 has V3's (and V3.1's) architecture


@dataclass(frozen=True)
class Run:
    """One bench_serving log and the launch it measured. Limits are per serving rank (an attention-DP group)."""

    id: str  # published.md §1b id (M1, M2: the co-located runs, reported before §1b)
    what: str
    model: str
    plan: str
    quant: str
    chips: int  # Atlas 800I A3 cards of the whole deployment
    accept: float  # the log's accept length: tokens per decode step, the verified one included
    running: int  # decode (co-located: the one instance) --max-running-requests / --dp-size
    prefill_running: int | None  # PD: the prefill instance's --max-running-requests / --dp-size
    budget: int  # --max-prefill-tokens
    chunked: bool  # --chunked-prefill-size not -1 (the chunk is then the budget)
    concurrency: int  # --max-concurrency
    prompts: int  # --num-prompts
    input: int
    output: int
    rate: float | None  # the log's "Traffic request rate" (None: inf, the bench sends as slots free)
    ttft: float  # published mean, s
    ttft_median: float
    ttft_p99: float
    tpot: float  # published mean, s
    output_throughput: float  # published, tokens / s
    schedulers: tuple[str, ...] = ("sglang",)


DELAY = 30  # SGLANG_SCHEDULER_DECREASE_PREFILL_IDLE=1 (the mixed runs); SGLANG_PREFILL_DELAYER_MAX_DELAY_PASSES default
SCHEDULERS = {f"sglang, prefill delay {DELAY}": Scheduler("sglang", prefill_delay=DELAY), "sglang": Scheduler("sglang"),
              "vllm": Scheduler("vllm")}
MIXED = (f"sglang, prefill delay {DELAY}", "sglang", "vllm")
LOW_LATENCY = dict(model=R1, plan="r1-a3-sglang-pd-tp2", quant="w8a8", chips=32, running=32 // 16,
                   prefill_running=4 // 2, budget=28680, chunked=False, concurrency=32, prompts=32, rate=None)
W4A8_PD = dict(model=R1, plan="r1-a3-sglang-pd-w4a8", quant="w4a8", chips=16, running=384 // 16,
               prefill_running=8 // 2, budget=28680, rate=8.0)
RUNS = [
    Run("S01", "R1 W8A8 PD 2P1D 32 cards, P 2 x DP2xTP8, D DP32, MTP2, 3.5K+1.5K", R1, "r1-a3-sglang-pd-dp32", "w8a8",
        32, 2.55, 832 // 32, 8 // 2, 28680, False, 832, 3328, 3500, 1500, None, 10.17034, 8.27399, 29.78793, 0.04810,
        12697.49),
    Run("S02", "R1 W8A8 PD 2P1D 32 cards, D DP16xTP2, MTP3, 6K+1.6K", input=6000, output=1600, accept=2.59,
        ttft=5.14934, ttft_median=5.14699, ttft_p99=9.01593, tpot=0.01981, output_throughput=1181.31, **LOW_LATENCY),
    Run("S03", "R1 W8A8 PD 2P1D 32 cards, D DP16xTP2, MTP3, 3.9K+1K", input=3900, output=1000, accept=2.88,
        ttft=2.90177, ttft_median=2.35779, ttft_p99=4.24004, tpot=0.01977, output_throughput=1148.03, **LOW_LATENCY),
    Run("S04", "R1 W8A8 PD 2P1D 32 cards, D DP16xTP2, MTP3, 3.5K+1.5K", input=3500, output=1500, accept=2.84,
        ttft=2.67191, ttft_median=2.20848, ttft_p99=3.96099, tpot=0.01992, output_throughput=1183.35, **LOW_LATENCY),
    Run("S05", "R1 W8A8 PD 2P1D 32 cards, D DP16xTP2, MTP3, 3.5K+1K", input=3500, output=1000, accept=2.84,
        ttft=2.65544, ttft_median=2.20510, ttft_p99=4.44679, tpot=0.01952, output_throughput=1163.59, **LOW_LATENCY),
    Run("S06", "R1 W4A8 PD 1P1D 16 cards, P DP2xTP8, D DP16, MTP3, 2K+2K, rate 8", chunked=True, concurrency=400,
        prompts=3200, input=2048, output=2048, accept=2.86, ttft=5.13854, ttft_median=3.35693, ttft_p99=20.22325,
        tpot=0.04776, output_throughput=7235.64, **W4A8_PD),
    # S07: the bench command sets no --request-rate; its log says "Traffic request rate: 8.0" (what ran)
    Run("S07", "R1 W4A8 PD 1P1D 16 cards, P DP2xTP8, D DP16, MTP3, 3.5K+1.5K, rate 8", chunked=False, concurrency=384,
        prompts=1536, input=3500, output=1500, accept=2.87, ttft=9.78406, ttft_median=6.54210, ttft_p99=31.48726,
        tpot=0.04942, output_throughput=5784.88, **W4A8_PD),
    # S08's log generated 196,608 tokens for 64 prompts: 3,072 each (the doc's 64K-3K; its command says 1000), and
    # (E2E - TTFT) / TPOT = (117.18 - 39.31) / 0.02552 = 3,051 tokens agrees
    Run("S08", "V3.2 W8A8 PD 1P1D 32 cards, P CP32, D DP8xTP4, MTP3, 64K+3K, rate 0.25", V32, "v32-a3-sglang-pd-tp4",
        "w8a8-modelslim", 32, 3.18, 32 // 8, 1, 68000, False, 32, 64, 64000, 3072, 0.25, 39.31310, 19.19887, 153.47805,
        0.02552, 471.68),
    Run("M1", "R1 W4A8 PD mixed 8 cards, DP4 x TP4, MTP3, 3.5K+1.5K", R1, "r1-a3-sglang-mixed-tp4", "w4a8", 8, 2.83,
        144 // 4, None, 9000, False, 144, 576, 3500, 1500, None, 6.78893, 3.91121, 26.89802, 0.04977, 2496.62, MIXED),
    Run("M2", "R1 W4A8 PD mixed 8 cards, DP16, MTP3, 2K+2K", R1, "r1-a3-sglang-mixed-dp16", "w4a8", 8, 2.82,
        256 // 16, None, 1500, False, 256, 1024, 2048, 2048, None, 10.27392, 8.59203, 28.53507, 0.04967, 4227.20,
        MIXED),
]

# (term, from, to) over the request table's columns, in the order the request passes them: SGLang PD preallocates
# on the decode rank before the prefill; vLLM PD after it; a co-located instance streams the token at the prefill's end
FLOWS = {"sglang-pd": (("prealloc", "arrival", "decode_admitted"), ("queue", "decode_admitted", "scheduled"),
                       ("prefill", "scheduled", "prefill_end"), ("transfer", "prefill_end", "kv_ready"),
                       ("first_step", "kv_ready", "first_token")),
         "vllm-pd": (("queue", "arrival", "scheduled"), ("prefill", "scheduled", "prefill_end"),
                     ("prealloc", "prefill_end", "decode_admitted"), ("transfer", "decode_admitted", "kv_ready"),
                     ("first_step", "kv_ready", "first_token")),
         "mixed": (("queue", "arrival", "scheduled"), ("prefill", "scheduled", "prefill_end"),
                   ("first_step", "prefill_end", "first_token"))}
TERMS = ("prealloc", "queue", "prefill", "transfer", "first_step")


def setup(run: Run) -> api.Setup:
    return api.load_setup(SYSTEM, run.model, run.plan, run.quant,
                          {"chips": str(run.chips), "plan.mtp.acceptance": f"{run.accept - 1:.2f}"})


@functools.cache
def _served(model: str, plan: str, quant: str, chips: int, running: int, prefill_running: int | None, budget: int,
            chunked: bool) -> ServedPlan:
    """The deployment's memoised step grids (shared by the rows that differ only in load, acceptance or scheduler)."""
    s = api.load_setup(SYSTEM, model, plan, quant, {"chips": str(chips)})
    limits = {"running": {"prefill": prefill_running, "decode": running}} if prefill_running else {}
    return ServedPlan.of(s, max_batch=running, token_budget=budget, chunked=chunked, **limits)


def reachable_budget(run: Run) -> int:
    """A prefill budget that binds where the run's did and nowhere else: a PD prefill rank batches at most its
    running limit of prompts, so a --max-prefill-tokens above that never binds; it is passed as one token more than
    those prompts (SGLang's PrefillAdder turns a prompt away that would use up the budget left, `Rank.chunk`). The
    serving capacity reserves activations for a full budget (predicted._free_hbm), which at S02-S05's 28,680 tokens
    leaves a prefill rank no HBM for the cache."""
    if run.prefill_running is None:
        return run.budget
    return min(run.budget, run.prefill_running * run.input + 1)


def served(run: Run, scheduler: str) -> ServedPlan:
    """The run's ServedPlan under SCHEDULERS[scheduler], MTP acceptance from its log."""
    base = _served(run.model, run.plan, run.quant, run.chips, run.running, run.prefill_running,
                   reachable_budget(run), run.chunked)
    deployment = dataclasses.replace(base.deployment, mtp=mtp_from_plan(setup(run).plan),
                                     scheduler=SCHEDULERS[scheduler])
    return dataclasses.replace(base, deployment=deployment)


def load(run: Run):
    """The bench's client: requests sent as slots free (rate inf), or Poisson arrivals at the rate capped by
    --max-concurrency (bench_serving's default burstiness 1)."""
    if run.rate is None:
        return ClosedLoop(run.concurrency, Fixed(run.input), Fixed(run.output))
    return OpenLoop(run.rate, Fixed(run.input), Fixed(run.output), max_concurrency=run.concurrency)


def flow(plan: ServedPlan) -> str:
    if not plan.deployment.disaggregated:
        return "mixed"
    return "sglang-pd" if plan.deployment.scheduler.policy == "sglang" else "vllm-pd"


def terms(requests: pd.DataFrame, name: str) -> dict[str, float]:
    """Mean seconds of each term of TTFT over the requests that got a first token; the terms telescope, so their
    sum is the mean TTFT of the same requests. A term the flow does not pass is 0."""
    r = requests[requests.first_token.notna()]
    out = dict.fromkeys(TERMS, 0.0)
    for term, start, end in FLOWS[name]:
        out[term] = float((r[end] - r[start]).mean())
    return out


def serve(run: Run, scheduler: str) -> dict:
    """One row: the run's load served by its plan under `scheduler`, beside the published figures, TTFT by term."""
    plan = served(run, scheduler)
    result = plan.run(load(run), seed=0, requests=run.prompts)
    s = result.summary
    row = {"id": run.id, "row": run.what, "scheduler": scheduler}
    for name, published, predicted, scale in (("ttft_ms", run.ttft, s.ttft.mean, 1e3),
                                               ("ttft_p50_ms", run.ttft_median, s.ttft.p50, 1e3),
                                               ("ttft_p99_ms", run.ttft_p99, s.ttft.p99, 1e3),
                                               ("tpot_ms", run.tpot, s.tpot.mean, 1e3),
                                               ("output_tok_s", run.output_throughput, s.output_throughput, 1.0)):
        row |= {f"published_{name}": published * scale, name: predicted * scale,
                f"{name.rsplit('_', 1)[0]}_error_%": 100 * (predicted / published - 1)}
    row |= {f"{term}_ms": 1e3 * value for term, value in terms(result.requests, flow(plan)).items()}
    return row | {"mean_batch": s.mean_batch, "preemptions": s.preemptions}


def frame(runs=RUNS) -> pd.DataFrame:
    return pd.DataFrame([serve(run, sched) for run in runs for sched in run.schedulers])


def as_run(row: pd.Series) -> bool:
    """The rows to judge: each run under the scheduler it was launched with (the mixed runs set the delayer)."""
    return row.scheduler == (MIXED[0] if row.id.startswith("M") else "sglang")


def medians(table: pd.DataFrame) -> str:
    judged = table[table.apply(as_run, axis=1)]
    return ", ".join(f"{name} {judged[f'{name}_error_%'].abs().median():.1f} %"
                     for name in ("ttft", "tpot", "output_tok"))


def by_term(table: pd.DataFrame) -> pd.DataFrame:
    """The rows as run, published and predicted mean TTFT beside its terms (ms) and the TPOT error."""
    judged = table[table.apply(as_run, axis=1)]
    columns = ["id", "published_ttft_ms", "ttft_ms", "ttft_error_%", *[f"{t}_ms" for t in TERMS], "tpot_error_%"]
    return judged[columns].round(1)


NOTES = """What the rows say (read with the table; nothing here is fitted):

- Terms (means over requests, ms): prealloc = decode_admitted - arrival (SGLang PD: the decode rank reserves the
  cache before the prefill starts), queue = scheduled - decode_admitted (co-located: - arrival), prefill =
  prefill_end - scheduled, transfer = kv_ready - prefill_end (the last chunk's cache through the prefill rank's egress
  and the decode rank's ingress), first_step = first_token - kv_ready (the wait for the decode batch's next step
  boundary; co-located 0: the token streams at the prefill's end). They add up to the mean TTFT. The rows to judge
  are each run under the scheduler it was launched with: "sglang" for S01-S08, "sglang, prefill delay 30" for the
  mixed runs (both set SGLANG_SCHEDULER_DECREASE_PREFILL_IDLE=1).
- Transfer (10-40 ms; 0.3 s for S08's 64K cache over RoCE) and first_step (one decode step) are small everywhere:
  no row's gap is in them (though in S01 and S07 caches still being sent hold prefill slots). The gap is in the
  prefill and in the queue or prealloc wait that follows from it.
- S02-S05 (32 users at once on 2 prefill instances x 2 DP ranks x 2 running): TTFT about -57 to -63 %, P99 -50 to
  -63 %. A rank's slots stay held while their caches are sent (SGLang's inflight queue), so after a first wave of
  two the simulated ranks run mostly one prompt at a time (prefill ~0.3 s at 3.5K, queue ~0.8 s). The logs' mean and
  P99 fit 8 waves of one prompt (mean 4.5, P99 8 prefills: S02 1.14 / 1.13 s at 6K, S04 0.59 / 0.50 s at 3.5K): a
  real single-prompt prefill takes about 2x the predicted one (~0.25 s at 3.5K). TPOT within 5-16 %.
- S08 (V3.2 64K, one prompt at a time on the CP32 prefill, 0.25/s): TTFT -89 %, P99 -95 %. Predicted 2.5 s per 64K
  prefill keeps the prefill 63 % busy (queue 1.4 s). The log's P99 of 153 s with its last arrival at ~256 s says
  the real queue grew all run: 64 prefills in ~256 + 153 s, about 6 s each, ~2.5x the prediction.
- S07 (rate 8, clients capped at 384 = the decode's 384 slots): TTFT -62 %, carried by the prefill queue (~3.1 s):
  the one DP2 x TP8 prefill instance, its slots held while caches are sent, is the bottleneck in the simulation as
  in the log (the log's 3.86 requests/s completed, ~38 requests inside their TTFT by Little's law): the real
  prefill is slower still, as in S02-S05. Since a1f4831 the decode's pre-allocation slots (SGLang's pre_alloc_size,
  2 x a limit <= 32) let requests prefill while they wait for a running slot, which shortened the queue (-48 % before).
- S06 (rate 8, clients capped at 400 > 384 decode slots): TTFT -44 %, P99 +0.4 %. The wait for a running slot
  (~2.6 s, now in first_step: the cache has landed in a pre-allocation slot, the request waits to join the batch)
  carries TTFT: 16 requests beyond the decode's slots wait for one, a wait inverse to the decode throughput, which is
  predicted ~39 % high (TPOT -28 %: the W4A8 decode step predicted fast, issue 28 item 3).
- S01 (832 users, 2P1D, decode DP32): TTFT +5 %, median +6 %, P99 +44 %: right on the mean for the wrong reasons.
  The queue (~10 s) carries it: the simulated prefill ranks mostly run 2 of their 4 slots (the others hold caches
  still being sent, one after another through the rank's egress), 84 % busy, and the opening burst of 832 drains in
  ~45 s against the log's P99 of 29.8 s; meanwhile the decode is fast (TPOT -26 %, output +41 %), so more requests
  come back to the prefill than in the run.
- M1, M2 (PD mixed, DP attention, delayer): TTFT -49 to -54 %, the queue behind the decodes carries it (2.4 / 4.6 s);
  TPOT -29 %, the W4A8 decode step predicted fast.
- TPOT: the W4A8 rows (S06, S07, M1, M2) -26 to -29 %, V3.2 (S08) -27 %, S01 (W8A8 DP32, 26 per rank) -26 %, the
  W8A8 DP16 x TP2 rows at 2 per rank -5 to -16 %. Output throughput +24 to +47 %: the decode step predicted fast
  and, in the closed loops, the short TTFT.
"""


def main() -> None:
    started = time.perf_counter()
    table = frame()
    OUT.mkdir(exist_ok=True)
    table.round(2).to_csv(OUT / "serving_validation.csv", index=False)
    ids = ", ".join(dict.fromkeys(table.id))
    text = ("# Serving validation, out of sample: SGLang bench_serving logs of DeepSeek on A3\n\n"
            f"Every log the project has ({ids}): mean TTFT, TPOT and output throughput of the published run beside "
            "npusim's serving simulation of the same client (--max-concurrency, prompt count, lengths, request rate) "
            "on the same deployment and serving limits, under SGLang's scheduler as launched (the mixed runs also "
            "under plain sglang and vLLM's, for contrast); TTFT split into terms. Source: " + " ".join(
                __doc__.split("Source of every row: ")[1].split(". The")[0].split()) +
            f". Median |error| of the rows as run: {medians(table)}. Regenerated in "
            f"{time.perf_counter() - started:.0f} s.\n\n## TTFT by term, the rows as run (ms)\n\n" +
            by_term(table).to_markdown(index=False) + "\n\n## Every row\n\n" + table.round(2).to_markdown(index=False)
            + "\n\n" + NOTES)
    (OUT / "serving_validation.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
