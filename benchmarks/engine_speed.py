"""Engine speed: wall time to simulate one layer's long-context kernels on a 910C die, and events per second.

    python benchmarks/engine_speed.py

Prints, per kernel, the wall time of one (unmemoised) simulation, the simpy events it processed and the engine's
events per second, beside the raw simpy rate (a bare timeout loop) measured on the same machine. Target: < 1 s per
kernel. Both causal kernels deal equal work to every core: the Lightning Indexer's triangle as units of two query
blocks (452 s when each band of query blocks was its own short loop), the Sparse Flash Attention's ramp (tokens with
fewer than top-k keys) as units of two blocks whose key tiles add up to a full block. Dealt band by band instead, the
ramp's leftover blocks put three core groups out of phase for tens of blocks (0.36-0.93 M events, 1.0-2.6 s, and a
kernel time that moved by 0.7 % with float round-off).
"""

from __future__ import annotations

import time

import simpy

from npusim.engine.result import summarise
from npusim.engine.sim import Simulation
from npusim.kernels import catalog
from npusim.spec.chip import load_chip

PREFILL = 131072  # one layer of a 128K-token prefill
CASES = [
    ("lightning_indexer", {"tokens": PREFILL, "keys": PREFILL}),
    ("sparse_flash_attention", {"tokens": PREFILL, "keys": PREFILL}),
    ("gemm", {"m": PREFILL, "n": 7168, "k": 2048}),  # e.g. an attention output projection of the layer
]
LAYER = ("lightning_indexer", "sparse_flash_attention")  # the pair the target is set on


def raw_simpy_rate(events: int = 200_000) -> float:
    """Events per second of a bare simpy process yielding timeouts: the ceiling of any simpy model here."""
    env = simpy.Environment()

    def ticker():
        for _ in range(events):
            yield env.timeout(1.0)

    env.process(ticker())
    t0 = time.perf_counter()
    env.run()
    return events / (time.perf_counter() - t0)


def main() -> None:
    chip = load_chip("910c-die")
    known = set(catalog.names())
    print(f"raw simpy: {raw_simpy_rate():,.0f} events/s")
    layer = 0.0
    for name, shape in CASES:
        if name not in known:
            print(f"{name:22s} (no tiling yet)")
            continue
        trace = catalog.kernel(name, shape).trace(chip)
        t0 = time.perf_counter()
        outcome = Simulation(trace, chip).run()
        wall = time.perf_counter() - t0
        layer += wall if name in LAYER else 0.0
        result = summarise(trace, chip, outcome, chip.overheads.kernel_launch)
        print(f"{name:22s} {shape}: simulated {result.time * 1e3:9.3f} ms ({result.bound}-bound), wall "
              f"{wall:6.3f} s, {outcome.events:,} events = {outcome.events / wall:,.0f} events/s, "
              f"{100 * result.extrapolated:.0f} % of the kernel time extrapolated")
    print(f"one layer's {' + '.join(LAYER)}: {layer:.3f} s of wall time (target < 1 s)")


if __name__ == "__main__":
    main()
