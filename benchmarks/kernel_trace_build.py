"""How long building the tile trace of long-context kernels takes (the design target: well under a second)."""

import time

from npusim.kernels import catalog
from npusim.spec.chip import load_chip

CASES = [
    ("lightning_indexer", {"tokens": 131072, "keys": 131072}),  # 128K causal prefill
    ("lightning_indexer", {"tokens": 4, "keys": 131072}),  # decode step with MTP
    ("gemm", {"m": 131072, "n": 7168, "k": 2048}),
    ("sparse_flash_attention", {"tokens": 131072, "keys": 131072}),  # 128K causal prefill, top-2048
    ("sparse_flash_attention", {"tokens": 64, "keys": 131072}),  # decode batch 64
    ("flash_attention", {"tokens": 131072, "keys": 131072, "kv_heads": 128}),  # V3.1 MHA prefill
    ("v4_attention", {"tokens": 131072, "keys": 131072, "ratio": 4, "topk": 512}),  # CSA prefill
]

if __name__ == "__main__":
    for hw in ("910b2", "910c-die"):
        chip = load_chip(hw)
        for name, shape in CASES:
            t0 = time.perf_counter()
            trace = catalog.kernel(name, shape).trace(chip)
            dt = time.perf_counter() - t0
            n = sum(c["instructions"] for c in trace.pipe_totals().values())
            print(f"{hw:9s} {name:18s} {shape}: {dt * 1e3:7.1f} ms, {len(trace.groups)} groups, "
                  f"{n:.3g} instructions represented")
