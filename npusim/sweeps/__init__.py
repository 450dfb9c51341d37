"""Parameter sweeps: a grid or a list over any dotted field of hardware, model, plan and scenario -> DataFrame.

    import npusim
    df = npusim.sweep(base={"hw": "cloudmatrix384", "plan": "v32-a3-pd-a17", "input": 8192},
                      grid={"batch": [64, 128, 256], "hbm.bandwidth": ["1.6TB/s", "3.2TB/s"]})
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from npusim.results.tables import write_table
from npusim.sweeps.run import DiskCache, run_sweep
from npusim.sweeps.spec import SweepSpec

if TYPE_CHECKING:
    import pandas as pd


def sweep(spec: str | Path | SweepSpec | None = None, *, base: dict | None = None, grid: dict | None = None,
          points: list[dict] | None = None, name: str = "sweep", workers: int | None = None, scheduler=None,
          cache: str | Path | None = None, progress: bool = True) -> pd.DataFrame:
    """Predict every point of a sweep file (or of base/grid/points given here); one row per point, in order.
    workers: local processes (default: all cores); scheduler: a Dask address or Client; cache: a directory for
    completed points ('off' for none; default NPUSIM_SWEEP_CACHE or ~/.cache/npusim/sweeps)."""
    if spec is None:
        spec = SweepSpec(name, base or {}, grid or {}, points or [])
    elif not isinstance(spec, SweepSpec):
        spec = SweepSpec.load(spec)
    store = DiskCache.default() if cache is None else DiskCache(None if str(cache) == "off" else Path(cache))
    return run_sweep(spec, workers=workers, scheduler=scheduler, cache=store, progress=progress)


def save(frame: pd.DataFrame, spec: SweepSpec, out: str | Path, figures: bool = True) -> list[Path]:
    """The table as CSV (and Parquet when pyarrow is installed) and the standard figures, in directory `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = write_table(frame, out / spec.name)
    if not figures:
        return written
    from npusim.sweeps.figures import write_figures  # matplotlib loads only when a figure is drawn, not in workers

    return written + write_figures(frame, spec, out)


__all__ = ["SweepSpec", "save", "sweep"]
