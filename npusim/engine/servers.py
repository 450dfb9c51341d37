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

A kernel's HBM is a `WriteBack` server: behind the write-back L2 its flows are reads, served first, and the bytes
written to L2 drain to it with the bandwidth the reads leave (npusim.engine.sim says why).
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
        self._add(flow)
        self._reschedule()

    def _add(self, flow: Flow) -> None:
        self.flows.append(flow)
        insort(self.order, flow, key=_cap)  # after equal caps: the order a stable sort of `flows` would give
        self.weight += flow.weight

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


class WriteBack(FluidServer):
    """HBM behind the write-back L2: its flows (reads) are served first, and the bytes written to L2 (dirty) go on
    to HBM with the bandwidth the reads leave.

    A write completes for its pipe when L2 has taken it; its `accept`ed bytes then wait in L2 as dirty data. They
    drain at the bandwidth the flows leave (nobody waits on them, so none of the flows' rates depends on how many
    there are), up to `capacity`: a write that finds more dirty bytes than that waits until the drain has brought
    them back to it (a replacement writes back before new data enters), and while writes wait the drain is a flow
    of the server with one share per waiting write, as they would have had writing through. The dirty level is
    advanced lazily, like a flow's bytes: between two reschedules the drain's rate is constant, so the level is a
    line cut at zero, and running dry needs no event.
    """

    def __init__(self, env: simpy.Environment, name: str, bandwidth: float, capacity: float):
        super().__init__(env, name, bandwidth)
        self.capacity = capacity  # dirty bytes (all copies) L2 holds before a write waits for HBM
        self.dirty = 0.0  # as of `stamp`
        self.drain = bandwidth  # bytes/s the dirty bytes leave at since `stamp` (what the flows leave)
        self.waiting: list[tuple[float, int, Callable[[], None]]] = []  # writes over capacity: (bytes, weight, done)
        self.forced: Flow | None = None  # the drain while writes wait (bytes per share above capacity)
        self.emptied = 0  # times the dirty bytes ran out (sim.py: a steady state without one may drift)
        self.accepted = 0.0  # bytes taken into L2, all copies

    def accept(self, size: float, weight: int, done: Callable[[], None]) -> None:
        """A write of `size` dirty bytes (all copies) by `weight` copies has reached L2: `done` when it is taken."""
        self._advance()
        if self.dirty <= self.capacity and not self.waiting:
            self._take(size)
            done()
            return
        self.waiting.append((size, weight, done))
        self._force()

    def level(self, now: float) -> tuple[float, int]:
        """(dirty bytes, times emptied) at `now`, without advancing the server."""
        left = self.dirty - self.drain * (now - self.stamp)
        if left > 0.0 or self.dirty <= 0.0:
            return max(left, 0.0), self.emptied
        return 0.0, self.emptied + 1

    def finish(self) -> float:
        """When the last dirty byte has reached HBM, once no flow is left (the end of the kernel)."""
        self._advance()
        tail = self.dirty / self.drain if self.dirty > 0.0 else 0.0
        self.busy += tail
        self.dirty = 0.0
        return self.stamp + tail

    def _take(self, size: float) -> None:
        self.dirty += size
        self.moved += size
        self.accepted += size

    def _force(self) -> None:
        """(Re)start the drain that the waiting writes share in."""
        if self.forced is not None:
            self.flows.remove(self.forced)
            self.order.remove(self.forced)
            self.weight -= self.forced.weight
        weight = sum(w for _, w, _ in self.waiting)
        self.forced = Flow(-1, max(0.0, self.dirty - self.capacity) / weight, math.inf, weight, self._admit)
        self._add(self.forced)
        self._reschedule()

    def _admit(self) -> None:
        """The drain has brought the dirty bytes back to capacity: the first waiting write is taken."""
        self.forced = None
        self.dirty = self.capacity
        size, _, done = self.waiting.pop(0)
        self._take(size)
        done()
        if self.waiting:
            self._force()
        else:
            self._set_drain()

    def _advance(self) -> None:
        dt = self.env.now - self.stamp
        if dt > 0.0 and self.dirty > 0.0 and self.drain > 0.0:
            if not self.flows:
                self.busy += min(dt, self.dirty / self.drain)
            self.dirty -= self.drain * dt
            if self.dirty <= 0.0:
                self.dirty = 0.0
                self.emptied += 1
        super()._advance()

    def _reschedule(self) -> None:
        super()._reschedule()
        self._set_drain()

    def _set_drain(self) -> None:
        if self.forced is not None:
            self.drain = self.forced.rate * self.forced.weight
        else:
            self.drain = max(0.0, self.bandwidth - self.held - sum(f.rate * f.weight for f in self.flows))

    def state(self) -> tuple[tuple, list[float]]:
        structure, left = super().state()
        return structure + (tuple(w for _, w, _ in self.waiting),), left
