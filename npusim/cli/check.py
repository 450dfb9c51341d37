"""`npusim check FILE`: a baseline YAML -> drift table (exit 1 on drift; --update rewrites it); a vLLM bench serve
JSON or a measurements CSV -> predicted vs measured."""

from __future__ import annotations

import sys
from pathlib import Path

from npusim.cli import common, defaults
from npusim.errors import NpusimError


def register(sub) -> None:
    p = sub.add_parser("check", help="regression check against a baseline (exit 1 on drift, --update rewrites), or "
                                     "predicted vs measured for a vLLM bench serve JSON / a CSV")
    p.add_argument("file", help="baseline YAML (workloads/baselines/), vLLM bench serve result .json, or .csv")
    p.add_argument("--update", action="store_true", help="rewrite the baseline's values with today's predictions")
    d = defaults.SCENARIO
    p.add_argument("--hw", default=d["hw"], help="measured files: the system they ran on, unless a column says")
    p.add_argument("--model", default=d["model"], help="measured files: the model, unless a column says")
    p.add_argument("--plan", default=d["plan"], help="measured files: the plan, unless a column says")
    p.add_argument("--quant", default=d["quant"], help="measured files: the quantisation, unless a column says")
    common.add_set(p)
    common.add_format(p)
    p.set_defaults(run=run)


def run(args) -> None:
    from npusim.checks import compare, load_measured

    overrides = common.parse_overrides(args.overrides)
    if Path(args.file).suffix in (".yaml", ".yml"):
        _baseline(args, overrides)
        return
    defaults = {"hw": args.hw, "model": args.model, "plan": args.plan, "quant": args.quant}
    frame = compare(load_measured(args.file, defaults), overrides)
    common.emit(frame.round(2), args.format, title=f"predicted vs measured: {args.file}")


def _baseline(args, overrides) -> None:
    if args.update and overrides:
        raise NpusimError("--update with --set would record values the scenarios do not reproduce; put overrides in "
                          "a scenario's 'set:' instead", file=args.file, field="--set")
    import pandas as pd

    from npusim.checks import Baseline, check

    baseline = Baseline.load(args.file)
    rows, updated = check(baseline, overrides)
    frame = _readme_units(pd.DataFrame([r.row() for r in rows]))
    drift = [r for r in rows if not r.ok]
    errors = [r for r in rows if r.note.startswith("error")]
    if errors and not args.update:
        common.emit(frame, args.format, title=f"check {args.file}: {len(errors)} scenario(s) cannot be predicted")
    if errors:  # bad input (a scenario's run or set:, or what it names), not drift: exit 2 like any refusal
        raise errors[0].error
    if args.update:
        updated.write(args.file)
        common.emit(frame, args.format, title=f"{args.file}: rewritten with {len(updated.scenarios)} scenarios")
        return
    common.emit(frame, args.format, title=f"check {args.file}: {len(rows) - len(drift)} of {len(rows)} within "
                                           f"tolerance")
    if drift:
        print(f"npusim: {len(drift)} value(s) drifted from {args.file}; if the change is intended, rerun with "
              "--update and commit the baseline", file=sys.stderr)
        sys.exit(1)


def _readme_units(frame):
    """Metric names as the README's units spell them (`_GiB`, binary gigabytes); the baseline files keep the keys
    they were written with (`prefill_memory_gib`)."""
    if "metric" in frame:
        frame["metric"] = frame["metric"].str.replace(r"_gib$", "_GiB", regex=True)
    return frame
