"""Running a sweep: each point predicted once (cached on disk by content hash), locally in processes or on a Dask
cluster, into one DataFrame whose rows are in the sweep's point order whatever ran them.

Garbage collection: a sweep's process keeps growing memos (specs, tile traces, kernel and layer results), and
CPython's full collections traverse every live object, so with automatic collection a 10,000-point sweep spent about
a quarter of its CPU in the collector re-reading the memos. While points run (`collecting`), automatic collection
is off; after each point one collection frees what the point left in reference cycles (few: a finished simulation
is freed by reference counting) and `gc.freeze()` moves the survivors (the memos' new entries) out of the
collector's sight, so the next collection reads only what the next point allocates; a run freezes what lives when
it starts as well. Frozen objects are still freed by reference counting when the memos drop them (they hold no
reference cycles: tests/test_memo.py checks it).
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
import os
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pandas as pd

import npusim
from npusim import api
from npusim.errors import NpusimError
from npusim.progress import progress as progress_bar
from npusim.results.cost import CostParams, cost
from npusim.spec import catalog
from npusim.spec.catalog import data_root
from npusim.spec.system import load_system
from npusim.sweeps.spec import Point, SweepSpec


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """Hash of the simulator's code and data files: a cached point is reused only if nothing that made it changed."""
    h = hashlib.sha256(npusim.__version__.encode())
    package, root = Path(npusim.__file__).parent, data_root()
    trees = [(package, "*.py"), (root / "hardware", "*.yaml"), (root / "workloads", "*.yaml")]
    for base, pattern in trees:
        for f in sorted(base.rglob(pattern)):
            h.update(str(f.relative_to(base)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def point_key(point: Point) -> str:
    text = json.dumps([fingerprint(), point.args, point.overrides], default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def evaluate(point: Point, params: CostParams = CostParams()) -> dict:
    """One row: the point's parameters, then predict's summary, cost and roofline inputs, or the refusal."""
    args = dict(point.args)
    row: dict = {**point.params(), "error": ""}
    try:
        p = api.predict(**args, overrides=dict(point.overrides))
        chip = load_system(p.system, api.split_overrides(p.overrides)["hw"]).chip_spec
    except NpusimError as exc:
        row["error"] = str(point.named(exc))
        return row
    except Exception as exc:  # a simulator bug, not a refusal: name the point that found it
        raise RuntimeError(f"predict failed on sweep point {point.params()}: {exc!r}") from exc
    row.update(p.summary())
    row.update(cost(p, params).as_dict())
    row["chips"] = p.prefill_chips + p.decode_chips
    row["peak_flops_per_rank"] = chip.peak_cube_flops("bf16")  # a rank is a die, and the chip's figures are per die
    row["hbm_bandwidth_per_rank"] = chip.hbm.bandwidth
    for phase in p.phases:
        step = getattr(p, phase)
        a = step.activity
        row[f"{phase}_flops_per_rank"] = a.cube_flops + a.vector_flops
        row[f"{phase}_hbm_bytes_per_rank"] = a.hbm_bytes
        row[f"{phase}_step_s"] = step.time
    return row


def forget() -> None:
    """Empty every in-process memo a prediction fills (specs, rank steps, parameter counts, tile traces, engine
    layouts, kernel results, op times, layer times): the next point runs cold, as in a fresh process (benchmarks,
    and the tests that compare with unmemoised runs)."""
    from npusim.engine import layout
    from npusim.engine.result import clear_memo
    from npusim.graph import accounting
    from npusim.parallel import optime, shard, step
    catalog.clear_loaded()
    shard.clear_memo()
    accounting.parameters.cache_clear()
    optime.clear_memos()
    layout.clear()
    clear_memo()
    step.clear_layer_memo()


@dataclass(frozen=True)
class DiskCache:
    """Completed rows as JSON files named by point key; writes are atomic, so an interrupted sweep resumes."""

    directory: Path | None

    @classmethod
    def default(cls) -> DiskCache:
        where = os.environ.get("NPUSIM_SWEEP_CACHE", str(Path.home() / ".cache" / "npusim" / "sweeps"))
        return cls(None if where == "off" else Path(where))

    def get(self, key: str) -> dict | None:
        if self.directory is None:
            return None
        path = self.directory / key[:2] / f"{key}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, row: dict) -> None:
        if self.directory is None:
            return
        path = self.directory / key[:2] / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(row))
        os.replace(tmp, path)


def chunksize(points: int, workers: int, axes: tuple[int, ...] = ()) -> int:
    """Points per task: runs of grid neighbours (the last axis fastest) share layers, kernels and tile traces in
    one worker's memos, and 16 tasks per worker keep the load balanced. `axes` are the grid's sizes: a run is a
    whole number of blocks of its trailing axes (e.g. every prompt x output length of one batch and bandwidth),
    so no block is cut between two workers that would each simulate the kernels its halves share."""
    target = max(1, points // (16 * workers))
    block = 1
    for n in reversed(axes):
        if block * n > target:
            break
        block *= n
    return target // block * block


def runs(todo: list[int], size: int) -> list[list[int]]:
    """The indices to compute, grouped by the window of `size` points of the whole sweep they fall in (a resumed
    sweep's runs stay aligned with the grid)."""
    return [list(group) for _, group in itertools.groupby(todo, key=lambda i: i // size)]


@contextmanager
def collecting():
    """While a run of points is evaluated: automatic garbage collection off (see the module) and the spec files
    pinned (read once, catalog.pin_files); at the end the frozen objects are handed back to the collector and its
    state restored. What lives when the run starts is frozen too: a Dask worker's runs follow one another, and the
    first collection of each would otherwise read every memo the runs before it filled."""
    enabled = gc.isenabled()
    gc.disable()
    gc.freeze()
    catalog.pin_files()
    try:
        yield
    finally:
        catalog.pin_files(False)
        gc.unfreeze()
        if enabled:
            gc.enable()


def evaluate_collected(point: Point) -> dict:
    """`evaluate`, then the point's garbage collected and the survivors frozen (inside `collecting`, or in a worker
    process that runs nothing else)."""
    row = evaluate(point)
    gc.collect()
    gc.freeze()
    return row


def evaluate_run(points: list[Point]) -> list[dict]:
    """A run of neighbouring points in one worker, in order."""
    with collecting():
        return [evaluate_collected(p) for p in points]


def _worker_start() -> None:
    """A pool worker only evaluates points: evaluate_collected collects after each, and the files stay pinned."""
    gc.disable()
    catalog.pin_files()


def evaluate_points(points: list[Point]) -> list[dict]:
    """A run of neighbouring points in a pool worker (started by _worker_start), in order."""
    return [evaluate_collected(p) for p in points]


def _local(points: list[Point], todo: list[int], axes: tuple[int, ...], workers: int):
    if workers <= 1:
        with collecting():
            yield from (evaluate_collected(points[i]) for i in todo)
        return
    work = [[points[i] for i in run] for run in runs(todo, chunksize(len(points), workers, axes))]
    with ProcessPoolExecutor(max_workers=workers, initializer=_worker_start) as pool:
        for rows in pool.map(evaluate_points, work):
            yield from rows


def _dask(points: list[Point], todo: list[int], axes: tuple[int, ...], scheduler):
    """On a Dask distributed cluster (`pip install npusim[dask]`); `scheduler` is an address or a Client."""
    try:
        from distributed import Client
    except ImportError:
        raise NpusimError("needs dask.distributed: pip install 'npusim[dask]'", field="--scheduler") from None
    client = scheduler if isinstance(scheduler, Client) else None
    try:
        client = client or Client(scheduler, timeout="5s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise NpusimError(f"cannot reach the Dask scheduler '{scheduler}' ({exc})", field="--scheduler") from None
    try:
        size = chunksize(len(points), max(1, len(client.scheduler_info().get("workers", {}))), axes)
        work = [[points[i] for i in run] for run in runs(todo, size)]  # as the local pool: neighbours share memos
        futures = client.map(evaluate_run, work, pure=False)
        for fut in futures:  # in point order; the cluster runs them in any order
            yield from fut.result()
    finally:
        if client is not scheduler:
            client.close()


def run_sweep(spec: SweepSpec, *, workers: int | None = None, scheduler=None, cache: DiskCache | None = None,
              progress: bool = True) -> pd.DataFrame:
    points = spec.expand()
    cache = cache or DiskCache.default()
    keys = [point_key(p) for p in points]
    rows: list[dict | None] = [cache.get(k) for k in keys]
    todo = [i for i, r in enumerate(rows) if r is None]
    bar = progress_bar(len(points), f"sweep {spec.name}", "point", enabled=progress, initial=len(points) - len(todo))
    axes = tuple(len(v) for v in spec.grid.values())
    results = (_dask(points, todo, axes, scheduler) if scheduler is not None
               else _local(points, todo, axes, workers or os.cpu_count() or 1))
    try:
        for i, row in zip(todo, results):
            rows[i] = row
            cache.put(keys[i], row)
            bar.update()
    finally:
        bar.close()
    return pd.DataFrame(rows)
