"""Shared bandwidth (HBM, L2) as fluid processor-sharing servers.

Why fluid: 24 cores streaming tiles at once must saturate HBM, not get 24 x its bandwidth, and modelling every
cacheline would cost millions of events. A server holds the transfers active at this instant; their rates are the
server bandwidth shared max-min fairly (a transfer never exceeds the per-core rate of the pipe that issued it) and
are re-evaluated only when a transfer starts or ends, so a transfer costs two events however large it is.

A server can be `held`: a communication kernel holding AIV cores takes them out of what the compute flows share
until it releases them (a held server serves nothing; its flows wait).

A flow has a `weight`: a folded group (Group.copies = n) is simulated once, and each of its transfers stands for n
identical transfers issued at the same instant by the n copies; it takes n shares of the server, each moving
`remaining` bytes at `rate` bytes/s.
"""

from __future__ import annotations

import math
from bisect import insort
from typing import Callable

import simpy


class Flow:
    """One transfer (times `weight` identical copies) through one server."""

    __slots__ = ("owner", "remaining", "cap", "weight", "rate", "done")

    def __init__(self, owner: int, size: float, cap: float, weight: int, done: Callable[[], None]):
        self.owner = owner  # runner index, for the periodicity snapshot
        self.remaining = size
        self.cap = cap
        self.weight = weight
        self.rate = 0.0
        self.done = done


def _cap(flow: Flow) -> float:
    return flow.cap


class FluidServer:
    """A bandwidth shared by the flows active at each instant (weighted max-min fair, each flow capped)."""

    def __init__(self, env: simpy.Environment, name: str, bandwidth: float):
        self.env = env
        self.name = name
        self.bandwidth = bandwidth
        self.flows: list[Flow] = []  # in order of arrival
        self.order: list[Flow] = []  # the same, by cap
        self.weight = 0  # sum of the flows' weights
        self.held = 0.0  # bandwidth taken out by holders (engine/streams.py)
        self.stamp = 0.0  # time up to which `remaining` is accounted
        self.moved = 0.0  # bytes, all copies
        self.busy = 0.0  # seconds with at least one active flow
        self._wake: simpy.Event | None = None
        self._wake_at = math.inf  # when the pending wake-up fires
        self._due = math.inf  # when the first active flow completes

    def start(self, flow: Flow) -> None:
        self._advance()
        self.moved += flow.remaining * flow.weight
        self.flows.append(flow)
        insort(self.order, flow, key=_cap)  # after equal caps: the order a stable sort of `flows` would give
        self.weight += flow.weight
        self._reschedule()

    def hold(self, amount: float) -> None:
        """Take `amount` of the bandwidth away from the flows (negative: give it back)."""
        self._advance()
        self.held += amount
        self._reschedule()

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self.stamp
        if dt > 0.0 and self.flows:
            self.busy += dt
            for f in self.flows:
                f.remaining -= f.rate * dt
        self.stamp = now

    def _reschedule(self) -> None:
        """Water-filling (flows below the fair level keep their cap, the rest share what is left equally), then a
        wake-up at the first completion. A wake-up already due no later is kept: when it fires early the server just
        looks again (a new flow only slows the others, so this spares most superseded events)."""
        if not self.flows:
            self._due = math.inf
            return
        left, weight, first = max(0.0, self.bandwidth - self.held), self.weight, math.inf
        for f in self.order:
            level = left / weight
            if f.cap <= level:
                f.rate = rate = f.cap
                left -= rate * f.weight
                weight -= f.weight
            else:
                f.rate = rate = level
            t = f.remaining / rate if rate > 0.0 else math.inf
            if t < first:
                first = t
        now = self.env.now
        if first == math.inf and not any(f.rate > 0.0 for f in self.flows):  # all wait for a holder's bandwidth
            # (a flow moving, however slowly, ends: at infinity when a rate too small to time overflows its time)
            self._due = math.inf
            if self._wake is not None:
                self._wake.callbacks.remove(self._on_wake)
                self._wake, self._wake_at = None, math.inf
            return
        self._due = now + max(first, 0.0)
        if self._wake is not None:
            if self._wake_at <= self._due:
                return
            self._wake.callbacks.remove(self._on_wake)  # superseded: the event still fires, but does nothing
        self._wake_at = self._due
        self._wake = self.env.timeout(self._due - now)
        self._wake.callbacks.append(self._on_wake)

    def _on_wake(self, _event) -> None:
        self._wake = None
        self._advance()
        if self.env.now < self._due:  # an early wake-up kept by _reschedule: look again at the real due time
            self._wake_at = self._due
            self._wake = self.env.timeout(self._due - self.env.now)
            self._wake.callbacks.append(self._on_wake)
            return
        finished = [f for f in self.flows if f.remaining <= f.rate * 1e-15 + 1e-9]  # within a femtosecond
        if not finished:  # float round-off left a sliver: finish the nearest one
            finished = [min(self.flows, key=lambda f: f.remaining / f.rate if f.rate > 0.0 else math.inf)]
        for f in finished:
            self.flows.remove(f)
            self.order.remove(f)
            self.weight -= f.weight
        self._reschedule()
        for f in finished:
            f.done()

    # ----------------------------------------------------------------------------------- steady-state support
    def state(self) -> tuple[tuple, list[float]]:
        """Structure (who is transferring) and numbers (bytes left) for the periodicity check."""
        return tuple((f.owner, f.cap, f.weight) for f in self.flows), [f.remaining for f in self.flows]

    def shift(self, dt: float) -> None:
        """The whole chip jumped `dt` ahead in a periodic state: only the clock stamps move."""
        self.stamp += dt
        self._due += dt
        self._wake_at += dt
