"""`npusim report`: one self-contained HTML page of a scenario, a plan file or a sweep file (figures inline), with
the Perfetto trace of one step beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from npusim.cli import common
from npusim.cli.defaults import SCENARIO
from npusim.errors import NpusimError
from npusim.spec.catalog import data_root
from npusim.spec.plan import PLANS
from npusim.spec.scenario import SCENARIOS, load_scenario
from npusim.spec.schema import read_yaml

if TYPE_CHECKING:  # pandas, the model and the page's figures load in run(), so that every --help stays light
    import pandas as pd


def register(sub) -> None:
    p = sub.add_parser("report", help="one self-contained HTML report (headline, memory, per-op breakdown, timeline, "
                                      "validation; a plan's frontier) of a scenario, a plan or a sweep")
    p.add_argument("target", help="a scenario (name or YAML), a plan (name or YAML; one written by npusim plan brings "
                                  "its search) or a sweep YAML")
    p.add_argument("--out", default="report.html", help="the HTML file (default report.html); the Perfetto trace "
                                                        "is written beside it as <out>.trace.json")
    d = SCENARIO
    p.add_argument("--hw", help=f"a plan's system (default: its search's, else {d['hw']})")
    p.add_argument("--model", help=f"a plan's model (default: its search's, else {d['model']})")
    p.add_argument("--input", type=int, help=f"a plan's prompt tokens (default: its search's, else {d['input']})")
    p.add_argument("--output", type=int, help=f"a plan's output tokens (default: its search's, else {d['output']})")
    p.add_argument("--batch", type=int, help=f"a plan's global decode batch (default: its search's, else {d['batch']})")
    p.add_argument("--quant", help="a plan's quantisation preset")
    p.add_argument("--workers", type=int, default=None, help="a sweep's local processes")
    common.add_set(p)
    p.set_defaults(run=run)


def kind_of(target: str) -> str:
    """scenario, plan or sweep: by catalog name, else by the keys of the YAML file."""
    if target in SCENARIOS.names():
        return "scenario"
    if target in PLANS.names():
        return "plan"
    sweeps = data_root() / "workloads" / "sweeps" / f"{target}.yaml"
    path = sweeps if sweeps.exists() else Path(target)
    if not path.exists():
        raise NpusimError(f"'{target}' is not a scenario, plan or sweep name nor a file (scenarios: "
                          f"{', '.join(SCENARIOS.names())}; plans: workloads/plans)", field="target")
    keys = set(read_yaml(path, str(path)))
    if keys & {"grid", "list", "base"}:
        return "sweep"
    return "plan" if keys & {"prefill", "decode"} else "scenario"


def _validation() -> pd.DataFrame | None:
    import pandas as pd

    from npusim.results import report

    path = data_root() / report.VALIDATION
    return pd.read_csv(path) if path.exists() else None


def _search_of(plan: str) -> dict:
    """The search `npusim plan` wrote beside its plan file (<plan>.search.json), if any."""
    path = Path(plan)
    side = path.with_name(f"{path.stem}.search.json")
    return json.loads(side.read_text()) if path.suffix in (".yaml", ".yml") and side.exists() else {}


def run(args) -> None:
    import pandas as pd

    from npusim import api
    from npusim.results import report
    from npusim.results.cost import cost

    overrides = common.parse_overrides(args.overrides)
    kind = kind_of(args.target)
    out = Path(args.out)
    trace_file = out.with_name(f"{out.stem}.trace.json")
    if kind == "sweep":
        from npusim.sweeps import SweepSpec, sweep

        spec = SweepSpec.load(data_root() / "workloads" / "sweeps" / f"{args.target}.yaml"
                              if not Path(args.target).exists() else args.target)
        frame = sweep(spec, workers=args.workers, progress=False)
        base = spec.base
        sections = report.sweep_sections(frame, spec) + [report.closest_validation(
            _validation(), base.get("hw", api.DEFAULT["hw"]), base.get("model", api.DEFAULT["model"]),
            base.get("plan", api.DEFAULT["plan"]), base.get("quant", api.DEFAULT["quant"]))]
        html = report.page(f"npusim sweep report: {spec.name}", f"{len(frame)} points of {args.target}", sections)
        out.write_text(html)
        print(f"wrote {out}")
        return
    search: dict = {}
    if kind == "scenario":
        sc = load_scenario(args.target, overrides)
        kwargs, title = sc.predict_args(), f"scenario {sc.title}"
    else:
        search = _search_of(args.target)
        planned = search.get("scenario", {})
        pick = lambda name, default: getattr(args, name) if getattr(args, name) is not None else planned.get(  # noqa
            name, default)
        d = api.DEFAULT
        quant = pick("quant", d["quant"])
        kwargs = {"hw": pick("hw", d["hw"]), "model": pick("model", d["model"]), "plan": args.target,
                  "input": pick("input", d["input"]), "output": pick("output", d["output"]),
                  "batch": pick("batch", d["batch"]), "quant": None if quant in (None, "model") else quant,
                  "overrides": {**planned.get("overrides", {}), **overrides}}
        title = f"plan {args.target}"
    pred = api.predict(**kwargs)
    trace_file.write_text(json.dumps(pred.chrome_trace()))
    sections = report.prediction_sections(pred, cost(pred, hw=kwargs["hw"]), trace_file.name, _validation())
    if search:
        sections.append(report.frontier(pd.DataFrame(search.get("frontier", [])),
                                        pd.DataFrame(search.get("runners_up", [])),
                                        pd.DataFrame(search.get("colocated", [])), search.get("verdict", "")))
    subtitle = (f"{pred.model} on {pred.system}, plan {pred.plan}, {pred.quant}; written by npusim report "
                f"{args.target}")
    out.write_text(report.page(f"npusim report: {title}", subtitle, sections))
    print(f"wrote {out} and {trace_file}")
