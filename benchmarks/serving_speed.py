"""Wall time of a 10,000-request serving simulation with step times from a GridStepModel (target: under 10 s).

The wrapped step model sleeps `--cost` seconds per call to stand in for `npusim predict` (sleeping costs wall time,
not CPU time); the CPU time is the simulation's own and does not depend on other load on the machine.

    python benchmarks/serving_speed.py [--requests 10000] [--cost 0.001]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from npusim.serving import (AnalyticStepModel, Capacity, Deployment, GridStepModel, Link, LogNormal, Mtp, OpenLoop,
                            Pool, Slo, simulate)


@dataclass(frozen=True)
class SlowModel:
    """An analytic rank that costs `cost` seconds per query, like a prediction would."""

    model: AnalyticStepModel
    cost: float

    @property
    def capacity(self) -> Capacity:
        return self.model.capacity

    def prefill_time(self, new_tokens: int, cached_tokens: int, batch: int) -> float:
        time.sleep(self.cost)
        return self.model.prefill_time(new_tokens, cached_tokens, batch)

    def decode_time(self, batch: int, context: int, tokens_per_seq: int = 1) -> float:
        time.sleep(self.cost)
        return self.model.decode_time(batch, context, tokens_per_seq)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--cost", type=float, default=0.001, help="seconds per wrapped step-model call")
    args = parser.parse_args()
    rank = AnalyticStepModel(Capacity(kv_bytes_per_token=70e3, kv_capacity=24e9, max_batch=64, token_budget=8192))
    load = OpenLoop(rate=12.0, input=LogNormal(2000, 0.8, high=32000), output=LogNormal(300, 0.6, high=4000))
    deployments = {
        "co-located 2 x 4 ranks, chunked, MTP 1": Deployment(prefill=Pool(instances=2, ranks=4), chunk_size=2048,
                                                             mtp=Mtp(depth=1, acceptance=0.8)),
        "disaggregated 2 P x 2 + 1 D x 8, MTP 1": Deployment(prefill=Pool(instances=2, ranks=2),
                                                             decode=Pool(instances=1, ranks=8),
                                                             link=Link(bandwidth=25e9, latency=50e-6),
                                                             mtp=Mtp(depth=1, acceptance=0.8)),
    }
    print(f"{args.requests} requests, Poisson 12 req/s, log-normal lengths (median 2000 in / 300 out), "
          f"wrapped model {args.cost * 1e3:g} ms per call")
    for name, deployment in deployments.items():
        grid = GridStepModel(SlowModel(rank, args.cost))
        start, cpu = time.perf_counter(), time.process_time()
        result = simulate(deployment, load, grid, seed=0, requests=args.requests, slo=Slo(ttft=2.0, tpot=0.05))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        s = result.summary
        print(f"{name}: {wall:.2f} s wall, {cpu:.2f} s CPU ({grid.evaluations} grid nodes x "
              f"{args.cost * 1e3:g} ms), {len(result.steps)} steps, {s.output_throughput:,.0f} tok/s, "
              f"TTFT p99 {s.ttft.p99 * 1e3:.0f} ms, TPOT p99 {s.tpot.p99 * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
