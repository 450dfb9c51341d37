"""The CLI's slow paths (issue 30 item 2), CPU and wall time, beside the same figures for a previous commit in one
run, as ratios: a cold `npusim predict` of the default (empty kernel cache), the README's 128K `npusim plan` from an
empty cache and warm (the cache the cold run filled), and the README's 2K plan warm.

Run: python benchmarks/cold_paths.py [--base COMMIT | --base-tree DIR] [--repeat 1] [--only predict,128k,2k]

Each tree (this one, and the previous commit checked out as a git worktree in /tmp/npusim-startup-<commit>, default
the commit in /tmp/base_commit, as benchmarks/startup_speed.py does) runs as `python -m npusim.cli.main` with
PYTHONPATH pointed at it, from a scratch directory; the two trees alternate, figure by figure, so that both see the
same load. CPU is user + sys of the command and its worker processes (the plans' default 2 workers), the figure a
shared machine distorts least; wall is what a user waits on an idle one. A warm figure first fills its tree's own
kernel cache (NPUSIM_CACHE) with one untimed run; a cold one gets an empty cache each time. The script says whether
the two trees print the same plan (`--format json`, the plan file's path aside).

Targets (issue 30): cold predict <= 2 s CPU; 128K plan <= 60 s from an empty cache and <= 15 s warm; 2K plan <= 10 s
warm.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from startup_speed import HERE, default_base, timed, worktree

PLAN = ["plan", "--model", "deepseek-v3.2-exp", "--hw", "cloudmatrix384", "--format", "json"]
PLAN_128K = PLAN + ["--input", "131072", "--output", "1024", "--slo", "ttft=2s,tpot=30ms", "--quant", "w8a8c8"]
PLAN_2K = PLAN + ["--input", "2048", "--output", "256", "--slo", "ttft=2s,tpot=50ms", "--ranks", "16,32", "--mtp", "0",
                  "--requests", "40"]
# label -> (command, warm?, group): a group's warm figure reuses the cache its cold figure (or warm-up) filled
FIGURES = {"npusim predict (cold)": (["predict"], False, "predict"),
           "plan 128K (cold)": (PLAN_128K, False, "128k"),
           "plan 128K (warm)": (PLAN_128K, True, "128k"),
           "plan 2K (warm)": (PLAN_2K, True, "2k")}
TARGETS = {"npusim predict (cold)": "<= 2 s CPU", "plan 128K (cold)": "<= 60 s", "plan 128K (warm)": "<= 15 s",
           "plan 2K (warm)": "<= 10 s"}


def printed(stdout: str) -> str:
    """A plan's JSON without the fields naming its output file (each tree writes its own)."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return stdout
    if isinstance(doc, dict):
        for key in ("plan_file", "commands"):
            doc.pop(key, None)
    return json.dumps(doc, sort_keys=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=default_base(), help="the previous commit (default /tmp/base_commit or HEAD~1)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per figure, the median reported (default 1)")
    ap.add_argument("--base-tree", help="instead of --base: a directory holding npusim/, hardware/ and workloads/ "
                                        "(e.g. a worktree with one change reverted)")
    ap.add_argument("--only", default="predict,128k,2k", help="groups to run (default predict,128k,2k)")
    opts = ap.parse_args()
    groups = set(opts.only.split(","))
    base = (Path(opts.base_tree).name, Path(opts.base_tree).resolve()) if opts.base_tree else \
        (opts.base[:12], worktree(opts.base))
    trees = {"this tree": HERE, base[0]: base[1]}
    scratch = tempfile.mkdtemp(prefix="npusim-cold-")
    caches = {(name, g): tempfile.mkdtemp(prefix=f"npusim-cold-{g}-") for name in trees for g in groups}
    figures, same, made = {}, {}, [scratch, *caches.values()]
    for label, (args, warm, group) in FIGURES.items():
        if group not in groups:
            continue
        runs = {name: [] for name in trees}
        for name, tree in trees.items():
            env = {**os.environ, "NPUSIM_CACHE": caches[name, group]}
            if warm and not any(Path(caches[name, group]).iterdir()):
                timed(tree, args + _out(args, scratch, name), env, scratch)  # fill this tree's kernel cache
        outputs = {}
        for _ in range(opts.repeat):  # interleaved, so that both trees see the same load
            for name, tree in trees.items():
                cache = caches[name, group] if warm else tempfile.mkdtemp(prefix="npusim-cold-empty-")
                made.append(cache)
                wall, cpu, out = timed(tree, args + _out(args, scratch, name), {**os.environ, "NPUSIM_CACHE": cache},
                                       scratch)
                runs[name].append((wall, cpu))
                outputs[name] = printed(out)
                if not warm and group == "128k":  # the cold run leaves the cache its warm figure reuses
                    caches[name, group] = cache
        figures[label] = {name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
                          for name, r in runs.items()}
        same[label] = len(set(outputs.values())) == 1
    for path in made:
        shutil.rmtree(path, ignore_errors=True)
    new, old = trees
    print(f"load average {os.getloadavg()[0]:.1f}; median of {opts.repeat} run(s); ratio = {old} / this tree")
    print(f"{'':22} {'this tree':>19} {old:>19} {'ratio':>15}  {'target':>11}  same output")
    print(f"{'':22} {'wall s':>9} {'CPU s':>9} {'wall s':>9} {'CPU s':>9} {'wall':>7} {'CPU':>7}")
    for label, f in figures.items():
        (nw, nc), (ow, oc) = f[new], f[old]
        print(f"{label:22} {nw:9.2f} {nc:9.2f} {ow:9.2f} {oc:9.2f} {ow / nw:7.2f} {oc / nc:7.2f}  {TARGETS[label]:>11}"
              f"  {'yes' if same[label] else 'no'}")


def _out(args: list[str], scratch: str, name: str) -> list[str]:
    """A plan's --out in the scratch directory, one per tree (predict takes none)."""
    return ["--out", str(Path(scratch) / f"plan-{name.replace(' ', '-')}.yaml")] if args[0] == "plan" else []


if __name__ == "__main__":
    main()
