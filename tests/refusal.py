"""The CLI run in this process, as a user's command line (far cheaper than a subprocess, so the refusal tests and the
fuzz suite can run thousands of cases), and the one check of a refusal: exit 2, one line on stderr, no traceback,
the file and field named."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

from npusim.cli.main import main


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def run(*argv) -> Outcome:
    """`npusim ARGV...` in this process. Any exception other than the CLI's own exit escapes: that is the bug."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse's refusals
            code = exc.code if isinstance(exc.code, int) else 1
    return Outcome(code, out.getvalue(), err.getvalue())


def assert_refused(r: Outcome, *needles: str) -> None:
    """Refused as the house rules say: exit 2 and one sentence (progress lines aside) naming what is given."""
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr)
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.replace("\r", "\n").splitlines() if line.strip() and not line.startswith("sweep ")]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
