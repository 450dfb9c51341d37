"""Validation rows of the non-DeepSeek families (issue 34 item 5): every published.md §1b Qwen3 bench run (S09-S12,
SGLang on Atlas 800I A3) served by the request-level simulation as the bench ran it, beside the published mean TTFT,
TPOT and output throughput with the error of every row; and every §1c SGLang Ascend CI threshold (C01-C06) judged
as a bound: met / missed with the margin.

Run: python experiments/family_validation.py [--only S09,C03]   -> experiments/results/family_validation.{csv,md}
Sources: §1b rows: sgl-project/sglang docs/platforms/ascend_npu_best_practice.md (launch flags, bench arguments; the
plan files' headers list the flags they encode); §1c rows: sgl-project/sglang
test/registered/ascend/performance/<model>/test_*.py (MODEL_CONFIG launch args, bench arguments, thresholds).
Serving limits per serving rank (an attention-DP group): --max-running-requests / --dp-size; SGLang divides
--chunked-prefill-size by --dp-size under --enable-dp-attention (server_args), so the chunk a rank runs is the flag
over the DP size. Systems: Atlas 800 A3 nodes (8 cards each, RoCE between nodes), `--set chips=` the nodes' cards
(a run on fewer cards than a node, S12, takes one node and uses its plan's ranks). Reported, never fitted.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from npusim import api
from npusim.errors import NpusimError
from npusim.serving import ClosedLoop, Fixed, OpenLoop, Scheduler
from npusim.serving.predicted import ServedPlan, mtp_from_plan

OUT = Path(__file__).parent / "results"
HF = Path(__file__).resolve().parents[1] / "workloads" / "models" / "hf"
SYSTEM = "atlas-800-a3"
CODER, Q30B = str(HF / "Qwen3-Coder-480B-A35B" / "config.json"), str(HF / "Qwen3-30B-A3B" / "config.json")
GLM5, KIMI = str(HF / "GLM-5" / "config.json"), str(HF / "Kimi-K2-Instruct" / "config.json")
V4FLASH, R1 = "deepseek-v4-flash", "deepseek-v3.1"  # R1 has V3's (and V3.1's) architecture


@dataclass(frozen=True)
class Run:
    """One bench_serving run and the launch it measured (§1b: a log's means; §1c: the CI test's bounds, where
    `tpot` is a ceiling and `output_throughput` a floor, `ttft` a ceiling when the test asserts one)."""

    id: str
    what: str
    model: str
    plan: str
    quant: str
    chips: int  # Atlas 800I A3 cards of the system (whole nodes)
    running: int  # decode (co-located: the one instance) --max-running-requests / --dp-size
    prefill_running: int | None  # PD: the prefill instance's --max-running-requests / --dp-size
    budget: int  # --max-prefill-tokens
    chunk: int | None  # --chunked-prefill-size / --dp-size (None: -1, prompts run whole)
    concurrency: int  # --max-concurrency
    prompts: int  # --num-prompts
    input: int
    output: int
    rate: float | None  # request rate (None: inf, the bench sends as slots free)
    tpot: float  # s
    output_throughput: float  # tokens / s
    ttft: float | None = None  # s
    accept: float | None = None  # the log's accept length (tokens per decode step, the verified one included)
    bound: bool = False  # §1c: thresholds, not measurements
    note: str = ""
    prefill_delay: int = 0  # SGLANG_PREFILL_DELAYER_MAX_DELAY_PASSES with SGLANG_SCHEDULER_DECREASE_PREFILL_IDLE=1
    overrides: tuple[tuple[str, str], ...] = ()  # `--set` fields the row needs (each named in its note)


CODER_MIXED = dict(model=CODER, quant="w8a8", output=1500, input=3500)
RUNS = [
    # S09's bench command: --num-prompts 1152 --request-rate 20 (published.md gives concurrency and rate)
    Run("S09", "Qwen3-Coder-480B W8A8 PD mixed 16 cards, DP4 x TP8 + EP32, 3.5K+1.5K, rate 20",
        plan="qwen3coder-a3-sglang-mixed-dp4-tp8", chips=16, running=288 // 4, prefill_running=None, budget=458880,
        chunk=114688 // 4, concurrency=288, prompts=1152, rate=20.0, ttft=15.46624, tpot=0.05034,
        output_throughput=4637.95, **CODER_MIXED),
    # S10: published.md reads the log's rate 8 (the doc's command sets none); throughput from the table (the
    # log's two throughput lines are swapped): 187.5 per card x 8
    Run("S10", "Qwen3-Coder-480B W8A8 PD mixed 8 cards, DP4 x TP4 + EP16, 3.5K+1.5K, rate 8",
        plan="qwen3coder-a3-sglang-mixed-dp4-tp4", chips=8, running=80 // 4, prefill_running=None, budget=458880,
        chunk=28672 // 4, concurrency=80, prompts=320, rate=8.0, ttft=6.62714, tpot=0.04820,
        output_throughput=187.5 * 8, **CODER_MIXED),
    # S11: throughput from the table, 266.25 per card x 24
    Run("S11", "Qwen3-Coder-480B W8A8 PD 1P1D 24 cards, P DP2 x TP8, D DP4 x TP8 + EP32, 3.5K+1.5K, rate 8",
        plan="qwen3coder-a3-sglang-pd", chips=24, running=384 // 4, prefill_running=128 // 2, budget=262144,
        chunk=65536 // 2, concurrency=410, prompts=1640, rate=8.0, ttft=4.47095, tpot=0.04827,
        output_throughput=266.25 * 24, **CODER_MIXED),
    Run("S12", "Qwen3-30B-A3B W8A8 PD mixed 1 card, TP2, EAGLE-3 3 / 4, 3.5K+1.5K", Q30B,
        "qwen3-30b-a3-sglang-mixed-tp2-eagle3", "w8a8", 8, running=192, prefill_running=None, budget=32768,
        chunk=None, concurrency=156, prompts=624, input=3500, output=1500, rate=None, ttft=4.02019, tpot=0.04435,
        output_throughput=3166.03, accept=3.17),
    # §1c: CI thresholds (ceilings on TPOT / TTFT, a floor on output throughput); the accept length is the plan's
    # estimate (each plan's header). --max-running-requests / --dp-size rounds down as SGLang's DP controller does.
    Run("C01", "GLM-5.1 W4A8 PD mixed 16 cards, DP16 x TP2 + EP32, NEXTN 3 / 4, 3.5K+1.5K", GLM5,
        "glm5-a3-sglang-mixed-dp16-c01", "w4a8", 16, running=128 // 16, prefill_running=None, budget=280000,
        chunk=65536 // 16, concurrency=128, prompts=512, input=3500, output=1500, rate=None, tpot=0.050,
        output_throughput=1712, bound=True, note="GLM-5 config for GLM-5.1; acceptance estimated (plan header)"),
    Run("C02", "GLM-5.1 W4A8 PD 1P1D 32 cards, P PP8 x CP4, D DP32 + EP32, 128K+1K, one request", GLM5,
        "glm5-a3-sglang-pd-cp-c02", "w4a8", 32, running=32 // 32, prefill_running=16, budget=180000, chunk=8192,
        concurrency=1, prompts=1, input=131072, output=1024, rate=None, ttft=13.146, tpot=0.0564,
        output_throughput=14.45, bound=True,
        note="GLM-5 config for GLM-5.1; 78 layers over PP8 as SGLang's get_pp_indices cuts them (six stages of 10, "
             "two of 9), the pipeline paced by the 10-layer ones"),
    Run("C03", "Kimi-K2.6 W4A8 PD mixed 8 cards, DP16 + EP16, EAGLE-3 4 / 5, 3.5K+1.5K", KIMI,
        "kimi-k2-a3-sglang-mixed-dp16-eagle3-c03", "w4a8", 8, running=120 // 16, prefill_running=None,
        budget=16384, chunk=32768 // 16, concurrency=120, prompts=120, input=3500, output=1500, rate=None,
        tpot=0.050, output_throughput=3452, bound=True, prefill_delay=200,
        note="Kimi-K2-Instruct config for K2.6; acceptance estimated (plan header)"),
    Run("C04", "V4-Flash W8A8 PD mixed 8 cards, DP16 + EP16, MTP2, 8K+1K", V4FLASH,
        "v4flash-a3-sglang-mixed-dp16-c04", "w8a8", 8, running=160 // 16, prefill_running=None, budget=16384,
        chunk=None, concurrency=160, prompts=160, input=8000, output=1000, rate=None, tpot=0.050,
        output_throughput=1708, bound=True,
        note="--max-prefill-tokens unset: SGLang's default 16384; acceptance estimated (plan header)"),
    # C05 sends 12,800 prompts at 24/s: served for 4 x concurrency of them (the steady part; 12,800 would take
    # the simulation ~9 minutes a row)
    Run("C05", "R1 W8A8 PD 1P1D 24 cards, P DP4 x TP4, D DP32 + EP32, MTP2, 2K+2K, rate 24", R1,
        "r1-a3-sglang-pd-c05", "w8a8", 24, running=1088 // 32, prefill_running=20 // 4, budget=28680, chunk=None,
        concurrency=1088, prompts=4 * 1088, input=2048, output=2048, rate=24.0, tpot=0.046,
        output_throughput=21429, bound=True, note="4,352 of the 12,800 prompts; acceptance estimated"),
    Run("C06", "R1 W4A8 PD 1P1D 16 cards, P DP8 x TP2, D DP16 + EP16, MTP3, 2K+2K, rate 32", R1,
        "r1-a3-sglang-pd-w4a8-c06", "w4a8", 16, running=448 // 16, prefill_running=32 // 8, budget=10240,
        chunk=None, concurrency=448, prompts=4 * 448, input=2048, output=2048, rate=32.0, tpot=0.046,
        output_throughput=8112, bound=True, note="acceptance estimated (plan header)"),
]


def setup(run: Run) -> api.Setup:
    overrides = {"chips": str(run.chips)} | dict(run.overrides)
    if run.accept is not None:
        overrides["plan.mtp.acceptance"] = f"{run.accept - 1:.2f}"
    return api.load_setup(SYSTEM, run.model, run.plan, run.quant, overrides)


def reachable_budget(run: Run) -> int:
    """A PD prefill rank without chunking batches at most its running limit of whole prompts, so a
    --max-prefill-tokens above them never binds: it is passed as one token more than those prompts (SGLang's
    PrefillAdder turns away a prompt that would use up the budget left), as experiments/serving_validation.py does.
    The serving capacity reserves activations for the whole budget (predicted._free_hbm), which at C05's 28,680
    tokens would leave its prefill ranks no HBM for the cache."""
    if run.prefill_running is None or run.chunk is not None:
        return run.budget
    return min(run.budget, run.prefill_running * run.input + 1)


def served(run: Run) -> ServedPlan:
    """The run's deployment under SGLang's scheduler with its launch's limits, MTP acceptance from its log."""
    s = setup(run)
    limits = {"running": {"prefill": run.prefill_running, "decode": run.running}} if run.prefill_running else {}
    plan = ServedPlan.of(s, max_batch=run.running, token_budget=reachable_budget(run), chunked=run.chunk is not None,
                         chunk_size=run.chunk, scheduler=Scheduler("sglang", prefill_delay=run.prefill_delay),
                         **limits)
    deployment = dataclasses.replace(plan.deployment, mtp=mtp_from_plan(s.plan))
    return dataclasses.replace(plan, deployment=deployment)


def load(run: Run):
    """The bench's client: requests sent as slots free (rate inf), or Poisson arrivals at the rate capped by
    --max-concurrency (bench_serving's default burstiness 1)."""
    if run.rate is None:
        return ClosedLoop(run.concurrency, Fixed(run.input), Fixed(run.output))
    return OpenLoop(run.rate, Fixed(run.input), Fixed(run.output), max_concurrency=run.concurrency)


def _error(predicted: float, published: float) -> float:
    return 100 * (predicted / published - 1)


def serve(run: Run) -> dict:
    """One row: the run's load served by its plan, beside the published figures (a §1c row: met / missed with
    the margin, positive = inside the bound)."""
    row = {"id": run.id, "row": run.what, "kind": "bound" if run.bound else "measured", "note": run.note}
    start = time.perf_counter()
    try:
        plan = served(run)
        s = plan.run(load(run), seed=0, requests=run.prompts).summary
    except NpusimError as exc:
        return row | {"refused": str(exc)}
    got = {"ttft_ms": s.ttft.mean * 1e3, "tpot_ms": s.tpot.mean * 1e3, "output_tok_s": s.output_throughput}
    published = {"ttft_ms": run.ttft and run.ttft * 1e3, "tpot_ms": run.tpot * 1e3,
                 "output_tok_s": run.output_throughput}
    for name, value in got.items():
        row |= {f"published_{name}": published[name], name: value}
        if published[name] is None:
            continue
        if run.bound:  # ceilings for latencies, a floor for throughput; margin > 0 is inside the bound
            ceiling = name != "output_tok_s"
            margin = (published[name] / value - 1) if ceiling else (value / published[name] - 1)
            row |= {f"{name}_margin_%": 100 * margin}
        else:
            row |= {f"{name.rsplit('_', 1)[0]}_error_%": _error(value, published[name])}
    if run.bound:
        row["verdict"] = "met" if all(row.get(f"{n}_margin_%", 0) >= 0 for n in got) else "missed"
    return row | {"mean_batch": s.mean_batch, "preemptions": s.preemptions,
                  "seconds": round(time.perf_counter() - start, 1)}


FAMILIES = {CODER: "Qwen3-MoE (qwen3_moe, GQA)", Q30B: "Qwen3-MoE (qwen3_moe, GQA)", GLM5: "GLM-5 (glm_moe_dsa, DSA)",
            KIMI: "Kimi-K2 (kimi_k2, MLA)", V4FLASH: "DeepSeek-V4", R1: "DeepSeek-R1 (V3 architecture)"}


def frame(runs=RUNS) -> pd.DataFrame:
    return pd.DataFrame([{"family": FAMILIES[run.model]} | serve(run) for run in runs])


def markdown(table: pd.DataFrame) -> str:
    cols = [c for c in ("id", "row", "published_ttft_ms", "ttft_ms", "ttft_error_%", "ttft_ms_margin_%",
                        "published_tpot_ms", "tpot_ms", "tpot_error_%", "tpot_ms_margin_%", "published_output_tok_s",
                        "output_tok_s", "output_tok_error_%", "output_tok_s_margin_%", "verdict", "mean_batch",
                        "preemptions", "refused", "note") if c in table]
    return table[cols].to_markdown(index=False, floatfmt=".4g")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated row ids (default all)")
    parser.add_argument("--render", action="store_true", help="rewrite the .md from the .csv, serving nothing")
    args = parser.parse_args()
    if args.render:
        return write_md(pd.read_csv(OUT / "family_validation.csv"))
    runs = [r for r in RUNS if not args.only or r.id in args.only.split(",")]
    table = frame(runs)
    OUT.mkdir(exist_ok=True)
    print(markdown(table))
    if not args.only:
        table.to_csv(OUT / "family_validation.csv", index=False)
        write_md(table)


def write_md(table: pd.DataFrame) -> None:
    """One section per family, the columns its rows fill."""
    if "family" not in table:
        table.insert(0, "family", [FAMILIES[next(r.model for r in RUNS if r.id == i)] for i in table.id])
    sections = [f"## {family}\n\n{markdown(rows.dropna(axis=1, how='all'))}\n"
                for family, rows in table.groupby("family", sort=False)]
    (OUT / "family_validation.md").write_text(HEADER + "\n".join(sections) + NOTES)


HEADER = """# Family validation (issue 34 item 5)

Regenerate: `python experiments/family_validation.py` (a few minutes on one core). Sources and conventions: the
script's docstring; each deployment's flags: its plan file's header. §1b rows (S..) are measurements: `*_error_%` is
predicted / published - 1. §1c rows (C..) are CI thresholds: TPOT and TTFT ceilings, an output-throughput floor;
`*_margin_%` is how far inside the bound the prediction lands (negative: outside), `verdict` met when every bound
holds. Nothing here is fitted.

"""
NOTES = """
## Reading the rows

- The co-located rows (S09, S10, S12, C01, C03, C04) carry the prefills that interrupt decoding: SGLang runs a
  prefill batch alone, and under DP attention with EP every rank's step waits for the rank that prefills. Their TPOT
  is the served one, not a bare decode step.
- C05 serves 4 x --max-concurrency (4,352) of the CI's 12,800 prompts, the steady part of the run; C06 all 1,792.
- Accept lengths the sources do not print (C01-C06) are estimates stated in each plan's header; a §1c verdict moves
  with them.
- Configs: GLM-5.1 runs GLM-5's config.json, Kimi-K2.6 Kimi-K2-Instruct's (no public copy of either was found);
  C02's 78 layers run over PP8 as SGLang's get_pp_indices cuts them: six stages of 10 layers and two of 9, the
  pipeline paced by the 10-layer ones (spec.plan Instance.busiest_stage).
"""

if __name__ == "__main__":
    main()
