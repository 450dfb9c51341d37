"""Fit the per-kernel launch overhead in graph mode (`overheads.graph_launch`) of each chip to the published decode
rows of experiments/validate.py, and print the median |error| for every candidate value.

Run: python experiments/calibrate.py   (prints; the chosen values are written into hardware/chips/*.yaml by hand,
with this script named in their source). The other fitted parameters and their rows: efficiency.cube / l2 and an
MTE2 latency from the GEMMs (experiments/kernel_validation.py), efficiency.link and the UB tier setup from the
collectives (experiments/comm_validation.py).
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from validate import ROWS, evaluate  # the sibling script (run as python experiments/calibrate.py)

CANDIDATES_US = (1, 2, 3, 4, 6, 8, 10, 12)
CHIP_OF_SYSTEM = {"cloudmatrix384": "910c-die", "atlas-950-superpod": "950dt"}


def main() -> None:
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


if __name__ == "__main__":
    main()
