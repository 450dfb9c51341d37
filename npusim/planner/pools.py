"""Sizing the pools of a disaggregated deployment: how many prefill and decode instances (the xPyD ratio).

One prefill instance takes one prompt at a time (its step is one prompt; a second waits), so it carries at most
1 / prefill-step requests per second; one decode instance at its batch B and TPOT at most B / (output x TPOT). A
deployment serves the smaller of its two pools' rates, and its output tokens per chip are output x rate / chips, as
a PD-disaggregated deployment is sized (prefill workers added until they feed the decode workers, AIConfigurator's
xPyD). What one request's figures leave out is the queue: requests arrive at random, so a pool carries a rate only
while the waits it causes keep TTFT within the SLO at its percentile.

A request waits twice, and both waits are in its TTFT: for a prefill instance, and, its prompt done, for a decode
slot (one of the decode batch's B sequences; a slot is held for output x TPOT). Each wait is at the server it was
routed to on arrival (the serving simulation sends a request to the rank with the least cache load, as SGLang's
router picks a prefill and a decode worker per request), so a request waits when every server is busy (Erlang C:
C(c, a) for c servers offered a = lambda x hold erlangs, Poisson arrivals; Halfin-Whitt's approximation above 1024
servers, which overstates the tail there: conservative) for the one in service at its server: the rest of an
equal hold, uniform. Each further request queued ahead (again all busy) adds a whole hold:
P(wait > t) = C^(1 + floor(t / hold)) (1 - frac(t / hold)). This is not the central queue of M/D/c, where the first
server free takes the next request and p99 waits are several times shorter: binding at arrival is what the served
deployment does. The percentile's tail (1 % at p99) is split evenly between
the two waits; the prefill wait must fit the headroom the prompt leaves under the TTFT limit, and a decode slot,
held for seconds, must be free (its wait is not counted against the headroom). `mean`: the prefill wait's mean
within the headroom, a decode slot free for half the requests.
Limits: prompts of one length; the decode hold is taken at the full batch's TPOT (a pool fed below it runs a smaller
batch at a TPOT no worse); the link's transfer is in the prompt's TTFT, not queued.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from functools import lru_cache

TAIL = {"mean": 0.5, "p50": 0.5, "p90": 0.1, "p99": 0.01}  # requests allowed above the percentile
EXACT_UP_TO = 1024  # servers: Erlang B by recurrence up to here, Halfin-Whitt above


@dataclass(frozen=True)
class Pools:
    """Instances of each role and the request rate they serve together (requests/s, the smaller pool's)."""

    prefill: int = 1
    decode: int = 1
    requests_per_s: float = 0.0
    offered: float | None = None  # the rate they were sized for (size_pools' `rate`), when one was

    @property
    def unmet(self) -> str:
        """Why the pools cannot take the offered rate ('' when they can, or none was offered): an open loop arriving
        faster than they carry grows its queue without bound, which a run of a few hundred requests would hide."""
        if self.offered is None or self.requests_per_s >= self.offered:
            return ""
        return (f"the pools carry {self.requests_per_s:.3g} requests/s, below the offered {self.offered:g}: the queue "
                "grows without bound")

    def describe(self) -> str:
        return f"{self.prefill}P{self.decode}D"


def erlang_c(servers: int, load: float) -> float:
    """Probability that an arrival finds all `servers` busy, offered `load` = lambda x hold erlangs (< servers)."""
    if servers > EXACT_UP_TO:  # Halfin-Whitt: beta = (c - a) / sqrt(c), P = 1 / (1 + beta Phi(beta) / phi(beta))
        beta = (servers - load) / math.sqrt(servers)
        if beta > 30:  # phi(beta) underflows; the probability is below 1e-190
            return 0.0
        phi = math.exp(-beta * beta / 2) / math.sqrt(2 * math.pi)
        return 1.0 / (1.0 + beta * 0.5 * (1 + math.erf(beta / math.sqrt(2))) / phi)
    b = 1.0
    for k in range(1, servers + 1):  # Erlang B by its stable recurrence
        b = load * b / (k + load * b)
    return b / (1.0 - load / servers * (1.0 - b))


def wait_fits(servers: int, load: float, headroom: float, percentile: str) -> bool:
    """Whether the wait of a request routed to one of `servers` on arrival is within `headroom` (in holds) at
    `percentile` (its share of the tail, half), or its mean within it for `mean` (module docstring)."""
    if load >= servers:
        return False
    busy = erlang_c(servers, load)
    if percentile == "mean":  # the residual half a hold, then a hold per request ahead: C / 2 + C^2 / (1 - C)
        return busy * (0.5 + busy / (1.0 - busy)) <= headroom
    steps, part = divmod(headroom, 1.0)
    return busy ** (1 + steps) * (1.0 - part) <= TAIL[percentile] / 2


@lru_cache(maxsize=65536)
def _erlangs(servers: int, headroom: float, percentile: str) -> float:
    """The largest load `servers` carry with the wait within `headroom` holds (bisection: the wait grows with it)."""
    lo, hi = 0.0, float(servers)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if wait_fits(servers, mid, headroom, percentile) else (lo, mid)
    return lo


def capacity(servers: int, hold: float, headroom: float, percentile: str) -> float:
    """The largest request rate `servers` servers of `hold` seconds a request carry with the wait within `headroom`
    seconds at `percentile`."""
    return _erlangs(servers, headroom / hold, percentile) / hold


def size_pools(output: int, prefill_step: float, prefill_ranks: int, headroom: float, decode_batch: int,
               tpot: float, decode_ranks: int, budget: int, percentile: str = "p99",
               rate: float | None = None) -> Pools | None:
    """The pools within `budget` ranks that serve the most requests per rank: for each count of decode instances
    (each `decode_batch` slots held output x `tpot`), the fewest prefill instances (one prompt of `prefill_step` at a
    time) that feed them, or one fewer, the decode pool then running below its rate. `rate`: the pools with the fewest
    ranks that carry this many requests/s instead (the most carrying ones when none does, their `unmet` saying so).
    `headroom`: the TTFT limit
    less one prompt's TTFT. None when not even one of each fits, or the prompt alone leaves no headroom."""
    max_prefill = (budget - decode_ranks) // prefill_ranks
    if max_prefill < 1 or headroom <= 0:
        return None
    hold = output * tpot
    caps = [capacity(c, prefill_step, headroom, percentile) for c in range(1, max_prefill + 1)]
    best, best_key = None, None
    for n_dec in range(1, (budget - prefill_ranks) // decode_ranks + 1):
        room = (budget - n_dec * decode_ranks) // prefill_ranks
        need = capacity(n_dec * decode_batch, hold, 0.0, percentile)
        enough = bisect_left(caps, need, hi=room) + 1  # prefill instances whose capacity reaches the decode rate
        for n_pre in {min(enough, room), max(1, min(enough, room) - 1)}:
            carried = min(need, caps[n_pre - 1])
            ranks = n_pre * prefill_ranks + n_dec * decode_ranks
            key = _preference(carried, ranks, rate)
            if carried > 0 and (best_key is None or key > best_key):
                best, best_key = Pools(n_pre, n_dec, carried if rate is None else min(carried, rate), rate), key
    return best


def _preference(carried: float, ranks: int, rate: float | None) -> tuple:
    """How size_pools ranks pools (the larger the better): without a rate, by requests/s per rank, then fewer ranks;
    with one, those that carry it before those that do not, then fewer ranks among the former (the cheapest that
    meet the load) and more requests/s among the latter (the closest miss)."""
    if rate is None:
        return carried / ranks, -ranks
    return (carried >= rate, -ranks if carried >= rate else carried)
