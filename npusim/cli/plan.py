"""`npusim plan`: search the parallel plans that meet a TTFT / TPOT SLO (with --rate / --concurrency: at a
percentile under that load, in the serving simulation) and write the recommended one."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from npusim.cli import common, listing
from npusim.cli.defaults import PERCENTILES, SCENARIO, TRAFFIC
from npusim.errors import NpusimError
from npusim.results.launch import Limits, launch
from npusim.spec.framework import frameworks
from npusim.spec.system import load_system

if TYPE_CHECKING:  # pandas, the planner and the model load in run(), so that every --help stays light
    import pandas as pd


def register(sub) -> None:
    p = sub.add_parser("plan", help="search disaggregated plans (CP / DP / TP / EP / o_proj TP / batch / MTP / "
                                    "microbatches) that meet a TTFT / TPOT SLO; print the Pareto frontier",
                       epilog="npusim plan list: every shipped plan (workloads/plans) with its description")
    p.add_argument("--model", default=SCENARIO["model"],
                   help=f"model name or HF config.json (default {SCENARIO['model']})")
    p.add_argument("--hw", default=SCENARIO["hw"], help=f"system (default {SCENARIO['hw']})")
    p.add_argument("--input", type=int, default=SCENARIO["input"],
                   help=f"prompt tokens (default {SCENARIO['input']})")
    p.add_argument("--output", type=int, default=SCENARIO["output"],
                   help=f"output tokens (default {SCENARIO['output']})")
    p.add_argument("--prefix-hit", type=float, default=0.0,
                   help="share of each prompt already in the prefix cache, in [0, 1): the plans are predicted and "
                        "served with it (default 0)")
    p.add_argument("--slo", default="ttft=2s,tpot=30ms", help="targets, e.g. ttft=2s,tpot=30ms (default)")
    p.add_argument("--max-chips", type=common.finite, default=None, help="chip budget for both instances (default: the system)")
    p.add_argument("--quant", default=SCENARIO["quant"],
                   help=f"quantisation preset ('model' = checkpoint format; default {SCENARIO['quant']})")
    p.add_argument("--ranks", default="", help="instance sizes in ranks to try, e.g. 16,32 (default: powers of two)")
    p.add_argument("--mtp", default="0,1,3", help="MTP depths to try (published acceptances: 0, 1, 3)")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: up to 2)")
    p.add_argument("--out", default="plan.yaml", help="where to write the recommended plan (default plan.yaml)")
    p.add_argument("--emit", action="append", choices=frameworks(), default=[],
                   help="also write the recommended deployment's launch commands for this serving framework beside "
                        "the plan file (<plan>.<framework>.sh) and print them (repeatable)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate", type=common.finite, help="also serve the frontier at this many requests/s (Poisson) and "
                                                 "recommend the cheapest plan that meets the SLO under it")
    load.add_argument("--concurrency", type=int, help="the same for this many concurrent users (closed loop)")
    p.add_argument("--percentile", default=TRAFFIC["percentile"], choices=PERCENTILES,
                   help=f"the SLO must hold at this percentile under the load (default {TRAFFIC['percentile']})")
    p.add_argument("--requests", type=int, default=TRAFFIC["requests"],
                   help=f"requests served per plan checked under the load (default {TRAFFIC['requests']})")
    p.add_argument("--seed", type=common.seed, default=TRAFFIC["seed"], help=f"random seed of the load (default {TRAFFIC['seed']})")
    p.add_argument("--colocated", action=argparse.BooleanOptionalAction, default=True,
                   help="serve co-located (PD-mixed) deployments of the frontier's decode layouts in the "
                        "request-level simulation (closed loop, SLO at --percentile) beside the disaggregated "
                        "recommendation and say which serves more tokens per chip at the SLO (default; "
                        "--no-colocated skips these serving runs, seconds each)")
    p.add_argument("--figures", metavar="DIR", help="write frontier.png there: the disaggregated frontier and, with "
                                                  "--colocated, the deployments served beside it, in one figure")
    common.add_speculative(p, steps=False)
    common.add_set(p)
    common.add_format(p)
    p.set_defaults(run=run)
    # `npusim plan list` is named in the epilog, not as a positional of the search's usage line
    cmds = p.add_subparsers(dest="plan_command", help=argparse.SUPPRESS)
    lst = cmds.add_parser("list", help="every shipped plan (workloads/plans) with its description")
    common.add_format(lst)
    lst.set_defaults(run=lambda args: listing.show("plans", args.format))


def _table(cands, per_chip_s: float) -> pd.DataFrame:
    """Candidates as rows, with $ per million output tokens from the served rate (prefill chips included); rows of
    identical figures merged (`merge_alike`)."""
    import pandas as pd

    frame = _rows([c.row() for c in cands])
    if not frame.empty:
        frame["usd_per_mtok"] = per_chip_s / frame["served_tok_s_chip"] * 1e6
    return merge_alike(frame.round(2))


def _rows(rows: list[dict]) -> pd.DataFrame:
    """Table rows with whole chip counts (a package partly used, an odd die count, is a package taken)."""
    import math

    import pandas as pd

    frame = pd.DataFrame(rows)
    if "chips" in frame:
        frame["chips"] = [math.ceil(c - 1e-9) for c in frame["chips"]]
    return frame


def _served_rows(served, pct: str) -> pd.DataFrame:
    """Plans served under a load: one not served (its pools short of the rate, no HBM left for its cache) has no
    served figures (NaN, JSON null), not infinities."""
    rows = []
    for s in served:
        row = s.row(pct)
        if s.error:
            row.update({k: float("nan") for k in (f"ttft_{pct}_ms", f"tpot_{pct}_ms", "served_tok_s_chip_under_load")})
        rows.append(row)
    return _rows(rows).round(2)


def merge_alike(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows whose figures (every numeric column) are identical as one row: layouts that differ in one token (o_proj
    TP 1 or 8 under an attention TP of 8 is the same deployment) as 'oTP1|oTP8', other alternatives side by side
    (' / ', the i-th of each text column belonging together)."""
    import pandas as pd

    if frame.empty:
        return frame
    text = [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]
    figures = [c for c in frame.columns if c not in text]
    rows = []
    for _, group in frame.groupby(figures, sort=False, dropna=False):
        variants = [[str(v) for v in r] for r in group[text].itertuples(index=False)]
        variants = _merge_one_token(variants)
        row = group.iloc[0].to_dict()
        for i, col in enumerate(text):
            values = list(dict.fromkeys(v[i] for v in variants))
            row[col] = values[0] if len(values) == 1 else " / ".join(v[i] for v in variants)
        rows.append(row)
    return pd.DataFrame(rows, columns=frame.columns)


def _merge_one_token(variants: list[list[str]]) -> list[list[str]]:
    """Pairs of variants (a text per column) that differ in exactly one space-separated token, merged as 'a|b'."""
    out = [list(v) for v in variants]
    merged = True
    while merged:
        merged = False
        for i in range(len(out)):
            for j in range(i + 1, len(out)):
                a, b = ([c.split(" ") for c in v] for v in (out[i], out[j]))
                if [len(x) for x in a] != [len(x) for x in b]:
                    continue
                diff = [(c, k) for c in range(len(a)) for k in range(len(a[c])) if a[c][k] != b[c][k]]
                if len(diff) == 1:
                    c, k = diff[0]
                    a[c][k] = f"{a[c][k]}|{b[c][k]}"
                    out[i] = [" ".join(x) for x in a]
                    del out[j]
                    merged = True
                    break
            if merged:
                break
    return out


def _not_served(frame: pd.DataFrame, served: pd.Series) -> pd.DataFrame:
    """The table as printed: a row not served says so in its served-figure cells instead of NaN (figures with two
    decimals, as the other tables print them)."""
    if served.all():
        return frame
    shown = frame.astype(object)
    for col in frame.columns:
        if frame[col].dtype.kind == "f":
            shown[col] = [f"{v:.2f}" if v == v else "-" for v in frame[col]]
    cols = [c for c in frame.columns if c.startswith(("ttft_p", "tpot_p", "ttft_mean", "tpot_mean", "served_tok"))]
    shown.loc[~served, cols] = "not served"
    return shown


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise NpusimError(f"'{text}' must be whole numbers separated by commas", field=option) from None
    if any(v < 0 for v in values):
        raise NpusimError(f"'{text}' must not be negative", field=option)
    return values


def run(args) -> None:
    import pandas as pd

    from npusim import api
    from npusim.planner import SearchSpace, Traffic, commands, search, write_plan
    from npusim.planner.space import MTP_ACCEPTANCE
    from npusim.results.cost import CostParams, chip_usd_per_second
    from npusim.serving import Slo

    overrides = common.parse_overrides(args.overrides, args)
    slo = Slo.parse(args.slo)
    traffic = (Traffic(args.rate, args.concurrency, args.percentile, args.requests, args.seed)
               if args.rate is not None or args.concurrency is not None else None)
    quant = None if args.quant == "model" else args.quant
    sizes, depths = _ints(args.ranks, "--ranks"), _ints(args.mtp, "--mtp")
    if 0 in sizes:
        raise NpusimError(f"'{args.ranks}' must be positive instance sizes in ranks", field="--ranks")
    if args.accept_length is not None and (len(depths) != 1 or not depths[0]):
        raise NpusimError("an accept length is measured at one speculative depth: give one --mtp depth >= 1 with it",
                          field="--accept-length")
    if args.draft is not None and not any(depths):
        raise NpusimError("a draft model proposes drafts at an --mtp depth >= 1", field="--draft")
    unknown = set(depths) - set(MTP_ACCEPTANCE) if args.accept_length is None else set()
    if unknown:
        raise NpusimError(f"no published acceptance for depth {min(unknown)}; use {', '.join(map(str, MTP_ACCEPTANCE))}",
                          field="--mtp")
    space = SearchSpace(min_ranks=min(sizes, default=8), sizes=sizes, mtp_depths=depths)
    result = search(args.hw, args.model, input=args.input, output=args.output, slo=slo, max_chips=args.max_chips,
                    quant=quant, overrides=overrides, workers=args.workers, space=space, load=traffic,
                    percentile=args.percentile, colocated=args.colocated, progress=True, prefix_hit=args.prefix_hit)
    system = load_system(args.hw, api.split_overrides(overrides)["hw"])
    params = CostParams()
    per_chip_s = chip_usd_per_second(system.power_per_chip, system.price_per_chip, params) / params.utilisation
    shown = result.frontier or result.closest
    frame = _table(shown, per_chip_s)
    pct = result.percentile
    served = _served_rows(result.served, pct)
    written = write_plan(result, args.out) if result.recommended else None
    confirm = commands(result, written) if written else []
    extra = {"refusal": result.refusal or None, "candidates": result.candidates, "predictions": result.predictions,
             "pruned": result.pruned, "meets_slo": result.recommended is not None,
             "recommended": result.recommended.row() if written else None,
             "plan_file": str(written) if written else None, "commands": confirm}
    if result.served:
        extra.update(load=(traffic or result.confirmed.traffic).describe(),
                     served=json.loads(served.to_json(orient="records")))
    mixed = _colocated(result) if result.disaggregated else None
    if mixed:
        extra["colocated"] = json.loads(mixed[0].to_json(orient="records"))
        extra["verdict"] = mixed[1]
    if written:
        _write_search(result, written, frame, served if traffic else
                      _rows([c.row() for c in result.closest]).round(2), mixed)
    if args.figures and not frame.empty:
        figure = _figure(args.figures, frame, mixed)
        extra["figure"] = str(figure)
    launches = _launches(args, result, written, overrides) if written else {}
    if launches:
        extra["launch"] = {name: {"file": str(path), **l.as_dict()} for name, (l, path) in launches.items()}
    if args.format != "table":
        common.emit(frame, args.format, extra=extra)
        return
    print(f"{args.model} on {args.hw}: {args.input} in / {args.output} out, SLO TTFT <= {slo.ttft * 1e3:g} ms, "
          f"TPOT <= {slo.tpot * 1e3:g} ms; {result.candidates} candidates, {result.predictions} predictions, "
          f"{result.pruned} points pruned by monotone bounds")
    if traffic:
        print(f"load: {traffic.describe()}")
    if result.refusal:
        print(f"no candidate can run; for example {result.refusal}")
        return
    if not result.frontier:
        print("no plan meets the SLO even for one request; the closest candidates (by the worse of TTFT/SLO and "
              "TPOT/SLO):")
        common.emit(frame, "table")
        return
    common.emit(frame, "table", title="Pareto frontier (served tok/s per chip counts the prefill chips; "
                                      f"$ per million output tokens at {params.describe()})")
    if result.recommended is None:
        closest = _served_rows(result.closest_served(), pct)
        print(f"\nno plan on the frontier meets the SLO at {pct} under this load; the closest served (by the worse "
              f"of TTFT {pct}/SLO and TPOT {pct}/SLO):")
        common.emit(_not_served(closest, closest[f"tpot_{pct}_ms"].notna()), "table")
        return
    if traffic or len(result.served) > 1:
        print()
        title = ("served under the load, fewest chips first until one meets the SLO" if traffic else
                 "served at their pools' rate, the cheapest tokens first until one meets the SLO")
        common.emit(_not_served(served, served[f"tpot_{pct}_ms"].notna()), "table",
                    title=f"{title} (one request's TTFT / TPOT beside their {pct} served)")
    c = result.recommended
    print(f"\nrecommended: {c.pools.prefill} x prefill {c.prefill.layout.describe()} + {c.pools.decode} x decode "
          f"{c.decode.layout.describe()} ({c.pools.describe()}), global batch {c.batch}: TTFT {c.ttft * 1e3:.0f} ms, "
          f"TPOT {c.tpot * 1e3:.1f} ms, {c.pools.requests_per_s:.3g} requests/s, {c.served_tokens_per_s_per_chip:.1f} "
          f"tok/s per chip on {c.chips:g} chips")
    v = result.confirmed
    if v is not None:
        print(f"served under {v.traffic.describe()}: " + (v.error or (
              f"TTFT {pct} {v.ttft * 1e3:.0f} ms, TPOT {pct} {v.tpot * 1e3:.1f} ms, {v.tokens_per_s_per_chip:.1f} "
              f"tok/s per chip ({'meets the SLO' if v.ok else v.verdict(pct)})")))
    if mixed:
        print()
        common.emit(_not_served(mixed[0], mixed[0]["served_tok_s_chip"].notna()), "table",
                    title="co-located vs disaggregated, served (co-located: closed loop, fewer users until the SLO is "
                          f"met, {args.requests}+ requests; SLO at {pct})")
        print(f"verdict: {mixed[1]}")
    if "figure" in extra:
        print(f"frontier figure: {extra['figure']}")
    print(f"written to {written}; confirm with:\n" + "\n".join(f"  {cmd}" for cmd in confirm))
    for name, (emitted, path) in launches.items():
        print(f"\n{emitted.framework.title} launch commands, written to {path}:\n")
        print(path.read_text(), end="")


def _colocated(result):
    """The disaggregated recommendation as served and the co-located deployments beside it, and the verdict."""
    import pandas as pd

    rows = [m.row(result.percentile) for m in [result.disaggregated] + result.colocated]
    return pd.DataFrame(rows).round(2), result.verdict


def _figure(directory: str, frame: pd.DataFrame, mixed: tuple | None) -> Path:
    """Both frontiers in one figure (the report's), as DIR/frontier.png."""
    from npusim.results.report import frontier_figure

    path = Path(directory) / "frontier.png"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NpusimError(f"cannot make the directory '{directory}' ({exc.strerror})", field="--figures") from None
    fig = frontier_figure(frame, mixed[0] if mixed else None, mixed[1] if mixed else "")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _write_search(result, written, frame: pd.DataFrame, runners_up: pd.DataFrame,
                  colocated: tuple | None = None) -> None:
    """The search beside the plan file (<plan>.search.json): its scenario, frontier and runners-up, which
    `npusim report <plan>` shows."""
    sc = result.scenario
    doc = {"scenario": {"hw": sc.hw, "model": sc.model, "input": sc.input, "output": sc.output,
                        "quant": sc.quant or "model", "overrides": dict(sc.overrides),
                        "batch": result.recommended.batch},
           "slo": {"ttft_s": result.slo.ttft, "tpot_s": result.slo.tpot},
           "frontier": json.loads(frame.to_json(orient="records")),
           "runners_up": json.loads(runners_up.to_json(orient="records")),
           "colocated": json.loads(colocated[0].to_json(orient="records")) if colocated else [],
           "verdict": colocated[1] if colocated else ""}
    written.with_name(f"{written.stem}.search.json").write_text(json.dumps(doc, indent=1))


def _launches(args, result, written, overrides) -> dict:
    """Each --emit framework's launch commands of the written plan, with the plan's serving limits, and their file."""
    from npusim import api

    out = {}
    sc, c = result.scenario, result.recommended
    setup = api.load_setup(sc.hw, sc.model, str(written), sc.quant, overrides)
    sched = c.scheduler(sc)
    limits = Limits(sc.input, sc.output, sched["max_batch"], 1, sched["token_budget"])
    for name in dict.fromkeys(args.emit):
        emitted = launch(name, setup.plan, setup.model, setup.quant, setup.system, limits)
        path = written.with_name(f"{written.stem}.{name}.sh")
        path.write_text(emitted.script())
        if emitted.notes and emitted.commands:
            path.write_text(emitted.script() + _as_launched(sc, c.batch, setup, path, written, overrides))
        out[name] = (emitted, path)
    return out


def _as_launched(sc, batch: int, setup, path, written, overrides) -> str:
    """What the written commands run, predicted (issue 29): the launch read back (npusim.deploy.read) and predicted
    at the plan's scenario beside the plan itself, as the script's last comment; '' when both predict the same."""
    import tempfile

    import yaml

    from npusim import api
    from npusim.deploy.read import read_launch
    from npusim.planner.space import MTP_ACCEPTANCE

    dep = read_launch(path, MTP_ACCEPTANCE)
    tree = yaml.safe_dump(dep.plan, sort_keys=False)
    launched = Path(tempfile.mkdtemp(prefix="npusim-launched-")) / f"{path.stem}.yaml"
    launched.write_text(tree)
    same = {**(overrides or {}), "plan.mtp.acceptance": str(setup.plan.mtp.acceptance)}  # not a launch flag
    run = dict(input=sc.input, output=sc.output, batch=batch, quant=sc.quant)
    want = api.predict(sc.hw, sc.model, str(written), overrides=overrides, **run)
    try:
        got = api.predict(sc.hw, sc.model, str(launched), overrides=same, **run)
    except NpusimError as exc:
        return f"# Predicted as launched: refused ({exc}).\n"
    if (got.ttft, got.tpot) == (want.ttft, want.tpot):
        return "# Predicted as launched: the same TTFT and TPOT as the plan.\n"
    return (f"# Predicted as launched (these commands read back, at the plan's scenario): TTFT {got.ttft * 1e3:.0f} ms "
            f"(the plan {want.ttft * 1e3:.0f} ms), TPOT {got.tpot * 1e3:.1f} ms (the plan {want.tpot * 1e3:.1f} ms).\n")
