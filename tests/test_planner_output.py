"""What `npusim plan` prints (issue 29 items 4 and 5): unserved rows say so, chip counts are whole, rows of identical
figures are one row, a verdict won by less than the model's error says so, and the --help of every command states the
defaults of --input / --output."""

import argparse
import math
import re

import pandas as pd
import pytest

from npusim.cli.main import build_parser
from npusim.cli.plan import _not_served, _rows, merge_alike
from npusim.planner.colocated import MODEL_ERROR, Mixed, verdict
from npusim.serving import Slo
from npusim.spec.catalog import data_root

SLO = Slo(2.0, 0.05)


def test_an_unserved_row_says_not_served_with_its_chips():
    """A co-located layout pruned by its prompt alone has no served figures: null in JSON, 'not served' printed,
    never 'chips 0.0' or 'inf'."""
    pruned = Mixed("co-located", "64r DP64 EP64 oTP8 dTP4 MTP3", 64, 32.0, 256, alone_ttft=115.0,
                   error="not served: one prompt alone takes 115 s, above TTFT 2 s")
    served = Mixed("disaggregated", "2P1D", 544, 272.0, 128, 1.28, 0.028, 8.2, 2.1)
    frame = pd.DataFrame([served.row("p99"), pruned.row("p99")])
    row = frame.iloc[1]
    assert row["chips"] == 32 and math.isnan(row["ttft_p99_ms"])
    assert math.isnan(row["tpot_p99_ms"]) and math.isnan(row["served_tok_s_chip"])
    printed = _not_served(frame, frame["served_tok_s_chip"].notna()).to_string(index=False)
    line = printed.splitlines()[2]
    assert line.count("not served") >= 4 and "inf" not in line and " 0.0 " not in line, printed
    assert "not served" not in printed.splitlines()[1]


def test_chip_counts_are_whole():
    """Chips are packages: 272.0 prints as 272, and a deployment of an odd die count takes the package it uses."""
    frame = _rows([{"chips": 272.0}, {"chips": 4.5}])
    assert frame["chips"].tolist() == [272, 5] and frame["chips"].dtype.kind == "i"
    assert Mixed("co-located", "x", 9, 4.5, 1).row("p99")["chips"] == 5


def test_rows_of_identical_figures_are_one_row():
    """The 128K frontier's first four rows: o_proj TP 1 or 8 under attention TP 8 (the same deployment) and two pool
    shapes with the same figures print as one row naming the alternatives; rows that differ stay apart."""
    layout = "{} DP{}xTP8 EP{} oTP{} dTP4 MTP3"
    rows = [dict(chips=224, pools=p, decode=layout.format(r, dp, r[:-1], o), batch=24, tpot_ms=19.12)
            for o in (1, 8) for p, r, dp in (("1P6D", "32r", 4), ("1P3D", "64r", 8))]
    rows.append(dict(chips=272, pools="2P1D", decode="32r DP32 EP32 oTP8 dTP4 MTP3", batch=128, tpot_ms=27.78))
    rows.append(dict(chips=272, pools="2P1D", decode="32r DP32 EP32 oTP8 dTP4 MTP3", batch=128, tpot_ms=27.79))
    merged = merge_alike(pd.DataFrame(rows))
    assert len(merged) == 3
    first = merged.iloc[0]
    assert first["pools"] == "1P6D / 1P3D"
    assert first["decode"] == "32r DP4xTP8 EP32 oTP1|oTP8 dTP4 MTP3 / 64r DP8xTP8 EP64 oTP1|oTP8 dTP4 MTP3"


def test_a_close_verdict_says_so_and_shows_the_runner_up():
    """The README's 2K verdict: the disaggregated winner's TPOT p99 49.61 ms meets 50 ms by 0.8 %, less than the
    model's stated error, so the verdict says so and gives the runner-up (co-located) with its own margin; a clear win
    says nothing of the kind."""
    disagg = Mixed("disaggregated", "3P21D: prefill ... + decode ...", 768, 384.0, 336, 0.4933, 0.04961, 15.25, 22.8)
    best = Mixed("co-located", "32r DP8xTP4 EP32 oTP8 dTP4", 32, 16.0, 8, 0.39112, 0.04506, 10.77, 2.0)
    text = verdict([best], disagg, SLO, "p99")
    assert text.startswith("disaggregated wins at the SLO (p99): 15.2 vs 10.8")
    assert "close call" in text and "by 0.8 % (TPOT 49.61 ms against 50 ms at p99)" in text
    assert f"{100 * MODEL_ERROR:.1f} % median error" in text
    assert "runner-up co-located 32r DP8xTP4 EP32 oTP8 dTP4 at batch 8: 10.8 tok/s per chip, meeting the SLO by " \
           "9.9 % (TPOT 45.06 ms against 50 ms)" in text
    clear = Mixed("disaggregated", "2P1D", 544, 272.0, 128, 1.284, 0.02795, 8.2, 2.1)
    assert "close call" not in verdict([], clear, Slo(2.0, 0.03), "p99")
    near = Mixed("disaggregated", "2P1D", 544, 272.0, 128, 1.284, 0.0299, 8.2, 2.1)
    assert verdict([], near, Slo(2.0, 0.03), "p99").endswith("and no runner-up meets the SLO")


def test_the_model_error_is_the_one_validation_states():
    """MODEL_ERROR is the median |error| of the documented rows that experiments/validate.py writes."""
    text = (data_root() / "experiments" / "results" / "validation.md").read_text()
    stated = re.search(r"documented rows: median \|error\| ([\d.]+) %", text)
    assert stated and float(stated.group(1)) / 100 == pytest.approx(MODEL_ERROR, abs=1e-9)


def _subcommands(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,), sub
                yield from _subcommands(sub, prefix + (name,))


def test_every_help_states_the_input_and_output_defaults():
    checked = []
    for name, sub in _subcommands(build_parser()):
        for action in sub._actions:
            if {"--input", "--output"} & set(action.option_strings):
                checked.append((name, action.dest))
                assert "default" in (action.help or ""), (name, action.option_strings, action.help)
    assert ("plan",) in {n for n, _ in checked} and ("report",) in {n for n, _ in checked}


def test_plan_help_has_no_stray_usage(cli):
    r = cli("plan", "--help")
    assert r.returncode == 0
    usage = r.stdout.split("\n\n")[0]
    assert "list ..." not in usage and "positional arguments" not in r.stdout
    assert "npusim plan list" in r.stdout and "(default 131072)" in r.stdout and "(default 1024)" in r.stdout
    listed = cli("plan", "list")
    assert listed.returncode == 0 and "v32-a3-pd-a17" in listed.stdout
