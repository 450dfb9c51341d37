"""The CLI's fixed costs (issue 30): `npusim --help`, `--version`, `npusim predict --help` and a warm `npusim predict`
(kernel disk cache filled by a first run), wall and CPU time, beside the same figures for a previous commit in one
run, as ratios (the machine is shared: interleaving the two trees exposes both to the same load).

Run: python benchmarks/startup_speed.py [--base COMMIT] [--repeat 5]

The previous commit is checked out as a git worktree (default: the commit in /tmp/base_commit, else HEAD~1) in
/tmp/npusim-startup-<commit>, and each tree runs as `python -m npusim.cli.main` with PYTHONPATH pointed at it, from a
scratch directory (so neither the working directory nor the installed copy is imported). Every figure is the median
of --repeat runs; CPU is user + sys of the child, the figure load distorts least. Each tree has its own empty kernel
cache (NPUSIM_CACHE), warmed by one `npusim predict` before the timed ones; the script says whether the two trees
print the same prediction.

Targets (issue 30): each --help and --version <= 0.3 s wall on an idle core, a warm predict <= 0.6 s.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
COMMANDS = {"npusim --help": ["--help"], "npusim --version": ["--version"],
            "npusim predict --help": ["predict", "--help"], "npusim predict (warm)": ["predict"]}


def default_base() -> str:
    marker = Path("/tmp/base_commit")
    return marker.read_text().strip() if marker.exists() else "HEAD~1"


def worktree(commit: str) -> Path:
    """A checkout of `commit` beside the repository (made once, then reused)."""
    sha = subprocess.run(["git", "-C", str(HERE), "rev-parse", commit], check=True, capture_output=True,
                         text=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"npusim-startup-{sha[:12]}"
    if not (path / "npusim").is_dir():
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", str(path), sha], check=True,
                       capture_output=True)
    return path


def timed(tree: Path, args: list[str], env: dict, cwd: str) -> tuple[float, float, str]:
    """(wall s, CPU s, stdout) of one `python -m npusim.cli.main ARGS` run of `tree`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "npusim.cli.main", *args], env={**env, "PYTHONPATH": str(tree)},
                         cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        sys.exit(f"{tree}: npusim {' '.join(args)} failed: {run.stderr.strip()}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, run.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=default_base(), help="the previous commit (default /tmp/base_commit or HEAD~1)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure, the median reported (default 5)")
    opts = ap.parse_args()
    trees = {"this tree": HERE, opts.base[:12]: worktree(opts.base)}
    scratch = tempfile.mkdtemp(prefix="npusim-startup-")
    envs = {name: {**os.environ, "NPUSIM_CACHE": tempfile.mkdtemp(prefix="npusim-startup-cache-")} for name in trees}
    printed = {name: timed(tree, ["predict"], envs[name], scratch)[2] for name, tree in trees.items()}  # warm caches
    figures = {}
    for label, args in COMMANDS.items():
        runs = {name: [] for name in trees}
        for _ in range(opts.repeat):  # interleaved, so that both trees see the same load
            for name, tree in trees.items():
                runs[name].append(timed(tree, args, envs[name], scratch)[:2])
        figures[label] = {name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
                          for name, r in runs.items()}
    new, old = trees
    print(f"load average {os.getloadavg()[0]:.1f}; median of {opts.repeat} runs; ratio = {old} / this tree")
    print(f"{'':24} {'this tree':>19} {old:>19} {'ratio':>15}")
    print(f"{'':24} {'wall s':>9} {'CPU s':>9} {'wall s':>9} {'CPU s':>9} {'wall':>7} {'CPU':>7}")
    for label, f in figures.items():
        (nw, nc), (ow, oc) = f[new], f[old]
        print(f"{label:24} {nw:9.3f} {nc:9.3f} {ow:9.3f} {oc:9.3f} {ow / nw:7.2f} {oc / nc:7.2f}")
    same = printed[new] == printed[old]
    print(f"npusim predict prints the same in both trees: {'yes' if same else 'no (a commit between them moved it)'}")


if __name__ == "__main__":
    main()
