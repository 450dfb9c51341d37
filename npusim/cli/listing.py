"""`npusim list plans|scenarios|sweeps|frameworks` (also `npusim plan list`, `npusim scenario list`): the shipped
files of a kind, each with its one-line description."""

from __future__ import annotations

from npusim.cli import common
from npusim.spec.catalog import data_root, display_path
from npusim.spec.framework import frameworks, load_framework
from npusim.spec.plan import PLANS
from npusim.spec.scenario import SCENARIOS
from npusim.spec.schema import read_yaml

KINDS = ("plans", "scenarios", "sweeps", "frameworks")


def _first_comment(path) -> str:
    """A file's first comment sentence: the description of a file without a description field."""
    text = " ".join(line.lstrip("# ").strip() for line in path.read_text().splitlines()[:6] if line.startswith("#"))
    return text.split(". ")[0].rstrip(".") if text else ""


def _described(catalog) -> list[dict]:
    return [{"name": n, "description": catalog.load(n).description or _first_comment(catalog.path_of(n))}
            for n in catalog.names()]


def rows(kind: str) -> list[dict]:
    if kind == "plans":
        return _described(PLANS)
    if kind == "scenarios":
        return _described(SCENARIOS)
    if kind == "frameworks":
        return [{"name": n, "description": f"{fw.title} launch flags ({fw.version})"}
                for n, fw in ((n, load_framework(n)) for n in frameworks())]
    paths = sorted((data_root() / "workloads" / "sweeps").glob("*.yaml"))
    return [{"name": display_path(p), "description": read_yaml(p, display_path(p)).get("description", "")
             or _first_comment(p)} for p in paths]


def show(kind: str, fmt: str) -> None:
    import pandas as pd

    common.emit(pd.DataFrame(rows(kind), columns=["name", "description"]), fmt)


def register(sub) -> None:
    p = sub.add_parser("list", help="shipped plans, scenarios, sweeps or launch frameworks, with a description each")
    p.add_argument("kind", choices=KINDS)
    common.add_format(p)
    p.set_defaults(run=lambda args: show(args.kind, args.format))
    s = sub.add_parser("scenario", help="scenarios (workloads/scenarios): npusim scenario list")
    cmds = s.add_subparsers(dest="scenario_command", metavar="COMMAND")
    lst = cmds.add_parser("list", help="every shipped scenario with its description")
    common.add_format(lst)
    lst.set_defaults(run=lambda args: show("scenarios", args.format))
