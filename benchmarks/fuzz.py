"""The long run of the fuzz suite (tests/test_fuzz.py): every property with `--examples` generated cases instead of
CI's 150, random rather than derandomised, so each run explores new inputs. Prints the cases run and the wall time;
a failure prints hypothesis's smallest falsifying input, as in CI.

    python benchmarks/fuzz.py [--examples 2000] [-k override]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="generated cases per property (CI: 150)")
    parser.add_argument("-k", default="", help="only the properties whose names match (pytest -k)")
    args = parser.parse_args()
    env = {**os.environ, "NPUSIM_FUZZ_EXAMPLES": str(args.examples), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics",
           str(ROOT / "tests" / "test_fuzz.py")] + (["-k", args.k] if args.k else [])
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    cases = sum(int(m) for m in re.findall(r"- (\d+) passing examples", done.stdout))
    print(done.stdout[-4000:] if done.returncode else "")
    print(f"fuzz: {cases:,} generated cases in {wall:.0f} s ({args.examples} per property), "
          f"{'all refused or held as they should' if done.returncode == 0 else 'FAILED'}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
