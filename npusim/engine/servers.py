"""Shared bandwidth (HBM, L2) as fluid processor-sharing servers.

Why fluid: 24 cores streaming tiles at once must saturate HBM, not get 24 x its bandwidth, and modelling every
cacheline would cost millions of events. A server holds the transfers active at this instant; their rates are the
server bandwidth shared max-min fairly (a transfer never exceeds the per-core rate of the pipe that issued it) and
are re-evaluated only when a transfer starts or ends, so a transfer costs two events however large it is.

A flow has a `weight`: a folded group (Group.copies = n) is simulated once, and each of its transfers stands for n
identical transfers issued at the same instant by the n copies; it takes n shares of the server, each moving
`remaining` bytes at `rate` bytes/s.
"""

from __future__ import annotations

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


class FluidServer:
    """A bandwidth shared by the flows active at each instant (weighted max-min fair, each flow capped)."""

    def __init__(self, env: simpy.Environment, name: str, bandwidth: float):
        self.env = env
        self.name = name
        self.bandwidth = bandwidth
        self.flows: list[Flow] = []
        self.stamp = 0.0  # time up to which `remaining` is accounted
        self.moved = 0.0  # bytes, all copies
        self.busy = 0.0  # seconds with at least one active flow
        self._wake: simpy.Event | None = None

    def start(self, flow: Flow) -> None:
        self._advance()
        self.moved += flow.remaining * flow.weight
        self.flows.append(flow)
        self._reschedule()

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self.stamp
        if dt > 0.0 and self.flows:
            self.busy += dt
            for f in self.flows:
                f.remaining -= f.rate * dt
        self.stamp = now

    def _allocate(self) -> None:
        """Water-filling: flows below the fair level keep their cap, the rest share what is left equally."""
        left = self.bandwidth
        weight = sum(f.weight for f in self.flows)
        for f in sorted(self.flows, key=lambda f: f.cap):
            level = left / weight
            if f.cap <= level:
                f.rate = f.cap
                left -= f.cap * f.weight
                weight -= f.weight
            else:
                f.rate = level

    def _reschedule(self) -> None:
        if self._wake is not None:
            self._wake.callbacks.remove(self._on_wake)  # superseded: the event still fires, but does nothing
            self._wake = None
        if not self.flows:
            return
        self._allocate()
        dt = min(f.remaining / f.rate for f in self.flows)
        self._wake = self.env.timeout(max(dt, 0.0))
        self._wake.callbacks.append(self._on_wake)

    def _on_wake(self, _event) -> None:
        self._wake = None
        self._advance()
        finished = [f for f in self.flows if f.remaining <= f.rate * 1e-15 + 1e-9]  # within a femtosecond
        if not finished:  # float round-off left a sliver: finish the nearest one
            finished = [min(self.flows, key=lambda f: f.remaining / f.rate)]
        for f in finished:
            self.flows.remove(f)
        self._reschedule()
        for f in finished:
            f.done()

    # ----------------------------------------------------------------------------------- steady-state support
    def state(self) -> tuple[tuple, list[float]]:
        """Structure (who is transferring) and numbers (bytes left) for the periodicity check."""
        return tuple((f.owner, f.cap, f.weight) for f in self.flows), [f.remaining for f in self.flows]

    def shift(self, dt: float) -> None:
        """The whole chip jumped `dt` ahead in a periodic state: only the clock stamp moves."""
        self.stamp += dt
