"""`npusim sweep SWEEP.yaml`: predict a grid or list of points, in local processes or on a Dask cluster."""

from __future__ import annotations

from pathlib import Path

from npusim.cli import common
from npusim.errors import NpusimError

SHOWN = ("ttft_s", "tpot_s", "decode_tokens_per_s_per_chip", "decode_usd_per_mtok", "decode_system_joules_per_token",
         "error")


def register(sub) -> None:
    p = sub.add_parser("sweep", help="predict a grid or list over any dotted field; CSV + Parquet and "
                                     "figures")
    p.add_argument("file", help="sweep YAML (see workloads/sweeps/)")
    p.add_argument("--out", default=None, help="output directory (default sweeps/<name>)")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: all cores; 1 = serial)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run on a Dask distributed cluster, e.g. tcp://10.0.0.1:8786 (pip install 'npusim[dask]')")
    p.add_argument("--cache", default=None, help="completed-point cache directory, or 'off' "
                                                 "(default NPUSIM_SWEEP_CACHE or ~/.cache/npusim/sweeps)")
    p.add_argument("--no-figures", action="store_true", help="write the table only")
    common.add_format(p)
    p.set_defaults(run=run)


def run(args) -> None:
    from npusim.sweeps import SweepSpec, save, sweep  # here: building the parser (every --help) stays light

    spec = SweepSpec.load(args.file)
    spec.expand()  # refuse a bad file before any work
    frame = sweep(spec, workers=args.workers, scheduler=args.scheduler, cache=args.cache)
    written = save(frame, spec, args.out or Path("sweeps") / spec.name, figures=not args.no_figures)
    params = [c for c in frame.columns if c in set(spec.grid) | {k for p in spec.points for k in p}]
    shown = frame[params + [c for c in SHOWN if c in frame]]
    common.emit(shown.round(4), args.format, title=f"sweep {spec.name}: {len(frame)} points",
                extra={"written": ", ".join(map(str, written))})
    refused = frame["error"].astype(bool)
    if refused.all():
        raise NpusimError(f"every one of its {len(frame)} points was refused (the first: {frame['error'].iloc[0]})",
                          file=spec.file)
