"""`npusim hw`: list, show and compare the chip and system files."""

from __future__ import annotations

from npusim.cli import common
from npusim.errors import NpusimError, did_you_mean
from npusim.spec import units
from npusim.spec.chip import CHIPS, Chip, load_chip
from npusim.spec.schema import leaves
from npusim.spec.system import SYSTEMS, load_system


def register(sub) -> None:
    hw = sub.add_parser("hw", help="hardware: chips and systems")
    cmds = hw.add_subparsers(dest="hw_command", metavar="ACTION", required=True)

    p = cmds.add_parser("list", help="chips and systems with headline peaks, HBM and interconnect")
    common.add_format(p)
    p.set_defaults(run=run_list)

    p = cmds.add_parser("show", help="every field of one chip or system, with derived figures")
    p.add_argument("name", help="chip or system name (see 'npusim hw list') or a YAML path")
    p.add_argument("--sources", action="store_true", help="show where each number came from")
    common.add_set(p)
    common.add_format(p)
    p.set_defaults(run=run_show)

    p = cmds.add_parser("diff", help="two chips or two systems side by side, differences marked")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--all", action="store_true", help="also list the fields that are equal")
    common.add_format(p)
    p.set_defaults(run=run_diff)


def load(name: str, overrides: dict[str, str] | None = None):
    """A chip or a system by name (or YAML path, by the directory it lives in)."""
    if name in CHIPS.names() or "chips" in name.replace("\\", "/").split("/"):
        return load_chip(name, overrides)
    if name in SYSTEMS.names() or "systems" in name.replace("\\", "/").split("/"):
        return load_system(name, overrides)
    raise NpusimError(f"unknown chip or system '{name}'" + did_you_mean(name, CHIPS.names() + SYSTEMS.names()))


def _fmt(value, meta: dict) -> str:
    if meta.get("kind") == "quantity":
        return units.format(value, meta["dim"])
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def rows(spec) -> list[dict]:
    """Field rows (path, value, source) of a chip or system; a system also lists its chip under 'chip.'."""
    out = [{"field": path, "value": _fmt(v, meta), "source": spec.provenance.sources.get(path, "")}
           for path, v, meta in leaves(spec)]
    if isinstance(spec, Chip):
        out += [{"field": name, "value": units.format(v, dim) if dim != "number" else f"{v:.1f}", "source": f"derived: {how}"}
                for name, v, dim, how in spec.derived()]
    else:
        out += [{"field": f"chip.{r['field']}", **{k: r[k] for k in ("value", "source")}} for r in rows(spec.chip_spec)]
    return out


def _headline(name: str, kind: str, chip: Chip, packages: int, ranks: int, interconnect: str) -> dict:
    """One `hw list` row: figures for `packages` packages of `chip`."""
    eight_bit = "fp8" if "fp8" in chip.aic.cube.flop_per_cycle else "int8"
    return {"name": name, "kind": kind, "family": chip.family, "dies": ranks,
            "AIC/AIV per die": f"{chip.aic.count}/{chip.aiv.count}", "clock": units.format(chip.clock, "frequency"),
            "BF16 TFLOPS": round(packages * chip.package_peak_cube_flops("bf16") / 1e12, 1),
            "8-bit TFLOPS": round(packages * chip.package_peak_cube_flops(eight_bit) / 1e12, 1),
            "HBM": units.format(packages * chip.package_hbm_capacity, "bytes", 3),
            "HBM BW": units.format(packages * chip.package_hbm_bandwidth, "bandwidth", 3),
            "interconnect": interconnect}


def run_list(args) -> None:
    import pandas as pd

    records = []
    for name in CHIPS.names():
        c = load_chip(name)
        link = f"die-to-die {units.format(c.die_to_die, 'bandwidth', 3)}" if c.die_to_die else ""
        records.append(_headline(name, "chip", c, 1, c.dies, link))
    for name in SYSTEMS.names():
        s = load_system(name)
        tiers = ", ".join(f"{t}: {units.format(tier.bandwidth, 'bandwidth', 3)}/dir x{tier.size}"
                          for t, tier in s.tiers.items())
        records.append(_headline(name, "system", s.chip_spec, s.chips, s.ranks, tiers))
    common.emit(pd.DataFrame(records), args.format, title="chips (figures per package) and systems (totals); "
                                                          "'dies' = ranks")


def run_show(args) -> None:
    import pandas as pd

    spec = load(args.name, common.parse_overrides(args.overrides))
    frame = pd.DataFrame(rows(spec))
    if not args.sources:
        frame = frame.drop(columns="source")
    common.emit(frame, args.format, title=f"{spec.name}: {spec.description} ({spec.provenance.file})")


def run_diff(args) -> None:
    import pandas as pd

    a, b = load(args.a), load(args.b)
    if type(a) is not type(b):
        raise NpusimError(f"cannot compare chip and system ('{args.a}' vs '{args.b}'): give two chips or two systems")
    va = {r["field"]: r["value"] for r in rows(a)}
    vb = {r["field"]: r["value"] for r in rows(b)}
    records = [{"field": k, a.name: va.get(k, "-"), b.name: vb.get(k, "-"),
                "diff": "*" if va.get(k) != vb.get(k) else ""}
               for k in list(va) + [k for k in vb if k not in va]]
    frame = pd.DataFrame(records)
    if not args.all:
        frame = frame[frame["diff"] == "*"]
    common.emit(frame, args.format, title=f"{a.name} vs {b.name} ({len(frame)} fields shown; * = differs)")
