"""`npusim kernel sim NAME --hw CHIP --shape ...`: time one kernel launch on the engine, optionally as a Chrome trace.

The `kernel` command group belongs to npusim/cli/kernel.py (list/show/verify); this module adds its `sim` action to
that group, or creates the group when kernel.py is absent. Modules register in name order, so kernel.py runs first.
"""

from __future__ import annotations

import argparse
import dataclasses

from npusim.cli import common
from npusim.cli.defaults import L2_STATES, LAUNCH_MODES
from npusim.cli.kernel import add_kernel_args, shape_named
from npusim.errors import NpusimError
from npusim.kernels.base import KERNELS
from npusim.spec.chip import load_chip


def register(sub) -> None:
    actions = _kernel_actions(sub)
    p = actions.add_parser("sim", help="simulate one kernel launch: time, pipe busy fractions, bound, roofline")
    add_kernel_args(p)  # name, --hw, --shape (dims in order or KEY=VALUE, options such as dtype=fp16), --set
    p.add_argument("--launch", choices=LAUNCH_MODES, default="eager",
                   help="launch overhead added (default eager); device = one standalone launch's device time, as "
                        "msprof's Task Duration counts it")
    p.add_argument("--l2", choices=L2_STATES, default="cold",
                   help="L2 at the launch (default cold: inputs from HBM, as inside a model step); warm = a "
                        "microbenchmark replay's, its footprint resident when it fits")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome trace (open in Perfetto or chrome://tracing)")
    p.set_defaults(run=shape_named(run_sim))


def _kernel_actions(sub) -> argparse._SubParsersAction:
    """The sub-action group of `npusim kernel`, created here if kernel.py has not made it."""
    parser = sub.choices.get("kernel")
    if parser is None:
        parser = sub.add_parser("kernel", help="kernels: tilings, traces, simulation")
        return parser.add_subparsers(dest="kernel_command", metavar="ACTION", required=True)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return parser.add_subparsers(dest="kernel_command", metavar="ACTION", required=True)


def parse_shape(cls, text: str) -> dict[str, str]:
    """Shape and options keyed by field name; bare values are the kernel's dims in order ('6144,6144,6144')."""
    dims = [f.name for f in dataclasses.fields(cls) if f.name not in cls.options]
    out: dict[str, str] = {}
    items = [t.strip() for t in text.split(",") if t.strip()]
    for i, item in enumerate(items):
        key, sep, value = item.partition("=")
        if sep:
            out[key.strip()] = value.strip()
        elif i < len(dims):
            out[dims[i]] = item
        else:
            raise NpusimError(f"--shape has {len(items)} values but kernel {cls.name} has {len(dims)} dims "
                              f"({', '.join(dims)})")
    return out


def run_sim(args) -> None:
    import pandas as pd

    from npusim.engine import simulate_timeline, write_chrome_trace
    from npusim.engine.l2state import at_launch
    from npusim.engine.tune import tuned
    from npusim.kernels import catalog  # fills KERNELS, read below

    chip = load_chip(args.hw, common.parse_overrides(args.overrides))
    cls = KERNELS.get(args.name)
    kernel = catalog.kernel(args.name, parse_shape(cls, args.shape) if cls else {})
    best = tuned(kernel, chip, args.launch, lambda k: at_launch(k.trace(chip), chip, args.l2))
    trace = best.trace
    if args.trace:
        result, timeline = simulate_timeline(trace, chip, launch=args.launch)
        write_chrome_trace([timeline], args.trace)
    else:
        result = best.result
    frame = pd.DataFrame([{"pipe": name, "busy_pct": 100 * v} for name, v in result.busy.items()]
                         + [{"pipe": f"{name} (shared)", "busy_pct": 100 * v} for name, v in result.servers.items()])
    if args.format == "json":  # numbers, each key naming its unit
        extra = {"time_ms": result.time * 1e3, "launch_us": result.launch * 1e6, "bound": result.bound,
                 "achieved_tflops": result.flops_per_s / 1e12, "achieved_hbm_gb_s": result.hbm_bytes_per_s / 1e9,
                 "roofline_ms": result.roofline * 1e3, "roofline_bound": result.roofline_bound,
                 "times_roofline": result.time / result.roofline, "tiling": dict(trace.tiling),
                 "candidate_tilings": best.tried,
                 "engine_events": result.events, "extrapolated_pct": 100 * result.extrapolated,
                 "cores": sum(g.copies for g in trace.groups), "folded_groups": len(trace.groups)}
    else:
        frame["busy_pct"] = frame["busy_pct"].round(1)
        extra = {
            "time": f"{result.time * 1e3:.4f} ms (launch {result.launch * 1e6:.1f} us)",
            "bound": result.bound,
            "achieved": f"{result.flops_per_s / 1e12:.1f} TFLOPS, HBM {result.hbm_bytes_per_s / 1e9:.0f} GB/s",
            "roofline": f"{result.roofline * 1e3:.4f} ms ({result.roofline_bound}); simulated = "
                        f"{result.time / result.roofline:.2f} x roofline",
            "tiling": ", ".join(f"{k}={v}" for k, v in trace.tiling.items())
                      + (f" (the fastest of {best.tried} candidate tilings)" if best.tried > 1 else ""),
            "engine": f"{result.events} events, {100 * result.extrapolated:.0f} % of the time extrapolated, "
                      f"{sum(g.copies for g in trace.groups)} cores as {len(trace.groups)} folded groups "
                      f"({' + '.join(str(g.copies) for g in trace.groups)})",
        }
    if args.trace:
        extra["trace"] = args.trace
    title = f"{args.name} {', '.join(f'{k}={v}' for k, v in result.shape.items())} on {chip.name} ({trace.dtype})"
    common.emit(frame, args.format, title=title, extra=extra)
