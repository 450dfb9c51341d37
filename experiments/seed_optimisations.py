"""Seed 000's claims beside npusim's predictions for the closest configuration npusim can express.

Seed 000 (a blog post on DeepSeek-V3.2-Exp on 910B) claims, at 128K: TTFT 8.2 s -> 1.9 s, memory 48 GB -> 22 GB,
12 -> 28 TFLOPS/W, and 8-card scaling 3.2x before ring attention. Its 8 x 910B setting is not expressible: the 671B
model does not fit 8 x 64 GB at 128K in npusim's memory model (W4A8C8 with 4K chunks still needs ~73 GiB per rank)
and CP is modelled for prefill instances only. The closest configuration is the A17 prefill instance (CP64 on 32 A3
chips) with the seed's optimisations switched off (workloads/scenarios/v32-128k-a3-base) and on, one at a time
(the v32-128k-a3-* ladder). Writes experiments/results/seed_optimisations.{md,csv,png}.

    python experiments/seed_optimisations.py
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from npusim.results.compare import compare

LADDER = ["v32-128k-a3-base", "v32-128k-a3-1-fusion", "v32-128k-a3-2-double-buffer", "v32-128k-a3-3-chunk16k",
          "v32-128k-a3-4-ring", "v32-128k-a3-5-core-split"]
OUT = Path(__file__).parent / "results"


def main() -> None:
    cmp = compare(*LADDER)
    t = cmp.table()
    base, best = cmp.predictions[0], min(cmp.predictions, key=lambda p: p.ttft)
    best_name = t.loc[[p.ttft for p in cmp.predictions].index(best.ttft), "scenario"]
    chunk = cmp.predictions[LADDER.index("v32-128k-a3-3-chunk16k")]
    gather, ring = cmp.predictions[LADDER.index("v32-128k-a3-3-chunk16k")], cmp.predictions[LADDER.index("v32-128k-a3-4-ring")]
    gib = 2**30

    def exposed(p):
        return p.prefill.exposed_comm / p.prefill.time

    rows = [
        ("TTFT 128K before -> after (s)", "8.2 -> 1.9", f"{base.ttft:.2f} -> {best.ttft:.2f} ({best_name})",
         "Claim's 4.3x is not reproduced: at 128K the Lightning Indexer and Sparse Flash Attention dominate and are "
         "already fused kernels in both columns; the switches npusim can turn off (prolog fusion, buffering of GEMM/"
         "row-wise/indexer) buy %.0f %%, chunking costs time (weights re-read per chunk)." %
         (100 * (1 - best.ttft / base.ttft))),
        ("Memory per card before -> after (GB)", "48 -> 22",
         f"{base.memory['prefill'].total / gib:.1f} -> {chunk.memory['prefill'].total / gib:.1f} (16K chunks)",
         "Same direction: chunking shrinks activations; weights (EP64 share) and KV stay, so the drop is smaller than "
         "the claim's 54 % on a prefill rank that holds 1/64 of the experts."),
        ("Energy efficiency before -> after (TFLOPS/W)", "12 -> 28",
         f"{base.tflops_per_watt('prefill'):.2f} -> {best.tflops_per_watt('prefill'):.2f}",
         "The claim is physically out of reach: a 910C die's BF16 peak over its 350 W TDP is ~1.0 TFLOPS/W (363 TFLOPS / 350 W), so 12-28 "
         "TFLOPS/W cannot be BF16 FLOPs per chip watt (perhaps INT8/INT4 ops per kernel watt, or a typo)."),
        ("Multi-card CP: exposed KV exchange, all-gather -> ring (% of prefill)", "8-card speedup 3.2x, comm 60 %",
         f"{100 * exposed(gather):.1f} % -> {100 * exposed(ring):.1f} %; TTFT {gather.ttft:.2f} -> {ring.ttft:.2f} s",
         "On A3's UB the CP64 KV all-gather is small beside 128K attention, so ring overlap buys little; the claim's "
         "60 % comm share fits a slower PCIe/HCCS 8-card box, which npusim cannot express for this model (see top)."),
    ]
    table = pd.DataFrame(rows, columns=["quantity", "seed 000 claim", "npusim prediction", "agreement / why not"])
    OUT.mkdir(exist_ok=True)
    table.to_csv(OUT / "seed_optimisations.csv", index=False)
    ladder = t[["scenario", "TTFT_ms", "prefill_mem_GiB", "prefill_J_tok", "prefill_TFLOPS_W", "switches"]]
    md = ["# Seed 000 claims vs npusim (regenerate: python experiments/seed_optimisations.py)", "",
          table.to_markdown(index=False), "", "## The ladder (workloads/scenarios/v32-128k-a3-*)", "",
          ladder.round(3).to_markdown(index=False), "", "![waterfall](seed_optimisations.png)", ""]
    (OUT / "seed_optimisations.md").write_text("\n".join(md))
    cmp.waterfall(OUT / "seed_optimisations.png", "ttft")
    print("\n".join(md))


if __name__ == "__main__":
    main()
