"""Fit named chip parameters to published rows, and print the error of every candidate value:
- graph: the per-kernel launch overhead in graph mode (`overheads.graph_launch`) of each chip, on the published
  decode rows of experiments/validate.py (median |error| per candidate);
- bulk: the bulk (prefill) all-to-all of the 910C die, `efficiency.bulk_all_to_all` and `overheads.all_to_all_peer`,
  on the ten K07 rows (DeepEP normal dispatch / combine, EP8-EP128) by least squares of the relative error. A15 (the
  R1 prefill whose all-to-alls these are) is kept out of the fit.

Run: python experiments/calibrate.py [graph|bulk]   (prints; the chosen values are written into
hardware/chips/*.yaml by hand, with this script named in their source). The other fitted parameters and their rows:
efficiency.cube / l2 and an MTE2 latency from the GEMMs (experiments/kernel_validation.py), efficiency.link and the
UB tier setup from the collectives (experiments/comm_validation.py).
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pandas as pd

from comm_validation import K07, deepep_normal  # sibling scripts (run as python experiments/calibrate.py)
from npusim.spec.system import load_system
from validate import ROWS, evaluate

CANDIDATES_US = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12)
CHIP_OF_SYSTEM = {"cloudmatrix384": "910c-die", "atlas-950-superpod": "950dt"}


def fit_graph_launch() -> None:
    decode = [r for r in ROWS if r.metric == "tpot" and r.kind == "doc"]
    records = []
    for us in CANDIDATES_US:
        for row in decode:
            tuned = dataclasses.replace(row, overrides={**row.overrides, "overheads.graph_launch": f"{us}us"})
            out = evaluate(tuned)
            records.append({"chip": CHIP_OF_SYSTEM[row.hw], "graph_launch_us": us, "row": row.what,
                            "abs_error_%": abs(out["error_%"])})
    frame = pd.DataFrame(records)
    table = frame.groupby(["chip", "graph_launch_us"])["abs_error_%"].median().unstack(0).round(1)
    print("median |error| % of the decode rows per candidate graph_launch:")
    print(table.to_string())
    print("best:", {chip: int(table[chip].idxmin()) for chip in table.columns})


def fit_bulk_all_to_all() -> None:
    base = load_system("cloudmatrix384")
    published = np.array([v for _, d, c in K07 for v in (d, c)], float)
    fits = []
    for eff in np.arange(0.60, 0.951, 0.01):
        for peer_us in np.arange(0.0, 30.01, 0.5):
            chip = base.chip_spec
            chip = dataclasses.replace(chip, efficiency=dataclasses.replace(chip.efficiency, bulk_all_to_all=eff),
                                       overheads=dataclasses.replace(chip.overheads, all_to_all_peer=peer_us * 1e-6))
            system = dataclasses.replace(base, chip_spec=chip)
            predicted = np.array([v for ep, _, _ in K07 for v in deepep_normal(system, ep)])
            rel = predicted / published - 1.0
            fits.append((float(np.sqrt(np.mean(rel**2))), round(eff, 2), peer_us, rel))
    rms, eff, peer_us, rel = min(fits, key=lambda f: f[0])
    print(f"K07 bulk all-to-all fit: efficiency.bulk_all_to_all {eff:.2f}, overheads.all_to_all_peer {peer_us:g} us "
          f"(rms relative error {100 * rms:.1f} %)")
    print("bandwidth errors % (dispatch, combine):", ", ".join(
        f"EP{ep} {100 * rel[2 * i]:+.1f} / {100 * rel[2 * i + 1]:+.1f}" for i, (ep, _, _) in enumerate(K07)))


def main() -> None:
    which = sys.argv[1:] or ["graph", "bulk"]
    if "graph" in which:
        fit_graph_launch()
    if "bulk" in which:
        fit_bulk_all_to_all()


if __name__ == "__main__":
    main()
