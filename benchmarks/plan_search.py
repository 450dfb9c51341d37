"""Wall time of `npusim plan` on the issue's case: DeepSeek-V3.2-Exp at 128K on CloudMatrix384 under TTFT 2 s /
TPOT 30 ms, searching the default space (thousands of candidate deployments) with 2 local processes, the pools sized
and the recommendation served at their rate, and the co-located deployments served beside it (`--no-colocated`:
without them).

Run: python benchmarks/plan_search.py [--warm] [--no-colocated]   Target (issue 7): under a minute on 2 cores. Starts
from an empty kernel disk cache (NPUSIM_CACHE) unless --warm reuses the user's.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

if "--warm" not in sys.argv:
    os.environ["NPUSIM_CACHE"] = tempfile.mkdtemp()

from npusim.planner import search  # noqa: E402
from npusim.serving import Slo  # noqa: E402


def main() -> None:
    t0 = time.perf_counter()
    r = search("cloudmatrix384", "deepseek-v3.2-exp", input=131072, output=1024, slo=Slo(2.0, 0.030), workers=2,
               colocated="--no-colocated" not in sys.argv)
    dt = time.perf_counter() - t0
    print(f"{r.candidates} candidate deployments, {r.predictions} predictions, {r.pruned} role points pruned: "
          f"{dt:.1f} s wall on {os.cpu_count()} cores")
    best = r.recommended or (r.closest[0] if r.closest else None)
    label = "recommended" if r.recommended else "closest (SLO not met)"
    print(f"{label}: {best.row()}" if best else f"nothing runs: {r.refusal}")
    if r.confirmed:
        v = r.confirmed
        print(f"served under {v.traffic.describe()}: TTFT p99 {v.ttft * 1e3:.0f} ms, TPOT p99 {v.tpot * 1e3:.1f} ms, "
              f"{v.tokens_per_s_per_chip:.2f} tok/s per chip")
    if r.verdict:
        print(f"{len(r.colocated)} co-located runs; verdict: {r.verdict}")


if __name__ == "__main__":
    main()
