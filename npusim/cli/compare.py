"""`npusim compare BASE VARIANT...`: a baseline scenario and its variants side by side, and a waterfall figure of what
each variant (one more switch) buys."""

from __future__ import annotations

from npusim.cli import common
from npusim.results.compare import METRICS


def register(sub) -> None:
    p = sub.add_parser("compare", help="baseline vs variant scenarios (YAML): delta table and waterfall figure")
    p.add_argument("scenarios", nargs="+", metavar="SCENARIO",
                   help="baseline first, then variants: names in workloads/scenarios or YAML files")
    p.add_argument("--metric", choices=sorted(METRICS), default=None,
                   help="metric of the waterfall (default ttft; tpot when the baseline is a decode-only plan)")
    p.add_argument("--figure", default="", metavar="OUT.png",
                   help="also write the waterfall figure of --metric here (PNG or SVG by suffix; default: none)")
    common.add_set(p)
    common.add_format(p)
    p.set_defaults(run=run)


def run(args) -> None:
    from npusim.results.compare import compare

    cmp = compare(*args.scenarios, overrides=common.parse_overrides(args.overrides))
    frame = cmp.table()
    extra = {}
    if args.figure:
        metric = args.metric or ("ttft" if cmp.predictions[0].prefill is not None else "tpot")
        extra["waterfall"] = str(cmp.waterfall(args.figure, metric))
    common.emit(frame.round(3) if args.format == "table" else frame, args.format,
                title="baseline and variants (d_*_pct: change against the baseline in %)", extra=extra)
