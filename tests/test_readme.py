"""The README says what main does (issue 29 item 4): its checked walks are run and their excerpts found in what the
commands print, and the API's help gives what the README promises.

A walk is a fenced block preceded by the line `<!-- checked by tests/test_readme.py -->`. Its `$ ` lines (a trailing
backslash continues one) are shell commands, run in order in one scratch directory; the lines after a command, to
the next `$ `, are an excerpt of what it prints: whitespace is collapsed on both sides, `...` elides, and the pieces
must appear in the output in their order. So a number the README shows is one the command prints today.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import npusim
from npusim.spec.catalog import data_root
from npusim.spec.model import model_names
from npusim.spec.quant import PRESETS
from npusim.spec.system import SYSTEMS

README = data_root() / "README.md"
MARKER = "<!-- checked by tests/test_readme.py -->"


@dataclass(frozen=True)
class Step:
    command: str
    excerpt: str  # what the command prints, excerpted


def walks(text: str) -> list[list[Step]]:
    """The checked walks of the README, each a list of commands with their excerpts."""
    out = []
    for block in re.findall(re.escape(MARKER) + r"\s*```[^\n]*\n(.*?)```", text, re.S):
        steps, lines = [], block.splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                i += 1
                continue
            command = lines[i][2:]
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            i += 1
            start = i
            while i < len(lines) and not lines[i].startswith("$ "):
                i += 1
            steps.append(Step(command, "\n".join(lines[start:i])))
        out.append(steps)
    return out


def collapse(text: str) -> str:
    return " ".join(text.split())


def missing(excerpt: str, printed: str) -> str | None:
    """The first piece of the excerpt not found (in order) in what was printed, or None."""
    flat, at = collapse(printed), 0
    for piece in (collapse(p) for p in re.split(r"\.\.\.|…", excerpt)):
        if not piece:
            continue
        found = flat.find(piece, at)
        if found < 0:
            return piece
        at = found + len(piece)
    return None


def test_the_walk_parser_and_matcher():
    text = f"{MARKER}\n```\n$ echo a \\\n    b\na ... b\n$ true\n```\n"
    (steps,) = walks(text)
    assert steps == [Step("echo a  b", "a ... b"), Step("true", "")]
    assert missing("x: 1 ... y", "x:  1\nz\ny") is None and missing("y ... x", "x y") == "x"


def test_the_readme_has_checked_walks_of_both_planning_examples():
    found = walks(README.read_text())
    commands = [s.command for w in found for s in w]
    assert any("--input 131072" in c and c.startswith("npusim plan") for c in commands)
    assert any("--input 2048" in c and c.startswith("npusim plan") for c in commands)
    assert all(s.excerpt.strip() for w in found for s in w if s.command.startswith("npusim plan"))


@pytest.mark.slow  # each plan is a whole search and its serving runs: ~1.5 min on a warm kernel cache
@pytest.mark.parametrize("walk", walks(README.read_text()),
                         ids=lambda w: " ".join(w[0].command.split()[:6]) if w else "empty")
def test_the_readme_walk_prints_what_it_shows(walk, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for step in walk:
        r = subprocess.run(step.command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=1800,
                           env=env)
        assert r.returncode == 0, (step.command, r.stderr[-2000:])
        gone = missing(step.excerpt, r.stdout)
        assert gone is None, f"README shows {gone!r} after `{step.command}`; main printed:\n{r.stdout[-6000:]}"


def test_predict_help_gives_every_arguments_values_and_units():
    """Issue 29 item 5: help(npusim.predict) names every argument with its valid values, units and default."""
    doc = inspect.getdoc(npusim.predict)
    for name in inspect.signature(npusim.predict).parameters:
        assert re.search(rf"^\s*{name}: ", doc, re.M), name
    for value in (*PRESETS, *SYSTEMS.names(), *model_names()):
        assert value in doc, value
    assert all(word in doc for word in ("tokens", "seconds", "bytes", "fraction in [0, 1)", "--set"))
