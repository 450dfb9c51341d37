"""`npusim profile FILE`: a user's msprof profile against npusim, per op; `--fit` calibrates the chip to it.

FILE is an op_summary_*.csv, a kernel_details.csv, an msprof op OpBasicInfo*.csv, or a directory holding them
(reading: npusim.profiles.msprof; mapping onto kernels: .mapping; comparison: .compare; fitting: .fit).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from npusim.cli import common
from npusim.cli.kernel import parse_shape
from npusim.errors import NpusimError, as_written
from npusim.spec.chip import CHIPS, load_chip

if TYPE_CHECKING:  # pandas, matplotlib, the profile readers and the kernels load where used: every --help stays light
    import pandas as pd

    from npusim.profiles import compare, fit
    from npusim.profiles.msprof import Profile
    from npusim.spec.chip import Chip

TIMES = ("measured: msprof Task Duration, the device time of one launch without the host's launch cost (median of "
         "the launches); predicted: npusim's engine time of the kernel in launch mode device, the trace plus the "
         "chip's overheads.task_dispatch and core_start (kernel sim --launch device)")


def register(sub) -> None:
    p = sub.add_parser("profile", help="an msprof profile (op_summary / kernel_details / OpBasicInfo) measured vs "
                                       "predicted per op; --fit calibrates the chip's efficiencies to it")
    p.add_argument("file", help="op_summary_*.csv, kernel_details.csv, OpBasicInfo*.csv, or a directory of them")
    p.add_argument("--hw", default="910b2", help="the chip the profile ran on (default 910b2)")
    common.add_set(p)
    p.add_argument("--shape", default="", help="msprof op (OpBasicInfo, no shapes recorded): the op's shape in "
                                               "npusim keys, e.g. batch=16,tokens=5,keys=3072,heads=64,dtype=fp16")
    p.add_argument("--kernel", default=None, help="with --shape: the npusim kernel (default: the op's OP Type's)")
    p.add_argument("--save", metavar="DIR", help="write profile_ops / profile_unmapped (CSV, + Parquet with "
                                                 "pyarrow) and profile_ops.png there")
    p.add_argument("--fit", action="store_true", help="fit the chip's efficiency / overhead parameters that the "
                                                      "mapped kernels read, and write them as an overlay chip file")
    p.add_argument("--out", metavar="CHIP.yaml", help="--fit: the overlay to write (default <hw>-fitted.yaml)")
    p.add_argument("--params", default="", help="--fit: fit these dotted fields only, e.g. efficiency.cube")
    common.add_format(p)
    p.set_defaults(run=run)


def run(args) -> None:
    from npusim.profiles import compare
    from npusim.profiles.msprof import read_profile

    overrides = common.parse_overrides(args.overrides)
    chip = load_chip(args.hw, overrides)
    profile = read_profile(args.file)
    shape = parse_shape(args.shape) if args.shape else None
    try:
        _check_shape_use(profile, shape, args.kernel)
        ops, skipped = compare.group(profile, shape, args.kernel)
        results, refused = compare.predict(ops, chip)
    except NpusimError as exc:  # the shape the user gave is refused as the option that gave it
        raise (as_written(exc, {"shape": {"field": "--shape"}}) if shape else exc) from None
    table, unmapped = compare.op_table(results), compare.skipped_table(skipped + refused)
    fitted = _calibrate(args, profile, [op for op, _ in results], bool(overrides)) if args.fit else None
    if fitted is not None:
        table = compare.with_fitted(table, fitted.times)
    extra = _summary(profile, chip, table, unmapped, fitted)
    title = f"{profile.kind} {profile.path} on {chip.name}"
    if args.save:
        extra["wrote"] = ", ".join(map(str, _save(Path(args.save), table, unmapped, title)))
    _emit(args.format, table, unmapped, extra, title)


def _check_shape_use(profile: Profile, shape, kernel) -> None:
    from npusim.kernels import catalog
    from npusim.profiles.mapping import kernel_for

    if not (shape or kernel):
        return
    if profile.kind != "OpBasicInfo":
        raise NpusimError("--shape / --kernel describe msprof op's single op (OpBasicInfo); an op summary records "
                          "its own shapes", file=profile.path, field="--shape")
    names = sorted({x.op_type for x in profile.launches})
    if len(names) > 1:
        raise NpusimError(f"holds {len(names)} different ops ({', '.join(names)}) but --shape describes one: "
                          "point at one op's directory", file=profile.path, field="--shape")
    name = kernel or kernel_for(names[0])
    if name is None:
        raise NpusimError(f"npusim has no kernel for OP Type {names[0]}: name one with --kernel", field="--kernel")
    catalog.kernel(name, shape or {})  # the shape's keys and values, checked before anything runs


def _calibrate(args, profile: Profile, ops: list[compare.Op], overridden: bool) -> fit.Calibration:
    from npusim.profiles import fit

    if "/" in args.hw or args.hw.endswith((".yaml", ".yml")):
        raise NpusimError("--fit writes an overlay that inherits a shipped chip: name one with --hw "
                          f"({', '.join(CHIPS.names())})", field="--hw")
    if overridden:
        raise NpusimError("--fit with --set: the overlay would not hold the --set values; write them in a chip "
                          "file, or fit without them", field="--set")
    if not ops:
        raise NpusimError("no op of the profile maps onto an npusim kernel: nothing to fit", file=profile.path)
    only = [p.strip() for p in args.params.split(",") if p.strip()]
    return fit.calibrate(args.hw, ops, profile.path, args.out or f"{args.hw}-fitted.yaml", only or None)


def _summary(profile: Profile, chip: Chip, table: pd.DataFrame, unmapped: pd.DataFrame, fitted) -> dict:
    from npusim.profiles.mapping import COMMUNICATION

    mapped_us = (table["mean_us"] * table["launches"]).sum()
    comm_us = unmapped.loc[unmapped["reason"] == COMMUNICATION, "device_us"].sum()
    compute_us = mapped_us + unmapped["device_us"].sum() - comm_us
    extra = {"profile": f"{len(profile.launches)} launches in {len(profile.files)} file(s); "
                        f"{int(table['launches'].sum())} mapped onto {len(table)} distinct kernel shapes, "
                        f"{100 * mapped_us / compute_us if compute_us else 0:.1f} % of the compute device time "
                        f"(communication: {comm_us / 1e3:.1f} ms, not mapped)",
             "times": TIMES}
    freqs = {x.freq_mhz for x in profile.launches if x.freq_mhz}
    if freqs and any(abs(f * 1e6 / chip.clock - 1) > 0.01 for f in freqs):
        extra["clock"] = (f"the profile ran at {', '.join(f'{f:g}' for f in sorted(freqs))} MHz, {chip.name}'s clock "
                          f"is {chip.clock / 1e6:g} MHz (--set clock=... to match)")
    if len(table):
        extra["median_abs_error_pct"] = round(float(table['error_pct'].abs().median()), 1)
        extra["ops_compared"] = len(table)
    if fitted is not None:
        extra["fitted"] = "; ".join(f"{p.path} {p.text(p.value, 4)} -> {p.text(v, 4)}"
                                    for p, v in fitted.fit.params)
        for (p, _), rows in zip(fitted.fit.params, fitted.fit.rests_on):
            extra[f"{p.path} rests on"] = f"{len(rows)} rows: " + "; ".join(rows)
        for i, text in enumerate(fitted.fit.refused):
            extra[f"not fitted {i + 1}"] = text
        extra["median_abs_error_after_fit_pct"] = round(float(table['fitted_error_pct'].abs().median()), 1)
        extra["chip written"] = f"{fitted.path} (use --hw {fitted.path})"
        for i, text in enumerate(fitted.fit.warnings()):
            extra[f"warning {i + 1}"] = text
    return extra


def _save(out: Path, table, unmapped, title: str) -> list[Path]:
    from npusim.profiles.figure import scatter
    from npusim.results.tables import write_table

    out.mkdir(parents=True, exist_ok=True)
    written = write_table(table, out / "profile_ops") + write_table(unmapped, out / "profile_unmapped")
    if len(table):
        written.append(scatter(table, out / "profile_ops.png", title, table.get("fitted_us")))
    return written


def _emit(fmt: str, table, unmapped, extra: dict, title: str) -> None:
    from npusim.profiles import compare

    if fmt != "table":
        extra = {**extra, "unmapped": unmapped.to_dict("records"),
                 "by_kernel": compare.by_kernel(table).to_dict("records")}
        common.emit(table, fmt, title=title, extra=extra)
        return
    if not len(table):
        print(f"{title}\nno op of the profile maps onto an npusim kernel (reasons below)")
    else:
        common.emit(table.drop(columns=["note"]).round(2), fmt, title=title)
        print("\nmedian |error| by kernel")
        common.emit(compare.by_kernel(table).round(1), fmt)
    notes = table[table["note"] != ""][["op", "shape", "note"]]
    if len(notes):
        print("\nassumptions")
        common.emit(notes, fmt)
    if len(unmapped):
        print("\nnot mapped (npusim cannot time these)")
        common.emit(unmapped.round(2), fmt)
    print()
    for key, value in extra.items():
        print(f"{key}: {value}")
