"""The CLI starts at once (issue 30): building the parser, which every `npusim --help`, `--version` and subcommand
`--help` does and nothing more, loads neither pandas, matplotlib, NumPy, the engine nor npusim.api; a prediction and a
sweep's workers load no matplotlib (figures only); and the defaults the help shows, mirrored in npusim.cli.defaults,
equal their owners'."""

import dataclasses
import importlib
import json
import subprocess
import sys

from npusim.cli import defaults

HEAVY = ("pandas", "matplotlib", "numpy", "npusim.api", "npusim.engine", "npusim.serving", "npusim.planner")

# In a fresh interpreter: every command path's --help (and --version, the bare --help), each with the heavy modules
# that were first loaded while it ran, as JSON.
WALK = """
import argparse, contextlib, io, json, sys
from npusim.cli.main import build_parser, main

HEAVY = %r

def paths(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,)
                yield from paths(sub, prefix + (name,))

def loaded():
    return {m for m in HEAVY if m in sys.modules}

seen, report = set(), {}
for argv in [("--version",), ("--help",)] + [(*p, "--help") for p in paths(build_parser())]:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main(list(argv))
        except SystemExit as exc:
            assert exc.code == 0, (argv, exc.code)
    report[" ".join(argv)] = {"new": sorted(loaded() - seen), "printed": len(out.getvalue())}
    seen |= loaded()
print(json.dumps(report))
"""


def test_help_and_version_load_no_heavy_module():
    run = subprocess.run([sys.executable, "-c", WALK % (HEAVY,)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    for argv in ("--version", "--help", "predict --help", "serve --help", "plan --help", "plan list --help",
                 "kernel sim --help", "hw show --help", "sweep --help", "report --help", "profile --help"):
        assert report[argv]["printed"] > 0, argv  # the walk reached it and it printed its help
    heavy = {argv: r["new"] for argv, r in report.items() if r["new"]}
    assert heavy == {}, f"these loaded heavy modules: {heavy}"


def test_prediction_loads_no_matplotlib():
    code = ("import sys; from npusim.cli.main import main; main(['predict', '--format', 'json']); "
            "print('matplotlib' in sys.modules, file=sys.stderr)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["summary"]["tpot_s"] > 0
    assert run.stderr.strip().splitlines()[-1] == "False"


def test_a_sweep_worker_loads_no_matplotlib_until_a_figure_is_drawn():
    code = ("import sys; import npusim.sweeps, npusim.sweeps.run; print('matplotlib' in sys.modules); "
            "from npusim.sweeps import figures; print('matplotlib' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "True"]


def test_help_defaults_equal_their_owners():
    for name, (module, attr) in defaults.OWNERS.items():
        assert getattr(defaults, name) == getattr(importlib.import_module(module), attr), name
    from npusim.planner.search import Traffic

    owner = {f.name: f.default for f in dataclasses.fields(Traffic)}
    assert defaults.TRAFFIC == {k: owner[k] for k in defaults.TRAFFIC}
