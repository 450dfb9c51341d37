"""The steady window of a serving run, whether the run reached one, and how long a run must be to reach it.

A run starts empty and ends draining: while the first requests are served the number in the system climbs (no
request leaves before one end-to-end latency has passed), and after the last arrival it falls. Neither is the
state a deployment holds under a load, so the percentiles and throughputs that judge it come from a window:

  - warm-up and drain: `E`, the p90 end-to-end latency of the requests that arrived in the first half of the run
    (a request still unfinished counts as endless). By `E` after the first arrival the count in the system has
    reached its level (nine in ten requests alive then arrived after the start); a request that arrives later
    than `E` before the last arrival spends part of its life in the drain, where it waits less than under load;
  - the window: requests arriving from first arrival + E to last arrival - E. It must span at least `E` and hold
    `MIN_REQUESTS` arrivals, or the run is too short ('short').

Inside the window a steady run's arrivals and departures balance. Two counts show a run that does not: the queue
(requests arrived and without their first token: waiting, prefilling, crossing the link) and the number in the
system. A count whose mean over the window's last quarter exceeds its mean over the first quarter by more than
`TOLERANCE` of the window's arrivals (the delivered rate that much below the offered one) and by more than `SIGMAS`
times its own noise (a count of independent requests fluctuates like a Poisson count: a difference of two by
sqrt(2 x mean)) says the run was overloaded ('overloaded'). A run too short for a window is still tested on its
queue over the whole arrival span, whose warm-up is a TTFT, not an end-to-end latency.

The length of a run (`run_length`) follows from the load and the end-to-end latency `e2e` of one request: an open
loop at `rate` serves rate x (2 + MEASURED) x e2e requests (warm-up, drain, and `MEASURED` latencies measured; at
least MIN_MEASURED measured), a closed loop (2 + MEASURED) rounds of its users and MIN_MEASURED more. Near
capacity that is not enough: a queue's TTFTs are correlated over many requests, so `serve_steady` lengthens a run
whose window's TTFTs are worth fewer than MIN_EFFECTIVE independent ones (`effective_samples`).
`e2e` comes from a pilot run (`pilot_e2e`, what `npusim serve` does when no --requests / --duration is given:
`serve_steady`) or the step model's one-request prediction (the planner's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from npusim.serving.load import ClosedLoop, Load, OpenLoop, Trace

if TYPE_CHECKING:  # result.py imports this module
    from npusim.serving.result import ServingResult, Slo

WARMUP_QUANTILE = 0.9  # the end-to-end quantile taken as the warm-up and the drain
MIN_REQUESTS = 100  # arrivals the window must hold: p99 from at least a hundred requests
MIN_MEASURED = 1000  # arrivals the window of a run of `run_length` aims at: ten requests in the p99 tail
MIN_EFFECTIVE = 200  # independent TTFTs `serve_steady` wants in a window (near capacity a queue's TTFTs are
# correlated over tens of requests: at 8/s on the default deployment 1574 in the window were worth 57, and their p99
# was 1.91 s where runs two and four times as long agree on 2.29 s)
TOLERANCE = 0.02  # growth of a count over the window, as a share of its arrivals, that marks an overload (a
# stable queue: within 0.4 % up to 95 % of its capacity, tests/test_serving_load.py)
SIGMAS = 3.0  # ... and in units of the count's own noise, sqrt(2 x its mean)
MEASURED = 4  # end-to-end latencies the window of a run of `run_length` spans
PILOT_REQUESTS = 8  # requests of the pilot run that measures one request's end-to-end latency
MAX_REQUESTS = 20000  # a run of `run_length` serves at most this many requests (seconds of simulation per rate)


@dataclass(frozen=True)
class SteadyWindow:
    """Where a run was steady: the arrivals measured and whether their load balanced (verdict 'steady'), or why not
    ('overloaded': a count grew; 'short': no window)."""

    verdict: str  # steady | overloaded | short
    reason: str  # one sentence; empty when steady
    start: float  # s: requests arriving from here ...
    end: float  # ... to here are measured (the first to the last arrival when the run is short)
    requests: int  # arrivals inside
    warmup: float  # s: E, the warm-up and the drain
    offered: float  # arrivals / s inside
    delivered: float  # completions / s inside
    queue_growth: float  # requests without a first token: mean over the window's last quarter minus its first's
    in_system_growth: float  # requests arrived and not finished: the same
    effective: float  # independent samples the window's TTFTs are worth (`effective_samples`)

    @property
    def reached(self) -> bool:
        return self.verdict == "steady"


@dataclass(frozen=True)
class _Count:
    """A count of requests over time, alive from `begin` to `stop` (stop = inf: still alive at the end)."""

    begin: np.ndarray
    stop: np.ndarray

    def mean(self, start: float, end: float) -> float:
        """Time average over [start, end]."""
        alive = np.clip(np.minimum(self.stop, end) - np.maximum(self.begin, start), 0.0, None)
        return float(alive.sum() / (end - start)) if end > start else 0.0

    def ends(self, start: float, end: float) -> tuple[float, float]:
        """Time averages over the first and the last quarter of [start, end]."""
        q = (end - start) / 4
        return self.mean(start, start + q), self.mean(end - q, end)

    def grew(self, start: float, end: float, arrivals: int) -> bool:
        """From the first to the last quarter of [start, end], by more than TOLERANCE of the arrivals and SIGMAS times
        its noise."""
        first, last = self.ends(start, end)
        return last - first > max(TOLERANCE * arrivals, SIGMAS * math.sqrt(2.0 * self.mean(start, end)))


def steady_window(requests: pd.DataFrame) -> SteadyWindow:
    """The steady window of a run from its request table (arrival, first_token, finish; NaN: not yet)."""
    a = requests.arrival.to_numpy(float)
    if a.size == 0:
        return SteadyWindow("short", "no request arrived", 0.0, 0.0, 0, math.nan, 0.0, 0.0, 0.0, 0.0, 0.0)
    first = np.nan_to_num(requests.first_token.to_numpy(float), nan=math.inf)
    finish = np.nan_to_num(requests.finish.to_numpy(float), nan=math.inf)
    queue, system = _Count(a, first), _Count(a, finish)
    t0, t1 = float(a.min()), float(a.max())
    early = finish[a <= (t0 + t1) / 2] - a[a <= (t0 + t1) / 2]
    e = float(np.quantile(early, WARMUP_QUANTILE, method="higher"))
    start, end = t0 + e, t1 - e
    inside = (a >= start) & (a <= end)
    n = int(inside.sum())
    if not math.isfinite(e) or end - start < e or n < MIN_REQUESTS:
        return _short(a, first, finish, queue, system, t0, t1, e)
    span = end - start
    done = int(((finish >= start) & (finish <= end)).sum())
    win = dict(start=start, end=end, requests=n, warmup=e, offered=n / span, delivered=done / span,
               queue_growth=_growth(queue, start, end), in_system_growth=_growth(system, start, end),
               effective=effective_samples((first - a)[inside]))
    grown = [(name, c) for name, c in (("queue", queue), ("system", system)) if c.grew(start, end, n)]
    if not grown:
        return SteadyWindow("steady", "", **win)
    return SteadyWindow("overloaded", f"no steady state: {done / span:.3g} requests/s delivered of {n / span:.3g} "
                                      f"offered; {_grew(*grown[0], start, end)} over the {span:.3g} s window", **win)


def effective_samples(values) -> float:
    """How many independent samples a series (in arrival order) is worth: its length over its integrated
    autocorrelation time, summed up to the first lag at least 5 times that time (Sokal's automatic window)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 2 or x.min() == x.max():
        return float(x.size)  # a constant series: every sample is exact
    x = x - x.mean()
    spectrum = np.fft.rfft(x, 2 * x.size)
    acf = np.fft.irfft(spectrum * np.conj(spectrum))[:x.size]
    tau = 1.0 + 2.0 * np.cumsum(acf[1:] / acf[0])
    stop = np.nonzero(np.arange(1, x.size) >= 5.0 * tau)[0]
    return float(x.size / max(1.0, tau[stop[0]] if stop.size else tau[-1]))


def _growth(count: _Count, start: float, end: float) -> float:
    first, last = count.ends(start, end)
    return last - first


def _grew(name: str, count: _Count, start: float, end: float) -> str:
    what = ("the queue (requests waiting for their first token)" if name == "queue" else
            "the requests in the system")
    first, last = count.ends(start, end)
    return f"{what} grew from {first:.3g} to {last:.3g} (means over its first and last quarter)"


def _short(a, first, finish, queue: _Count, system: _Count, t0: float, t1: float, e: float) -> SteadyWindow:
    """No window: the run is too short, unless its queue grew over the whole arrival span (an overload)."""
    span, n = t1 - t0, len(a)
    done = int((finish <= t1).sum())
    offered = (n - 1) / span if span else 0.0
    win = dict(start=t0, end=t1, requests=n, warmup=e, offered=offered, delivered=done / span if span else 0.0,
               queue_growth=_growth(queue, t0, t1), in_system_growth=_growth(system, t0, t1),
               effective=effective_samples(first - a))
    if span > 0 and queue.grew(t0, t1, n):
        return SteadyWindow("overloaded", f"no steady state: {n} requests offered at {offered:.3g}/s; "
                                          f"{_grew('queue', queue, t0, t1)} for the whole run", **win)
    if not math.isfinite(e):
        why = "requests of its first half were still running at its end"
    else:
        why = (f"its arrivals span {span:.3g} s, short of a warm-up and a drain of {e:.3g} s each (the p90 "
               f"end-to-end latency) around a window of at least that long with {MIN_REQUESTS} arrivals")
    return SteadyWindow("short", f"no steady window: {why}; serve more requests", **win)


def run_length(*, e2e: float | None = None, rate: float | None = None, concurrency: int | None = None) -> int:
    """Requests a run needs to reach and measure a steady window: an open loop at `rate` whose requests take `e2e`
    seconds, or a closed loop of `concurrency` users (see the module docstring)."""
    if concurrency is not None:
        n = (2 + MEASURED) * concurrency + MIN_MEASURED
    else:
        if not (e2e is not None and e2e > 0 and math.isfinite(e2e)):
            raise ValueError(f"an end-to-end latency must be a positive number of seconds, got {e2e}")
        measured = max(MEASURED * e2e * rate, MIN_MEASURED)
        n = math.ceil(2 * e2e * rate + measured)
    return min(n, MAX_REQUESTS)


def pilot_e2e(served, load: OpenLoop, seed: int = 0) -> float:
    """Median end-to-end latency of the first `PILOT_REQUESTS` requests of `load` on `served` (a ServedPlan, or
    anything with its `run`): what a request takes before the load has built up."""
    return float(served.run(load, seed=seed, requests=PILOT_REQUESTS).requests.e2e.median())


def steady_requests(served, load: Load, seed: int = 0) -> int | None:
    """Requests a run of `load` on `served` needs for a steady window (None: a trace runs to its end)."""
    if isinstance(load, Trace):
        return None
    if isinstance(load, ClosedLoop):
        return run_length(concurrency=load.concurrency)
    return run_length(e2e=pilot_e2e(served, load, seed), rate=load.rate)


def serve_steady(served, load: Load, *, seed: int = 0, slo: Slo | None = None,
                 progress: bool = False) -> tuple[ServingResult, int | None]:
    """`load` served for `steady_requests`, then once more when that was not enough: an open loop whose run was too
    short (its requests took longer under load than the pilot's) for the run length its own warm-up asks; a steady
    window whose TTFTs are worth fewer than MIN_EFFECTIVE independent ones (a queue near capacity) for a window
    that many times longer (at most MAX_REQUESTS). Returns the result and the requests served."""
    n = steady_requests(served, load, seed)
    result = served.run(load, seed=seed, requests=n, slo=slo, progress=progress)
    w = result.summary.steady
    longer = n
    if isinstance(load, OpenLoop) and w.verdict == "short" and math.isfinite(w.warmup) and w.warmup > 0:
        longer = run_length(e2e=w.warmup, rate=load.rate)
    elif n is not None and w.reached and w.effective < MIN_EFFECTIVE:
        longer = min(MAX_REQUESTS, n - w.requests + math.ceil(w.requests * MIN_EFFECTIVE / max(w.effective, 1.0)))
    if n is not None and longer > n:
        n, result = longer, served.run(load, seed=seed, requests=longer, slo=slo, progress=progress)
    return result, n
