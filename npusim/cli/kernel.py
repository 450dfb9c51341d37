"""npusim kernel list | show | verify: a kernel's tiling on a chip, its buffers, pipes and roofline; its numerics.

`load_kernel(args)` turns --hw/--shape/--set (and tile options given in --shape) into (kernel, chip) for any
subcommand, e.g. the engine's `kernel sim`.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import TYPE_CHECKING

from npusim.cli.common import add_format, add_set, emit, parse_overrides, seed
from npusim.errors import NpusimError, as_written
from npusim.kernels.base import KERNELS, capacity
from npusim.spec.chip import load_chip

if TYPE_CHECKING:  # NumPy, pandas, the kernels' catalog and the engine load in the commands that use them, so
    # that building the parser (every --help) stays light
    from npusim.kernels.base import Kernel
    from npusim.spec.chip import Chip


VERIFY_ELEMENTS = 1 << 26  # a functional check's shape (the product of its sizes) in float64: 512 MiB an array at most


def parse_shape(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (x.strip() for x in (text or "").split(","))):
        key, sep, val = item.partition("=")
        if not sep:
            raise NpusimError(f"--shape item '{item}' must look like KEY=VALUE, e.g. m=4096,n=7168,k=2048")
        out[key.strip()] = val.strip()
    return out


def load_kernel(args) -> tuple[Kernel, Chip]:
    """(kernel, chip) from args.name, args.shape ('k=v,...'; option keys such as dtype or block_m allowed),
    args.hw and args.overrides."""
    from npusim.kernels import catalog

    chip = load_chip(args.hw, parse_overrides(getattr(args, "overrides", [])))
    return catalog.kernel(args.name, parse_shape(args.shape)), chip


def shape_named(run):
    """A kernel command whose refusals of the kernel's shape (the kernels call it 'shape', from the tiling or the
    trace alike, or by the key refused: 'layout', 'shape.counts') are named as the option the user wrote it in,
    --shape."""
    def named(args) -> None:
        try:
            run(args)
        except NpusimError as exc:
            from npusim.kernels import catalog  # noqa: F401 (fills KERNELS, which the run may not have loaded)

            keys = [f.name for f in dataclasses.fields(KERNELS[args.name])] if args.name in KERNELS else []
            raise as_written(exc, {k: {"field": "--shape"} for k in ["shape", *keys, *(f"shape.{k}" for k in keys)]}) \
                from None
    return named


def add_kernel_args(parser, hw: bool = True) -> None:
    parser.add_argument("name", help="kernel name (see 'npusim kernel list')")
    parser.add_argument("--shape", default="", help="shape and options, e.g. tokens=4096,keys=65536,topk=2048")
    if hw:
        parser.add_argument("--hw", default="910b2", help="chip name (default 910b2)")
        add_set(parser)
    add_format(parser)


def register(sub) -> None:
    p = sub.add_parser("kernel", help="kernel tilings: list, show (tiling, buffers, pipes, roofline), verify numerics")
    ks = p.add_subparsers(dest="kernel_command", metavar="SUBCOMMAND")
    lp = ks.add_parser("list", help="kernels with a tiling")
    add_format(lp)
    lp.set_defaults(run=run_list)
    sp = ks.add_parser("show", help="tiling, buffer use vs capacity, instructions per pipe, FLOPs, bytes, roofline")
    add_kernel_args(sp)
    sp.set_defaults(run=shape_named(run_show))
    vp = ks.add_parser("verify", help="traced execution vs float64 reference: per dtype scheme the shape, tolerance, "
                                      "max abs / rel error and PASS / FAIL (exit 1 on FAIL)")
    add_kernel_args(vp, hw=False)
    vp.add_argument("--seed", type=seed, default=0)
    vp.set_defaults(run=shape_named(run_verify))
    p.set_defaults(run=lambda args: p.print_help())


def run_list(args) -> None:
    import pandas as pd

    from npusim.functional.verify import VERIFY
    from npusim.kernels import catalog

    rows = [{"kernel": n, "shape keys": ", ".join(_keys(KERNELS[n])),
             "verify": n in VERIFY, "about": (KERNELS[n].__doc__ or "").strip().splitlines()[0]} for n in catalog.names()]
    emit(pd.DataFrame(rows), args.format)


def _keys(cls) -> list[str]:
    import dataclasses
    return [f.name for f in dataclasses.fields(cls)]


def run_show(args) -> None:
    import pandas as pd

    from npusim.engine.tune import tuned

    kern, chip = load_kernel(args)
    try:
        kern = tuned(kern, chip, "device").kernel  # the tiling `kernel sim` and a prediction run
    except NpusimError:
        pass  # no candidate runs: show the tiler's own, and below say by how much it overflows
    trace = kern.build(chip)
    cap = capacity(chip)
    roof = kern.roofline(chip)
    rows = [{"section": "buffer", "item": lvl, "value": used, "capacity": cap.get(lvl), "unit": "B",
             "used_pct": 100 * used / cap[lvl] if cap.get(lvl) else None} for lvl, used in trace.buffers.items()]
    for pipe, tot in trace.pipe_totals().items():
        rows.append({"section": "pipe", "item": pipe, "value": tot["instructions"], "unit": "instructions",
                     "bytes": tot["bytes"], "flops": tot["flops"]})
    rows.append({"section": "tiling", "item": "tiling", "value": str(trace.tiling)})
    rows.append({"section": "cores", "item": "groups", "value": len(trace.groups), "unit": str(trace.cores)})
    extra = {"kernel": trace.kernel, "chip": trace.chip, "shape": trace.shape, "flops": trace.flops,
             "hbm_bytes": trace.hbm_bytes, "roofline_us": round(roof.time * 1e6, 3), "bound": roof.bound}
    frame = pd.DataFrame(rows)  # JSON keeps a missing number null; the table and CSV show it blank
    emit(frame if args.format == "json" else frame.astype(object).fillna(""), args.format,
         title=f"{trace.kernel} on {trace.chip}", extra=extra)
    over = [lvl for lvl, used in trace.buffers.items() if cap.get(lvl) is not None and used > cap[lvl]]
    if over:
        kern.trace(chip)  # raises the NpusimError saying by how much


def run_verify(args) -> None:
    import numpy as np
    import pandas as pd

    from npusim.functional.verify import VERIFY, Used

    if args.name not in VERIFY:
        raise NpusimError(f"kernel '{args.name}' has no functional check yet; checked: "
                          f"{', '.join(sorted(VERIFY))}")
    try:
        shape = Used({k: int(v) for k, v in parse_shape(args.shape).items()})
    except ValueError:
        raise NpusimError(f"'{args.shape}' must give whole numbers, e.g. rows=8,dim=64", field="--shape") from None
    small = {k: v for k, v in shape.items() if v < 1}
    if small or math.prod(shape.values()) > VERIFY_ELEMENTS:
        raise NpusimError(f"'{args.shape}': every size must be at least 1" if small else
                          f"'{args.shape}' is too large to verify (the float64 check holds at most "
                          f"{VERIFY_ELEMENTS:,} elements: the product of the sizes given)", field="--shape")
    errs = VERIFY[args.name](shape, np.random.default_rng(args.seed))
    unread = sorted(set(shape) - set(shape.used))
    if unread:
        raise NpusimError(f"the {args.name} check has no key {', '.join(unread)}; it reads "
                          f"{', '.join(sorted(shape.used))}", field="--shape")
    dims = ",".join(f"{k}={v}" for k, v in shape.used.items())
    rows = [{"shape": dims, "scheme": e.scheme, "tolerance": e.tolerance, "max_abs": e.max_abs, "max_rel": e.max_rel,
             "exact": e.exact, "result": "PASS" if e.passed else "FAIL"} for e in errs]
    emit(pd.DataFrame(rows), args.format, title=f"{args.name}: traced execution vs float64 (max_rel <= tolerance, "
                                                f"index outputs exact)")
    if not all(e.passed for e in errs):
        sys.exit(1)
