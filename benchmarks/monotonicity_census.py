"""Census of "more resource is never slower" (issue 15): every kernel and prediction timed again with one resource
doubled (npusim.spec.chip.RESOURCES: L0A/L0B/L0C, L1, UB, cube and vector rates, HBM and L2 bandwidth), counting
the checks that came out slower beyond float noise.

Kernels: the measured rows of experiments/data/kernel_rows.csv on their chip (and on every chip of --chips), and
every op launch of the predictions below as its step runs it (core partition, fused-group L2 reads, plan tile
options). Predictions: TTFT and TPOT of a few shipped deployments with each resource doubled on the system's chip.
A slower kernel or launch is classed by its cause: 'engine' when the smaller chip's own tiling runs later on the
larger chip (npusim.engine.sim, "Faster is not always sooner"), 'tiling' when the tuner missed one as fast.

Run: python benchmarks/monotonicity_census.py [--quick] [--chips 910b2,950dt-36] [--show 20]
(--quick: the kernel rows only, no predictions.) The property tests in tests/test_monotonicity.py check the same
invariant on generated shapes; this script is the long run over the project's own workloads.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("NPUSIM_CACHE", "off")  # time every check afresh
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npusim import api  # noqa: E402
from npusim.engine.result import simulate  # noqa: E402
from npusim.engine.tune import tuned  # noqa: E402
from npusim.errors import NpusimError  # noqa: E402
from npusim.kernels import catalog  # noqa: E402
from npusim.parallel import optime, step  # noqa: E402
from npusim.spec.chip import RESOURCES, load_chip, resource_overrides, with_more  # noqa: E402
from npusim.spec.system import load_system  # noqa: E402

NOISE = 1e-6  # relative: what the engine's steady-state matching tolerance may move a time by
ROWS = Path(__file__).resolve().parents[1] / "experiments" / "data" / "kernel_rows.csv"
PREDICTIONS = [  # (label, api.predict keyword arguments)
    ("v32 A3 PD 128K (default)", {}),
    ("v32 950DT PD 32K", {"hw": "atlas-950-superpod", "plan": "v32-950dt-pd", "input": 32768, "batch": 64}),
    ("v4-flash 950DT A23", {"hw": "atlas-950-superpod", "model": "deepseek-v4-flash", "plan": "v4flash-950dt-a23",
                            "quant": None, "input": 8192, "batch": 32}),
    ("v32 A2 PD 8K W8A8", {"hw": "atlas-800-a2", "plan": "v32-a2-pd", "quant": "w8a8", "input": 8192, "batch": 32,
                           "overrides": {"chips": "48"}}),
]


@dataclasses.dataclass(frozen=True)
class Check:
    what: str  # kernel name or prediction label and figure
    where: str  # chip and shape or scenario
    resource: str
    before: float
    after: float
    cause: str = ""  # of a slower kernel or launch (see `cause`): "engine" or "tiling"

    @property
    def slower(self) -> bool:
        return self.after > self.before * (1 + NOISE)


def kernel_cases(chips: list[str]) -> list[tuple[str, str, dict]]:
    """(kernel, chip, shape) of every expressible kernel row, on its chip and on each of `chips`."""
    import csv
    cases = []
    with ROWS.open() as f:
        for row in csv.DictReader(f):
            if not row["kernel"] or row["kind"] in ("collective", "fused") or row["kernel"] not in catalog.names():
                continue
            shape = dict(item.split("=", 1) for item in row["shape"].split())
            for chip in dict.fromkeys([row["chip"]] + chips):
                cases.append((row["kernel"], chip, shape))
    return list({(k, c, tuple(sorted(s.items()))): (k, c, s) for k, c, s in cases}.values())


@functools.cache
def chip_named(name: str):
    return load_chip(name)


def cause(before: float, incumbent: float) -> str:
    """Why a check came out slower: 'engine' when the smaller chip's own tiling runs later on the larger chip (the
    engine's sharing, whatever the tuner chooses), else 'tiling' (a tiling at least as fast was there to take)."""
    return "engine" if incumbent > before * (1 + NOISE) else "tiling"


def kernel_checks(chips: list[str]) -> list[Check]:
    out = []
    for name, chip_name, shape in kernel_cases(chips):
        chip = chip_named(chip_name)
        where = f"{chip_name} " + " ".join(f"{k}={v}" for k, v in shape.items())
        try:
            small = tuned(catalog.kernel(name, shape), chip, "device")
        except NpusimError:
            continue  # refused on this chip (a dtype it lacks, a buffer too small): nothing to compare
        for res in RESOURCES:
            more = with_more(chip, res)
            try:
                after = tuned(catalog.kernel(name, shape), more, "device").result.time
            except NpusimError as exc:
                print(f"  refused with more {res}: {name} {where}: {exc}")
                after = float("inf")
            check = Check(name, where, res, small.result.time, after)
            if check.slower and after < float("inf"):
                incumbent = simulate(small.kernel.trace(more), more, launch="device").time
                check = dataclasses.replace(check, cause=cause(check.before, incumbent))
            out.append(check)
    return out


def prediction_launches(kwargs: dict) -> list[tuple]:
    """Every (op, chip, run) a prediction times (its distinct launches)."""
    seen = {}
    real = step.op_time

    def spy(op, chip, run="graph"):
        seen[repr((op.kind, sorted(op.shape.items()), sorted(op.dtypes.items()), op.flops, op.bytes, chip.name,
                   run))] = (op, chip, run)
        return real(op, chip, run)

    step.op_time = spy
    try:
        api.predict(**kwargs)
    finally:
        step.op_time = real
    return list(seen.values())


def launch_tuning(op, chip, run, incumbent=None) -> tuple:
    """The tiling the tuner chooses for a launch as its step runs it (the in-process memo forgotten, so it tunes)
    and, given another chip's choice `incumbent`, that tiling's time here as the step would build it."""
    seen, real = {}, optime.tuned

    def spy(kernel, chip_, launch, make):
        best = real(kernel, chip_, launch, make)
        seen["choice"] = best.kernel
        if incumbent is not None:
            seen["incumbent"] = simulate(make(incumbent), chip_, launch=launch).time
        return best

    optime.tuned = spy
    optime.clear_memos()
    try:
        optime.op_time(op, chip, run)
    finally:
        optime.tuned = real
    return seen.get("choice"), seen.get("incumbent", float("inf"))


def launch_checks(label: str, kwargs: dict) -> list[Check]:
    out = []
    for op, chip, run in prediction_launches(kwargs):
        before = optime.op_time(op, chip, run).time
        where = f"{label}: {op.name} {chip.name} " + " ".join(f"{k}={v}" for k, v in op.shape.items())
        for res in RESOURCES:
            try:
                after = optime.op_time(op, with_more(chip, res), run).time
            except NpusimError as exc:
                print(f"  refused with more {res}: {where}: {exc}")
                after = float("inf")
            check = Check(f"op {optime.kernel_name(op)}", where, res, before, after)
            if check.slower and after < float("inf"):
                choice, _ = launch_tuning(op, chip, run)
                _, incumbent = launch_tuning(op, with_more(chip, res), run, choice)
                check = dataclasses.replace(check, cause=cause(before, incumbent))
            out.append(check)
    return out


def prediction_checks(label: str, kwargs: dict) -> list[Check]:
    base = api.predict(**kwargs)
    chip = load_system(kwargs.get("hw", api.DEFAULT["hw"]), kwargs.get("overrides")).chip_spec
    out = []
    for res in RESOURCES:
        more = kwargs.get("overrides", {}) | resource_overrides(chip, res)
        p = api.predict(**(kwargs | {"overrides": more}))
        for figure in ("ttft", "tpot"):  # a decode-only plan has no TTFT
            if getattr(base, figure) is not None:
                out.append(Check(f"prediction {figure.upper()}", label, res, getattr(base, figure), getattr(p, figure)))
    return out


def report(checks: list[Check], show: int) -> None:
    slower = [c for c in checks if c.slower]
    print(f"\n{len(slower)} of {len(checks)} checks slower with more resource")
    by = collections.Counter((c.what, c.resource, c.cause) for c in slower)
    for (what, res, cause), n in sorted(by.items(), key=lambda kv: -kv[1]):
        print(f"  {what:32s} more {res:6s} {n:5d}  {cause}")
    print("  (kernels and launches: 'engine' = the smaller chip's tiling itself ran later on the larger chip, 'tiling' = "
          "a tiling as fast was there, the tuner missed it)")
    for c in sorted(slower, key=lambda c: -c.after / c.before)[:show]:
        print(f"  {c.after / c.before - 1:+8.2%}  {c.what} more {c.resource}: {c.where}  "
              f"{c.before * 1e6:.3f} -> {c.after * 1e6:.3f} us {c.cause}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="kernel rows only, no predictions")
    ap.add_argument("--chips", default="", help="comma-separated chips to run every kernel row on as well")
    ap.add_argument("--show", type=int, default=20, help="worst slower checks to list")
    ap.add_argument("--csv", default="", help="write every check to this CSV file")
    args = ap.parse_args()
    t0 = time.perf_counter()
    checks = kernel_checks([c for c in args.chips.split(",") if c])
    print(f"kernel rows: {len(checks)} checks in {time.perf_counter() - t0:.0f} s")
    if not args.quick:
        for label, kwargs in PREDICTIONS:
            t1 = time.perf_counter()
            checks += launch_checks(label, kwargs) + prediction_checks(label, kwargs)
            print(f"{label}: {len(checks)} checks so far, {time.perf_counter() - t1:.0f} s")
    report(checks, args.show)
    if args.csv:
        import pandas as pd
        pd.DataFrame([dataclasses.asdict(c) | {"slower": c.slower} for c in checks]).to_csv(args.csv, index=False)
    print(f"census took {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
