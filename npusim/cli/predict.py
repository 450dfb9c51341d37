"""`npusim predict`: TTFT, TPOT, throughput, memory per rank and the per-op breakdown of one deployment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from npusim.cli import common, defaults
from npusim.cli.model import config_mapping
from npusim.spec.framework import frameworks

if TYPE_CHECKING:  # the model, pandas and the results load in run(), so that every --help stays light
    import pandas as pd


def register(sub) -> None:
    p = sub.add_parser("predict", help="TTFT / TPOT / tokens/s per chip / memory of a deployment "
                                       "(no arguments: DeepSeek-V3.2-Exp at 128K on CloudMatrix384, plans of A17)")
    d = defaults.SCENARIO
    p.add_argument("--hw", default=d["hw"], help=f"system (default {d['hw']})")
    p.add_argument("--model", default=d["model"], help=f"model name or HF config.json (default {d['model']})")
    p.add_argument("--plan", default=d["plan"], help=f"plan name or YAML (default {d['plan']})")
    p.add_argument("--input", type=int, default=d["input"], help=f"prompt tokens (default {d['input']})")
    p.add_argument("--output", type=int, default=d["output"], help=f"output tokens (default {d['output']})")
    p.add_argument("--batch", type=int, default=d["batch"], help=f"global decode batch (default {d['batch']})")
    p.add_argument("--prefill-batch", type=int, default=1, help="prompts prefilled together for TTFT (default 1)")
    p.add_argument("--context", type=int, default=None, help="decode context (default input + output/2)")
    p.add_argument("--prefix-hit", type=float, default=0.0,
                   help="share of each prompt already in the prefix cache, in [0, 1): not recomputed, not "
                        "transferred to the decode pool, still held in the cache (default 0)")
    p.add_argument("--quant", default=d["quant"], help=f"quantisation preset (default {d['quant']}; 'model' = the "
                                                       "checkpoint's own format)")
    p.add_argument("--top", type=int, default=12, help="rows of the per-op breakdown to print (table format)")
    p.add_argument("--verbose", action="store_true",
                   help="for a config.json model: its architecture and the keys ignored (they do not change cost)")
    p.add_argument("--trace", default=None, metavar="OUT.json", help="write a Chrome trace of one layer per type")
    p.add_argument("--launch", default=None, metavar="FILE",
                   help="an SGLang or vLLM-Ascend launch script: the deployment its server commands launch is the "
                        "plan, quantisation and decode batch predicted (--plan is ignored; --quant / --batch, when "
                        "given, win); the flags npusim does not know or model are named")
    p.add_argument("--emit", choices=frameworks(), default=None,
                   help="print the launch commands of this deployment for a serving framework instead of the figures "
                        "(after predict accepts it; --format json adds them under 'launch')")
    common.add_speculative(p)
    common.add_set(p)
    common.add_format(p)
    p.set_defaults(run=run)


def csv_table(pred, price) -> pd.DataFrame:
    """One CSV: the headline figures and the cost first (section summary / cost: the name carries the unit), then
    the per-op rows of each phase (section breakdown)."""
    import pandas as pd

    head = [{"section": "summary", "name": k, "value": v} for k, v in pred.summary().items()]
    head += [{"section": "cost", "name": k, "value": v} for k, v in price.as_dict().items()]
    ops = [pred.breakdown(p).assign(section="breakdown", phase=p) for p in pred.phases]
    frame = pd.concat([pd.DataFrame(head)] + ops, ignore_index=True)
    first = ["section", "name", "value", "phase"]
    return frame[first + [c for c in frame if c not in first]]


def _launch(args):
    """The launch commands of the predicted deployment, with the scenario's batch and lengths as serving limits."""
    from npusim import api
    from npusim.results.launch import launch, limits_for

    setup = api.load_setup(args.hw, args.model, args.plan, None if args.quant == "model" else args.quant,
                           common.parse_overrides(args.overrides, args))
    limits = limits_for(setup.plan, input=args.input, output=args.output, batch=args.batch,
                        prefill_batch=args.prefill_batch)
    return launch(args.emit, setup.plan, setup.model, setup.quant, setup.system, limits)


def from_launch(args) -> None:
    """--launch FILE: its deployment becomes this run's plan (a plan file in a temporary directory, named after
    FILE), and its quantisation and decode batch unless --quant / --batch differ from their defaults; `npusim serve`
    also takes the framework's step semantics (--scheduler)."""
    import sys
    import tempfile

    import yaml

    from npusim.deploy.read import read_launch
    from npusim.planner.space import MTP_ACCEPTANCE

    dep = read_launch(args.launch, MTP_ACCEPTANCE)
    path = Path(tempfile.mkdtemp(prefix="npusim-launch-")) / f"{Path(args.launch).stem}.yaml"
    path.write_text(yaml.safe_dump(dep.plan, sort_keys=False))
    args.plan = str(path)
    if args.quant == defaults.SCENARIO["quant"]:
        args.quant = dep.quant
    if getattr(args, "batch", None) == defaults.SCENARIO["batch"] and dep.batch:
        args.batch = dep.batch
    if hasattr(args, "scheduler"):
        args.scheduler = "sglang" if dep.framework == "sglang" else "vllm"
    said = [f"read {args.launch} ({dep.framework}) as plan {path}, quant {args.quant}"
            + (f", batch {args.batch}" if hasattr(args, "batch") else f", scheduler {args.scheduler}")]
    said += [f"unknown to the release: {' '.join(dep.unknown)}"] if dep.unknown else []
    said += [f"not modelled: {' '.join(dep.unmodelled)}"] if dep.unmodelled else []
    print("\n".join(said + list(dep.notes)), file=sys.stderr)


def run(args) -> None:
    from npusim import api
    from npusim.results.cost import CostParams, cost

    if args.launch:
        from_launch(args)
    pred = api.predict(args.hw, args.model, args.plan, input=args.input, output=args.output, batch=args.batch,
                       prefill_batch=args.prefill_batch, context=args.context,
                       quant=None if args.quant == "model" else args.quant, prefix_hit=args.prefix_hit,
                       overrides=common.parse_overrides(args.overrides, args))
    if args.trace:
        Path(args.trace).write_text(json.dumps(pred.chrome_trace()))
    price = cost(pred, hw=args.hw)
    emitted = _launch(args) if args.emit else None
    if args.format == "json":
        extra = {"launch": emitted.as_dict()} if emitted else {}
        print(json.dumps({**json.loads(pred.to_json()), "cost": price.as_dict(), **extra}, indent=2))
        return
    if emitted:
        print(emitted.script(), end="")
        return
    if args.format == "csv":
        common.emit(csv_table(pred, price), "csv")
        return
    s = pred.scenario
    print(f"{pred.model} on {pred.system}, plan {pred.plan}, {pred.quant}: input {s['input']}, output {s['output']}, "
          f"decode batch {s['batch']} at context {s['context']}, prefill batch {s['prefill_batch']}"
          + (f", prefix hit {s['prefix_hit']:g}" if s.get("prefix_hit") else ""))
    if pred.prefill is None:
        print("TTFT        none   (" + "; ".join(pred.notes) + ")")
    else:
        print(f"TTFT  {pred.ttft * 1e3:10.1f} ms   (prefill {pred.prefill.time * 1e3:.1f} ms"
              f" + KV transfer {pred.kv_transfer * 1e3:.1f} ms, {pred.prefill_chips:g} chips)")
    print(f"TPOT  {pred.tpot * 1e3:10.2f} ms   (decode step {pred.decode_step * 1e3:.2f} ms, {pred.decode_chips:g} chips)")
    print(f"decode {pred.tokens_per_s_per_chip:10.1f} tokens/s per chip" + (
        f"; prefill {pred.prefill_tokens_per_s_per_chip:.1f} tokens/s per chip" if pred.prefill else ""))
    if args.verbose:
        model = api.load_setup(args.hw, args.model, args.plan, None, common.parse_overrides(args.overrides, args)).model
        for key, value in config_mapping(model).items():
            print(f"{key}: {value}")
    if pred.energy:
        print("energy " + "; ".join(f"{p} {pred.joules_per_token[p]:.3g} J/token, {pred.tflops_per_watt(p):.3g} "
                                    f"TFLOPS/W, {pred.energy[p].watts:.0f} W per rank" for p in pred.phases))
    prefill_cost = (f", prefill ${price.prefill_usd_per_mtok:.3g} per million prompt tokens" if pred.prefill else "")
    print(f"cost   decode ${price.decode_usd_per_mtok:.3g} per million output tokens{prefill_cost} "
          f"({CostParams().describe()}); system {price.decode_system_joules_per_token:.3g} J per output token")
    if pred.af:
        af, e = pred.af, pred.memory["decode_experts"]
        print(f"AF     {af.domains} attention domains x {af.microbatches} microbatches: attention {af.attention.time * 1e3:.2f} ms and experts "
              f"{af.experts.time * 1e3:.2f} ms per microbatch, A2E {af.a2e * 1e6:.1f} us + E2A {af.e2a * 1e6:.1f} us "
              f"per MoE layer; busy {100 * af.attention_utilisation:.0f} % / {100 * af.expert_utilisation:.0f} % of "
              f"the step; expert die memory {e.total / 2**30:.2f} GiB (weights {e.weights / 2**30:.2f})")
    print()
    common.emit(pred.phase_table().round(2), "table", title="per phase (time per step; memory per rank)")
    for phase in pred.phases:
        frame = pred.breakdown(phase).sort_values("total_ms", ascending=False).head(args.top).round(2)
        print()
        common.emit(frame, "table", title=f"{phase}: top {args.top} ops and collectives by total time")
