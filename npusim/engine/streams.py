"""Streams: a layer as kernel launches and collectives on streams, with events between them, run on simpy.

Each stream runs its tasks in order (like an NPU stream); a task also waits for the tasks named in `after` (events
recorded on other streams). A task holds `units` of a resource while it runs: compute tasks hold AI cores (a kernel
on all cores excludes any other kernel; two kernels on disjoint core partitions run side by side), collectives hold
a link. Overlap of communication and computation is therefore computed from the schedule, not taken as a max().

Kernels side by side on disjoint core partitions also share the chip's HBM and L2: a task may carry `flows`, the
bytes it moves through named shared servers (fluid, max-min fair, engine/servers.py). Alone, a task moves them at
the rate its own simulation found (bytes / duration, per AIC it holds) and lasts exactly its duration; beside
another partition's kernel the two are served together, each core capped at its own rate, and a task ends when its
bytes are through. Limit: a kernel's traffic is taken as steady over its duration (its bursts are not seen).

Communication kernels beside compute kernels (issue 14 item 3): a collective on the comm stream moves its bytes
through the die's HBM like any kernel (`flows`), and one that runs on the vector cores (HCCL's AIV mode, the fused MC2
dispatch / combine) `holds` that many AIV cores while it runs. The AIV cores are a server too: a compute kernel's
`aiv` flow is its AIV count times its duration (core-seconds, each core at most 1 core-second per second); a holder
takes its cores out of the server at once and gives them back when it ends (its HBM flow takes one fair share per
core it holds, `issuers`), so a kernel on every AIV beside an HCCL
kernel holding h of V runs its vector part at (V - h) / V of its rate, and beside the MC2 dispatch holding all V its
AIV part waits for it. A cube-only kernel (no AIV program) is not slowed by held AIV cores. Limits: the cores are
fluid (a kernel whose blocks fill the AIVs in one wave would run a second, partial wave; the fluid share charges
that as a slower rate), and a holder never waits for a running kernel's blocks to free its cores (on the NPU a comm
kernel launched while a kernel holds every core starts as blocks finish): the work is conserved, its order is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import simpy

from npusim.engine.servers import FluidServer, Flow
from npusim.errors import NpusimError


@dataclass(frozen=True)
class Task:
    name: str
    stream: str
    duration: float
    after: tuple[str, ...] = ()
    resource: str = "cores"  # "" for none
    units: int = 1
    category: str = "compute"  # compute | comm | launch
    flows: tuple[tuple[str, float], ...] = ()  # (shared server, bytes) moved over the task's duration
    holds: tuple[tuple[str, float], ...] = ()  # (shared server, amount) taken from its flows while the task runs
    issuers: int = 0  # the DMA issuers its flows are shared among, one share each (0: its units)


@dataclass(frozen=True)
class Span:
    task: Task
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    spans: tuple[Span, ...]

    @property
    def makespan(self) -> float:
        return max((s.end for s in self.spans), default=0.0)

    def busy(self, category: str) -> float:
        """Wall time during which at least one task of `category` runs."""
        return _length(_union((s.start, s.end) for s in self.spans if s.task.category == category))

    def exposed(self, category: str = "comm", behind: str = "compute") -> float:
        """Wall time of `category` not hidden behind any `behind` task."""
        own = _union((s.start, s.end) for s in self.spans if s.task.category == category)
        cover = _union((s.start, s.end) for s in self.spans if s.task.category == behind)
        return _length(own) - _length(_intersect(own, cover))

    def chrome_events(self, pid: int = 0, process: str = "rank 0", offset: float = 0.0) -> list[dict]:
        """Trace Event Format: one thread per stream, times in microseconds."""
        streams = sorted({s.task.stream for s in self.spans})
        tid = {name: i for i, name in enumerate(streams)}
        events = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": process}}]
        events += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid[s], "args": {"name": s}} for s in streams]
        events += [{"ph": "X", "name": s.task.name, "cat": s.task.category, "pid": pid, "tid": tid[s.task.stream],
                    "ts": (offset + s.start) * 1e6, "dur": (s.end - s.start) * 1e6} for s in self.spans]
        return events


def run_streams(tasks: Iterable[Task], capacity: dict[str, int], servers: dict[str, float] | None = None) -> Timeline:
    """Simulate the tasks; `capacity` gives the units of each resource (e.g. {'cores': 24, 'link': 1}), `servers`
    the bandwidth (bytes/s) of each shared server the tasks' flows name."""
    tasks = list(tasks)
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise NpusimError("task names on the streams must be unique")
    known = set(names)
    for t in tasks:
        missing = [a for a in t.after if a not in known]
        if missing:
            raise NpusimError(f"task '{t.name}' waits for unknown task(s) {missing}")
        unknown = [name for name, _ in t.flows + t.holds if name not in (servers or {})]
        if unknown:
            raise NpusimError(f"task '{t.name}' moves bytes through unknown server(s) {unknown}")
        if t.resource and t.units > capacity.get(t.resource, 0):
            raise NpusimError(f"task '{t.name}' needs {t.units} {t.resource} but only {capacity.get(t.resource, 0)} exist")
    env = simpy.Environment()
    pools = {r: simpy.Container(env, capacity=c, init=c) for r, c in capacity.items()}
    shared = {name: FluidServer(env, name, bw) for name, bw in (servers or {}).items()}
    done = {t.name: env.event() for t in tasks}
    spans: dict[str, Span] = {}

    def stream(queue: list[Task]):
        for t in queue:
            if t.after:
                yield simpy.AllOf(env, [done[a] for a in t.after])
            if t.resource:
                yield pools[t.resource].get(t.units)
            start = env.now
            for name, amount in t.holds:
                shared[name].hold(amount)
            moving = [(shared[name], size) for name, size in t.flows if size > 0.0 and t.duration > 0.0]
            if moving:
                yield simpy.AllOf(env, [_flow(env, server, i, size, t) for i, (server, size) in enumerate(moving)])
            else:
                yield env.timeout(t.duration)
            for name, amount in t.holds:
                shared[name].hold(-amount)
            if t.resource:
                yield pools[t.resource].put(t.units)
            spans[t.name] = Span(t, start, env.now)
            done[t.name].succeed()

    by_stream: dict[str, list[Task]] = {}
    for t in tasks:
        by_stream.setdefault(t.stream, []).append(t)
    for queue in by_stream.values():
        env.process(stream(queue))
    env.run()
    if len(spans) != len(tasks):
        stuck = [t.name for t in tasks if t.name not in spans]
        raise NpusimError(f"the stream schedule deadlocks: {stuck[:5]} never start (a cycle of waits)")
    return Timeline(tuple(spans[n] for n in names))


def _flow(env: simpy.Environment, server: FluidServer, owner: int, size: float, task: Task) -> simpy.Event:
    """The task's bytes through one server: `units` equal flows (one per core held) at the task's own rate."""
    event = env.event()
    weight = max(1, task.issuers or task.units)
    server.start(Flow(owner, size / weight, size / weight / task.duration, weight, event.succeed))
    return event


def _union(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _intersect(xs, ys) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)
