"""The A16 sweep (DeepSeek-R1-class W8A8C8 decode on CloudMatrix384, plan r1-a3-decode-a16): batch x HBM bandwidth x
prompt length x a fourth axis, POINTS_PER_AXIS values each (10 -> 10,000 points; --axes 3 drops the fourth, 1,000
points). Prints, per mode (local processes, a Dask LocalCluster, serial), the wall time and the CPU time (user + sys
of this process and its workers: the machine may be shared, and CPU time is what load does not distort), then
whether the frames are identical, and the cost of one point in one process: cold (empty memos), a new point on the
fourth axis next to it, and a repeat.

Run: python benchmarks/sweep_speed.py [POINTS_PER_AXIS=10] [--axes 3|4] [--fourth acceptance|output]
                                      [--modes local,dask,serial] [--workers 2]

The fourth axis: `acceptance` (default), the MTP acceptance rate 0.50 .. 0.95, moves TPOT and throughput but no
layer (the layer memo serves it: the issue's "a layer result depends on fewer fields than a prediction"); `output`,
1,024 .. 10,240 output tokens, moves the mean decode context (input + output / 2) and so the attention kernels
themselves: pairs of prompt and output length with the same context share them, the rest is simulated anew. The
batch and bandwidth axes share the GEMMs and the tile traces (a decode attention's tiling reads no bandwidth). The
sweep's point cache is off and every mode starts from an empty kernel disk cache, so each mode computes everything
it reports.

Measured (2 local processes on the 2-core machine, shared with other work; CPU is the figure load does not distort
much, wall the one it does):
  main at fa3f4a8, 2026-12-06: acceptance 71 s wall, 139 s CPU (load ~3); output 155 s wall, 306 s CPU (load ~1),
    358 s wall, 365 s CPU (load ~3); output on a Dask LocalCluster of 2 workers 378 s wall, 484 s CPU (load ~3),
    frames identical to the local ones
  main at 831206a, 2026-12-06: acceptance 302 s wall, 218 s CPU (load ~3.5); output 276 s wall, 540 s CPU (load ~1.8)
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

import npusim
from npusim.sweeps import run as sweep_run
from npusim.sweeps.spec import SweepSpec

BASE = {"hw": "cloudmatrix384", "model": "deepseek-v3.1", "plan": "r1-a3-decode-a16", "output": 1024,
        "quant": "w8a8c8"}
BASE_KEYS = ("batch", "hbm.bandwidth", "input", "output", "plan.mtp.acceptance")


FOURTH = {"acceptance": lambda n: ("plan.mtp.acceptance", [round(0.5 + 0.45 * i / max(1, n - 1), 3) for i in range(n)]),
          "output": lambda n: ("output", [1024 * (i + 1) for i in range(n)])}


def grid(n: int, axes: int, fourth: str = "acceptance") -> dict:
    g = {"batch": [1024 * (i + 1) for i in range(n)],
         "hbm.bandwidth": [f"{1.2 + 0.2 * i:.1f}TB/s" for i in range(n)],
         "input": [1024 * (i + 1) for i in range(n)]}
    if axes == 4:
        key, values = FOURTH[fourth](n)
        g[key] = values
    return g


def cpu_seconds() -> float:
    """User + sys of this process and of its children that have ended (the worker processes of a mode)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def fresh_cache() -> None:
    """Every mode starts from an empty kernel disk cache (processes started after this inherit it)."""
    os.environ["NPUSIM_CACHE"] = tempfile.mkdtemp()


def timed(label: str, g: dict, **kw):
    fresh_cache()
    c0, t0 = cpu_seconds(), time.perf_counter()
    df = npusim.sweep(base=BASE, grid=g, name="bench", cache="off", progress=False, **kw)
    dt, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    print(f"{label:30s} {len(df)} points in {dt:7.1f} s wall, {cpu:7.1f} s CPU ({len(df) / dt:6.1f} points/s), "
          f"{(df['error'] != '').sum()} refused", flush=True)
    refused(df)
    return df


def refused(df) -> None:
    """The first refusal, so that a count of refused points is never a mystery."""
    errors = df[df["error"] != ""]
    if len(errors):
        row = errors.iloc[0]
        print(f"  first refused: {dict((k, row[k]) for k in BASE_KEYS if k in row)}: {row['error']}")


def dask_mode(g: dict, workers: int):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        print("dask.distributed not installed: pip install -e '.[dask]'")
        return None
    fresh_cache()  # before the workers start: they inherit it
    with LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        c0, t0 = cpu_seconds(), time.perf_counter()
        before = sum(client.run(cpu_seconds).values())
        df = npusim.sweep(base=BASE, grid=g, name="bench", cache="off", progress=False, scheduler=client)
        dt = time.perf_counter() - t0
        cpu = cpu_seconds() - c0 + sum(client.run(cpu_seconds).values()) - before
    print(f"{'Dask LocalCluster, ' + str(workers) + ' workers':30s} {len(df)} points in {dt:7.1f} s wall, "
          f"{cpu:7.1f} s CPU ({len(df) / dt:6.1f} points/s), {(df['error'] != '').sum()} refused", flush=True)
    refused(df)
    return df


def per_point(g: dict) -> None:
    """One process, empty memos: the first point cold, then a neighbour on the last axis, then a repeat."""
    fresh_cache()
    sweep_run.forget()
    points = SweepSpec("bench", BASE, g).expand()
    figures = []
    for p in (points[0], points[1], points[1]):
        t = time.process_time()
        row = sweep_run.evaluate(p)
        figures.append((time.process_time() - t) * 1e3)
        if row["error"]:
            print(f"  refused: {row['error']}")
    last = list(g)[-1]
    print(f"one point, CPU: cold {figures[0]:.0f} ms, new point sharing its kernels (next {last}) {figures[1]:.0f} ms, "
          f"repeat {figures[2]:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("n", nargs="?", type=int, default=10, help="points per axis")
    ap.add_argument("--axes", type=int, choices=(3, 4), default=4)
    ap.add_argument("--fourth", choices=sorted(FOURTH), default="acceptance")
    ap.add_argument("--modes", default="local", help="comma-separated: local, dask, serial")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    g = grid(args.n, args.axes, args.fourth)
    print(f"{os.cpu_count()} cores; {' x '.join(f'{k} ({len(v)})' for k, v in g.items())}")
    frames = {}
    for mode in args.modes.split(","):  # parallel modes first: the parent computes nothing there
        if mode == "local":
            frames[mode] = timed(f"{args.workers} local processes", g, workers=args.workers)
        elif mode == "dask":
            frames[mode] = dask_mode(g, args.workers)
        elif mode == "serial":
            frames[mode] = timed("serial", g, workers=1)
    frames = {k: v for k, v in frames.items() if v is not None}
    first = next(iter(frames), None)
    for mode, df in frames.items():
        if mode != first:
            print(f"{mode} == {first}:", df.equals(frames[first]))
    per_point(g)


if __name__ == "__main__":
    main()
