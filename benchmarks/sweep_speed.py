"""A 1,000-point sweep (DeepSeek-R1-class decode on CloudMatrix384, A16 plan: batch x HBM bandwidth x prompt length)
run serially, in 2 local processes and on a 2-worker Dask LocalCluster (when dask.distributed is installed); prints
the wall time of each and whether the three DataFrames are identical.

Run: python benchmarks/sweep_speed.py [POINTS_PER_AXIS=10]   (10 -> 1,000 points; the point cache is off)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import npusim

n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
BASE = {"hw": "cloudmatrix384", "model": "deepseek-v3.1", "plan": "r1-a3-decode-a16", "output": 1024,
        "quant": "w8a8c8"}
GRID = {"batch": [1024 * (i + 1) for i in range(n)],
        "hbm.bandwidth": [f"{1.2 + 0.2 * i:.1f}TB/s" for i in range(n)],
        "input": [1024 * (i + 1) for i in range(n)]}


def fresh_cache() -> None:
    """Every mode starts from an empty kernel disk cache (processes started after this inherit it)."""
    os.environ["NPUSIM_CACHE"] = tempfile.mkdtemp()


def timed(label, **kw):
    t0 = time.perf_counter()
    df = npusim.sweep(base=BASE, grid=GRID, name="bench", cache="off", progress=False, **kw)
    dt = time.perf_counter() - t0
    print(f"{label:28s} {len(df)} points in {dt:7.1f} s ({len(df) / dt:6.1f} points/s), "
          f"{(df['error'] != '').sum()} refused")
    return df


def main() -> None:
    """Parallel modes first: the parent computes nothing there, so the serial run cannot warm their memo."""
    print(f"{os.cpu_count()} cores")
    fresh_cache()
    local = timed("2 local processes", workers=2)
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        print("dask.distributed not installed: pip install -e '.[dask]'")
        dask = None
    else:
        fresh_cache()
        with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \
                Client(cluster) as client:
            dask = timed("Dask LocalCluster, 2 workers", scheduler=client)
    fresh_cache()
    serial = timed("serial", workers=1)
    print("local == serial:", local.equals(serial))
    if dask is not None:
        print("dask == serial:", dask.equals(serial))


if __name__ == "__main__":
    main()
