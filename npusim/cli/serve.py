"""`npusim serve`: a deployment under load (request rate, concurrency or trace), every step timed by the engine.

One run prints the latency percentiles, throughput, goodput and SLO attainment; `--rates` sweeps the offered rate and
finds the knee where TTFT p99 leaves the SLO. The serving package does the work; this module only parses and prints.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from npusim.cli import common
from npusim.cli.defaults import MAX_BATCH, SCENARIO, SCHEDULERS, TOKEN_BUDGET
from npusim.errors import NpusimError, as_written
from npusim.spec import units

if TYPE_CHECKING:  # pandas and the serving package load where used, so that every --help stays light
    from npusim.serving import Slo
    from npusim.serving.load import Load
    from npusim.serving.predicted import ServedPlan
    from npusim.serving.result import Summary

DEFAULT_INPUT, DEFAULT_OUTPUT = "8192", "1024"


def register(sub) -> None:
    p = sub.add_parser("serve", help="TTFT / TPOT percentiles, throughput and goodput of a deployment under load "
                                     "(default: DeepSeek-V3.2-Exp on CloudMatrix384, plans of A17)")
    d = SCENARIO
    p.add_argument("--hw", default=d["hw"], help=f"system (default {d['hw']})")
    p.add_argument("--model", default=d["model"], help=f"model name or HF config.json (default {d['model']})")
    p.add_argument("--plan", default=d["plan"], help=f"plan name or YAML (default {d['plan']})")
    p.add_argument("--launch", default=None, metavar="FILE",
                   help="an SGLang or vLLM-Ascend launch script: its deployment is the plan and quantisation served "
                        "(--plan is ignored; --quant, when given, wins) and its framework the --scheduler")
    p.add_argument("--quant", default=d["quant"], help=f"quantisation preset (default {d['quant']}; 'model' = the "
                                                       "checkpoint's own format)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate", type=common.finite, help="open loop: requests/s (Poisson; see --cv)")
    load.add_argument("--rates", help="rate sweep R1,R2,...: one run per rate, and the SLO knee")
    load.add_argument("--trace", metavar="FILE", help="replay a CSV / JSONL trace (arrival, input, output[, prefix_hit])")
    p.add_argument("--concurrency", type=int, help="alone: closed loop, users each waiting for their last request; "
                                                   "with --rate / --rates: at most this many requests in flight, as "
                                                   "bench clients' --max-concurrency beside --request-rate")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--requests", type=int, help="requests to serve (default: enough for a steady window, from the "
                                                   "rate and a pilot run's end-to-end latency; a trace: all)")
    stop.add_argument("--duration", type=common.finite, help="seconds of simulated time to observe instead")
    p.add_argument("--input", help=f"prompt tokens: N, uniform:LOW:HIGH or lognormal:MEDIAN:SIGMA[:MAX] "
                                   f"(default {DEFAULT_INPUT})")
    p.add_argument("--output", help=f"output tokens, same forms (default {DEFAULT_OUTPUT})")
    p.add_argument("--prefix-hit", type=common.finite, default=0.0, help="fraction of every prompt in the prefix cache")
    p.add_argument("--cv", type=common.finite, default=1.0, help="coefficient of variation of inter-arrival gaps "
                                                         "(1 = Poisson, above 1 bursty)")
    p.add_argument("--scheduler", choices=SCHEDULERS, default="vllm",
                   help="step semantics of the framework: vllm (the token budget, max_num_batched_tokens, counts "
                        "decode tokens; prompts share steps with the decodes) or sglang (the budget, "
                        "max_prefill_tokens, counts prompt tokens only; prefill batches run alone); default vllm")
    p.add_argument("--mixed-chunk", action="store_true",
                   help="sglang: decodes ride along in prefill batches (SGLang --enable-mixed-chunk)")
    p.add_argument("--kv-connector", choices=("pull", "layerwise"), default="pull",
                   help="vllm, disaggregated: how the cache reaches the decode rank: pull (vLLM-Ascend's "
                        "MooncakeConnector, after the prefill) or layerwise (MooncakeLayerwiseConnector, each layer as "
                        "the prefill writes it); SGLang's backends always preallocate and send per chunk")
    p.add_argument("--prefill-delay", type=int, default=0, metavar="PASSES",
                   help="sglang, co-located DP ranks: hold a prompt up to PASSES steps while other ranks cannot "
                        "prefill (SGLang's PrefillDelayer: SGLANG_SCHEDULER_DECREASE_PREFILL_IDLE=1, "
                        "SGLANG_PREFILL_DELAYER_MAX_DELAY_PASSES, 30 by default there); default 0, off")
    p.add_argument("--max-batch", type=int, default=MAX_BATCH,
                   help=f"running sequences per rank (vLLM max_num_seqs, SGLang max_running_requests / dp; "
                        f"default {MAX_BATCH})")
    p.add_argument("--prefill-max-batch", type=int, help="running limit per rank of the prefill instances of a "
                                                          "disaggregated plan (default --max-batch)")
    p.add_argument("--decode-max-batch", type=int, help="running limit per rank of the decode instances of a "
                                                         "disaggregated plan (default --max-batch)")
    p.add_argument("--token-budget", type=int, default=TOKEN_BUDGET,
                   help=f"prompt (vllm: and decode) tokens per rank and step (default {TOKEN_BUDGET})")
    p.add_argument("--no-chunking", action="store_true", help="prefill long prompts whole instead of in budget chunks "
                                                              "(SGLang --chunked-prefill-size -1)")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="prompt tokens per chunk and step when chunking, apart from the budget (SGLang "
                        "--chunked-prefill-size beside --max-prefill-tokens; default the token budget)")
    p.add_argument("--slo", help="latency limits, e.g. ttft=2s,tpot=30ms")
    p.add_argument("--seed", type=common.seed, default=0, help="random seed of arrivals, lengths and MTP draws (default 0)")
    p.add_argument("--figures", metavar="DIR", help="write figures (latency CDFs and timeline, or the rate sweep)")
    common.add_speculative(p)
    common.add_set(p)
    common.add_format(p)
    p.set_defaults(run=run)


# the serving layer's names of what these options set: its refusals are named as the user wrote them
OPTION_OF = {"rate": "--rate", "cv": "--cv", "prefix_hit": "--prefix-hit", "concurrency": "--concurrency",
             "max_concurrency": "--concurrency", "requests": "--requests", "duration": "--duration"}


def run(args) -> None:
    try:
        _run(args)
    except NpusimError as exc:
        raise as_written(exc, {name: {"field": option} for name, option in OPTION_OF.items()}) from None


def _run(args) -> None:
    from npusim import api
    from npusim.serving import Scheduler, Slo
    from npusim.serving.predicted import ServedPlan

    slo = Slo.parse(args.slo) if args.slo else None
    if not (args.rate or args.rates or args.trace or args.concurrency is not None):
        raise NpusimError("give a load: --rate, --rates, --concurrency or --trace", field="--rate")
    if args.trace and (args.input or args.output):
        raise NpusimError("a trace gives every request's lengths: drop --input / --output", field="--trace")
    if args.trace and args.concurrency is not None:
        raise NpusimError("a trace replays its own arrivals: drop --concurrency", field="--concurrency")
    if args.launch:
        from npusim.cli.predict import from_launch
        from_launch(args)
    requests = args.requests  # None: the steady rule's, per rate (`serve_one`)
    rates = parse_rates(args.rates) if args.rates else [args.rate]
    loads = [make_load(args, rate) for rate in rates]  # refuse a bad load before any engine work
    setup = api.load_setup(args.hw, args.model, args.plan, None if args.quant == "model" else args.quant,
                           common.parse_overrides(args.overrides, args))
    running = {role: n for role, n in (("prefill", args.prefill_max_batch), ("decode", args.decode_max_batch))
               if n is not None}
    served = ServedPlan.of(setup, max_batch=args.max_batch, token_budget=args.token_budget,
                           chunked=not args.no_chunking, chunk_size=args.chunk_size,
                           scheduler=Scheduler(args.scheduler, args.mixed_chunk, args.prefill_delay, args.kv_connector),
                           running=running)
    figures = Path(args.figures) if args.figures else None
    if figures:
        figures.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.rates:
        sweep(args, served, rates, loads, requests, slo, figures, started)
    else:
        single(args, served, loads[0], requests, slo, figures, started)


def single(args, served: ServedPlan, load: Load, requests: int | None, slo: Slo | None, figures: Path | None,
           started: float) -> None:
    import pandas as pd

    from npusim.serving import plots

    result, requests = serve_one(args, served, load, requests, slo)
    wall = time.perf_counter() - started
    if figures:
        plots.latency_cdfs(result).savefig(figures / "latency_cdfs.png", dpi=120)
        plots.timeline(result).savefig(figures / "timeline.png", dpi=120)
    s = result.summary
    if args.format == "json":
        print(json.dumps({"setup": describe(served), "load": describe_load(args, requests), **result.to_json(),
                          "wall_s": wall}, indent=2))
        return
    if args.format == "csv":
        common.emit(pd.DataFrame([s.flat()]), "csv")
        return
    header(served, args, requests)
    print()
    w = s.steady
    title = (f"latency (ms) of the {w.requests} requests of the steady window (ITL: every gap of the run)"
             if w.reached else "latency (ms), whole run: no steady window")
    common.emit(result.latency_table(steady=w.reached).round(2), "table", title=title)
    print()
    print(f"served {s.completed} of {s.requests} requests in {s.window:.1f} s: {s.request_throughput:.3g} requests/s, "
          f"{s.input_throughput:,.0f} prompt + {s.output_throughput:,.0f} output tokens/s")
    print(steady_sentence(s))
    if slo:
        share, goodput = ((s.steady_slo_attainment, s.steady_goodput) if w.reached else
                          (s.slo_attainment, s.goodput))
        print(f"SLO {describe_slo(slo)}: {100 * share:.1f}% of requests {'in the steady window ' * w.reached}met "
              f"it; goodput {goodput:.3g} requests/s" + ("; an overloaded run meets no SLO" if
                                                        w.verdict == "overloaded" else ""))
    print(f"mean batch {s.mean_batch:.1f} sequences per step, KV cache {100 * s.kv_usage:.0f}% used, "
          f"{s.mean_waiting:.2f} requests waiting on average, {s.preemptions} preemptions")
    footer(served, wall)


def sweep(args, served: ServedPlan, rates: list[float], loads: list[Load], requests: int | None, slo: Slo | None,
          figures: Path | None, started: float) -> None:
    import pandas as pd

    from npusim.serving import knee, plots

    summaries = []
    for rate, load in zip(rates, loads):
        sys.stderr.write(f"rate {rate:g} requests/s\n")
        summaries.append(serve_one(args, served, load, requests, slo)[0].summary)
    wall = time.perf_counter() - started
    frame = pd.DataFrame([{"rate": rate, **s.flat()} for rate, s in zip(rates, summaries)])
    at = knee(rates, summaries, slo)
    if figures:
        plots.rate_sweep(rates, summaries, slo).savefig(figures / "rate_sweep.png", dpi=120)
    if args.format == "json":
        common.emit(frame, "json", extra={"setup": describe(served), "load": describe_load(args, requests),
                                          "slo": asdict(slo) if slo else None, "knee_rate": at, "wall_s": wall})
        return
    if args.format == "csv":
        common.emit(frame, "csv")
        return
    header(served, args, requests)
    print()
    table = pd.DataFrame({"rate": rates, "requests": frame.requests, "steady": frame.steady_verdict,
                          "ttft_p50_ms": frame.steady_ttft_p50 * 1e3, "ttft_p99_ms": frame.steady_ttft_p99 * 1e3,
                          "tpot_p50_ms": frame.steady_tpot_p50 * 1e3, "tpot_p99_ms": frame.steady_tpot_p99 * 1e3,
                          "delivered_per_s": frame.steady_request_throughput,
                          "steady_tok_s": frame.steady_output_throughput, "goodput": frame.steady_goodput,
                          "slo_met_pct": frame.steady_slo_attainment * 100 if slo else None})
    unsteady = frame.steady_verdict == "overloaded"  # no percentile of a run whose queue grew without bound holds
    table.loc[unsteady, ["ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "goodput", "slo_met_pct"]] = None
    common.emit(table.round(2), "table", title="rate sweep (offered requests/s; latencies, delivered requests/s, "
                                               "output tokens/s and SLO share of the steady window, warm-up and drain "
                                               "left out)")
    for rate, s in zip(rates, summaries):
        if not s.steady.reached:
            print(f"rate {rate:g}: {s.steady.reason}")
    print(knee_sentence(rates, summaries, at, slo))
    footer(served, wall)


def knee_sentence(rates: list[float], summaries: list[Summary], at: float | None, slo: Slo | None) -> str:
    """Where the whole SLO (TTFT and TPOT, whichever it limits) stops being met at p99."""
    if slo is None:
        return "give --slo ttft=...,tpot=... to locate the knee"
    limits = describe_slo(slo)
    if at is None:
        return f"p99 stays within the SLO ({limits}) up to {rates[-1]:g} requests/s"
    misses = summaries[rates.index(at)].misses(slo)
    late = [f"{name.upper()} p99" for name in misses if name != "steady"]
    missed = " and ".join(late) or "no steady state"
    if late and "steady" in misses:
        missed += f"); at {at:g} requests/s the run has no steady state (overloaded"
    if at == rates[0]:
        return f"the SLO ({limits}) is missed already at {at:g} requests/s ({missed})"
    before = rates[rates.index(at) - 1]
    return f"knee: the SLO ({limits}) is met at {before:g} requests/s and missed at {at:g} ({missed})"


def serve_one(args, served: ServedPlan, load: Load, requests: int | None, slo: Slo | None):
    """One run and the requests it served: as many as asked (or the duration, or the whole trace), else as many as
    a steady window needs (`steady.serve_steady`: from the rate and a pilot run's end-to-end latency)."""
    from npusim.serving.steady import serve_steady

    if requests is None and args.duration is None and not args.trace:
        return serve_steady(served, load, seed=args.seed, slo=slo, progress=True)
    return served.run(load, seed=args.seed, requests=requests, duration=args.duration, slo=slo,
                      progress=True), requests


def steady_sentence(s: Summary) -> str:
    """Where the run was steady, or why it was not (then the figures printed are the whole run's)."""
    w = s.steady
    if not w.reached:
        return f"{w.reason} (the figures above are the whole run's)"
    return (f"steady window: the {w.requests} requests arriving {w.start:.1f}-{w.end:.1f} s (warm-up and drain "
            f"{w.warmup:.1f} s each, the p90 end-to-end latency): {w.delivered:.3g} requests/s delivered of "
            f"{w.offered:.3g} offered, {s.steady_output_throughput:,.0f} output tokens/s; its TTFTs are worth "
            f"{w.effective:.0f} independent samples")


def header(served: ServedPlan, args, requests: int | None) -> None:
    s, d = served.setup, served.deployment
    print(f"{s.model.name} on {s.system.name}, plan {s.plan.name}, {s.quant.name}")
    dies = {role: s.plan.instance(role).ranks // pool.ranks
            for role, pool in (("prefill", d.prefill), ("decode", d.decode)) if pool}
    pools = "prefill " + describe_pool(d.prefill, dies["prefill"])
    pools += ", decode " + describe_pool(d.decode, dies["decode"]) if d.decode else " (co-located)"
    if d.link:
        pools += (f"; KV link {units.format(d.link.bandwidth, 'bandwidth', 3)} per request (the slowest of "
                  f"egress, link and ingress), {units.format(d.link.latency, 'time', 3)} per transfer")
    print(pools)
    caps = {role: m.capacity for role, m in served.models.items()}
    cache = ", ".join(f"{role} {cap.kv_tokens:,} tokens" for role, cap in caps.items()) if d.decode else \
        f"{caps['prefill'].kv_tokens:,} tokens"
    limits = ", ".join(f"{role} {cap.max_batch}" for role, cap in caps.items()) if d.decode else \
        str(caps["prefill"].max_batch)
    sched = d.scheduler.policy + (" with mixed chunks" if d.scheduler.mixed_chunk else "")
    sched += f" with a {d.scheduler.prefill_delay}-pass prefill delay" if d.scheduler.prefill_delay else ""
    group = ", ".join(f"{role} {n} {'die' if n == 1 else 'dies'}" for role, n in dies.items()) if d.decode else \
        f"{dies['prefill']} {'die' if dies['prefill'] == 1 else 'dies'}"
    print(f"per attention-DP rank ({group}): KV cache {cache}; running limit {limits}, token budget "
          f"{caps['decode'].token_budget}"
          f"{' (chunked prefill)' if d.chunk_size else ''}, {sched} scheduler; MTP depth {d.mtp.depth}"
          + (f" accepting each draft with p = {d.mtp.acceptance:.3f}" if d.mtp.depth else ""))
    print(f"load: {describe_load(args, requests)}")


def describe_pool(pool, dies: int) -> str:
    """'1 x 64 dies (1 attention-DP rank of 64 dies: a CP/TP group)' — an instance by its dies, then its DP ranks."""
    ranks = f"{pool.ranks} attention-DP {'rank' if pool.ranks == 1 else 'ranks'}"
    return f"{pool.instances} x {pool.ranks * dies} dies ({ranks} of {dies} {'die' if dies == 1 else 'dies'})"


def footer(served: ServedPlan, wall: float) -> None:
    print(f"wall time {wall:.1f} s ({served.evaluations} engine step predictions)")


def describe(served: ServedPlan) -> dict:
    s = served.setup
    return {"system": s.system.name, "model": s.model.name, "plan": s.plan.name, "quant": s.quant.name,
            "deployment": asdict(served.deployment),
            "capacity": {role: {**asdict(m.capacity), "kv_tokens": m.capacity.kv_tokens}
                         for role, m in served.models.items()}}


def describe_load(args, requests: int | None) -> str:
    stop = (f"{requests} requests" if requests else f"{args.duration:g} s" if args.duration else "whole trace"
            if args.trace else "the requests a steady window needs at each rate")
    if args.trace:
        return f"trace {args.trace}, {stop}, seed {args.seed}"
    lengths = f"input {args.input or DEFAULT_INPUT}, output {args.output or DEFAULT_OUTPUT}"
    if args.prefix_hit:
        lengths += f", prefix hit {args.prefix_hit:g}"
    if args.rate or args.rates:
        kind = f"rate {args.rate or args.rates} requests/s, {'Poisson' if args.cv == 1 else f'gamma cv {args.cv:g}'}"
        kind += f", at most {args.concurrency} in flight" if args.concurrency is not None else ""
    else:
        kind = f"{args.concurrency} concurrent users"
    return f"{kind}, {lengths}, {stop}, seed {args.seed}"


def make_load(args, rate: float | None) -> Load:
    from npusim.serving import ClosedLoop, OpenLoop, read_trace

    if args.trace:
        return read_trace(args.trace)
    inp = parse_lengths(args.input or DEFAULT_INPUT, "--input")
    out = parse_lengths(args.output or DEFAULT_OUTPUT, "--output")
    if rate is None:
        return ClosedLoop(args.concurrency, inp, out, prefix_hit=args.prefix_hit)
    return OpenLoop(rate, inp, out, cv=args.cv, prefix_hit=args.prefix_hit, max_concurrency=args.concurrency)


def parse_lengths(text: str, option: str):
    """N, uniform:LOW:HIGH or lognormal:MEDIAN:SIGMA[:MAX]."""
    from npusim.serving import Fixed, LogNormal, Uniform

    kind, *values = text.split(":")
    forms = "N, uniform:LOW:HIGH or lognormal:MEDIAN:SIGMA[:MAX]"
    try:
        if not values:
            return Fixed(int(kind))
        if kind == "uniform" and len(values) == 2:
            return Uniform(int(values[0]), int(values[1]))
        if kind == "lognormal" and len(values) in (2, 3):
            return LogNormal(float(values[0]), float(values[1]), high=int(values[2]) if len(values) == 3 else None)
    except ValueError:
        pass
    except NpusimError as exc:
        raise NpusimError(f"'{text}': {exc.field} {exc.detail}", field=option) from None
    raise NpusimError(f"'{text}' is not a length distribution; use {forms}", field=option)


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        raise NpusimError(f"'{text}' must be comma-separated requests/s, e.g. 0.5,1,2,4", field="--rates") from None
    if any(not 0 < r < math.inf for r in rates) or rates != sorted(set(rates)):
        raise NpusimError(f"'{text}' must be finite positive rates in increasing order", field="--rates")
    return rates


def describe_slo(slo: Slo) -> str:
    return ", ".join(f"{name} {units.format(v, 'time', 3)}" for name, v in asdict(slo).items() if v is not None)
