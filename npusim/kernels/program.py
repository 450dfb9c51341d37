"""Tile programs in the vocabulary of Ascend C: queues between pipes, the stages that use them, and the flags they
become.

Model
-----
A tile trace (npusim.kernels.trace) synchronises pipes with counting semaphores: an instruction waits on flags before
it starts and raises flags when it is done, and a group's initial counts say how many buffers start free. An Ascend C
kernel never writes those flags. It declares queues (`TQue`) whose buffers the resource manager (`TPipe`) allocates
(`InitBuffer(que, num, len)`: `num` buffers of `len` bytes, 2 being double buffering), and its stages (CopyIn,
Compute, CopyOut) hand tensors through them: the producer `AllocTensor`s a buffer (waits until one is free), fills it
and `EnQue`s it (raises "full"); the consumer `DeQue`s it (waits until one is full), reads it and `FreeTensor`s it
(raises "free"). This module is that layer for the trace:

* `TileProgram` is the TPipe of one launch: it declares the queues and resident buffers, checks that they fit the
  chip, gives each core its `Code` and, at the end, the groups with every flag's initial count (a queue's free
  buffers, its depth).
* `Queue`: `depth` buffers handed from a producer (core, pipe) to a consumer (core, pipe). On one core (GM -> L1 ->
  L0 -> L0C -> GM on the AIC, GM -> UB -> vector -> GM on an AIV) or between the AIC and its AIVs through a GM
  workspace: the cross-core flags of Ascend C's CrossCoreSetFlag / CrossCoreWaitFlag in mode 2, where the AIC's set
  reaches both AIVs and the AIC's wait needs both. A queue has one lane per AIV that uses it (each AIV its own
  flags, "in.free0", "in.free1"); the AIC side of a cross-core queue acts on all lanes, or on one (`lane=`). A buffer
  may pass through more than two stages (load -> compute -> store in one UB buffer, as Ascend C's TQueBind binds
  VECIN to VECOUT), and a stage may be skipped (`enque(q, to=pipe)`).
* `Code` writes one core's program in order, as an Ascend C stage reads: `alloc(q)` and `deque(q)` become waits of
  the next instruction, `enque(q)` and `free(q)` sets of the last one, so "raise L1 full only on the last load of a
  tile" or "free it only on the last L0 copy" is written where it happens; `loop`, `pingpong` (a double-buffered
  loop unrolled by two so each copy names its static slot), `extend` (a fragment built once by a `fork`) and
  `fragment` (a stage's fragment built once per program and arguments, then spliced) shape the body. `sync_all`
  is the all-core barrier (AscendC SyncAll).

Flags are named after their queue and lane ("l1.free", "s.full0") and scoped to a group as before; their names carry
no meaning (a trace's canonical form renames them). Buffering: the plan's `buffering` depth is the depth of every
queue declared double-buffered (depth 2) unless it is declared `fixed`; single buffers, rings of three and
workspaces whose slots the code names keep their depth.

Checks, each an NpusimError at trace-build time naming the kernel, the queue and the stage:
* a deque issued on another pipe than the queue's consumer stage, an enque from a pipe that does not come before the
  stage it fills, an alloc or free on the wrong core, a queue used with no instruction to carry its flag;
* a loop body or block body that does not balance (it would deadlock or drift after a few iterations): on a core
  holding both ends, every flag raised as often as awaited; on the producer's side of a cross-core queue, as many
  buffers filled as taken; on the consumer's, as many freed as drained;
* a queue drained but never filled (or filled but never drained) in a launch;
* queues whose buffers (depth x slot bytes, beside the `reserve`d resident buffers) do not fit a buffer level.

Limits: balance is counted, not proven: a balanced body can still deadlock across cores (the engine and the
functional executor then say so). The pipes that alloc and free are not checked (a buffer is taken by whichever
pipe starts filling it and given back by the last one to read it). A launch's bands are checked together, not per
folded group. A kernel may report buffer use beyond its queues (phases that reuse UB differently) itself.

How to write a kernel on this layer
-----------------------------------
1. In `build(chip)` make `prog = TileProgram(self.name, chip, self.buffering)` and declare the queues, e.g.
   `l1 = prog.queue("l1", (AIC, "mte2"), (AIC, "mte1"), depth=2, slot={"l1": tile_bytes})` or, AIC -> both AIVs
   through GM, `s = prog.queue("s", (AIC, "fixpipe"), (AIV, "mte2"), depth=2)`; `prog.reserve(level, bytes)` for
   resident buffers (Ascend C's TBuf).
2. Write the stages as methods taking the core's `Code` first, decorated with `@stage` (CopyIn, Compute, CopyOut;
   C1 / V1 / C2 / V2): each emits its instructions with `c.op(pipe, name, action, bytes=..., ...)` between the queue
   calls, e.g. `c.alloc(l1); c.op("mte2", "load", ...); c.enque(l1)` and `c.deque(l1); c.op("mte1", ...); ...;
   c.free(l1)`. Conditions such as "first step of the tile" are plain Python around the queue call.
3. A block's body is `c = prog.code(AIC)` (or `prog.code(AIV, a)`), the stages called in program order, then
   `c.body()`; bodies go into `Band`s as before and `prog.groups(bands, cores)` spreads them over the cores with the
   flags' initial counts (or `prog.placed(runs)` gives core c its own run of bands, for kernels that split their
   work into contiguous per-core runs). `prog.buffers()` is the per-core buffer use for the Trace, `prog.tiling()`
   its buffering.
No kernel file names a flag or writes `wait=` / `set=`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from npusim.errors import NpusimError
from npusim.kernels.base import Band, addr, capacity, distribute, place
from npusim.kernels.tile import Lin, lin
from npusim.kernels.trace import CORE_PIPES, Group, Instr, Loop, Node
from npusim.spec.chip import Chip

AIC, AIV = "aic", "aiv"
AIVS = 2  # vector cores per AI core in split mode (the lanes of a queue the AIC shares with its AIVs)


@dataclass(frozen=True)
class Queue:
    """`depth` buffers handed along `stages` ((core kind, pipe), producer first); `slot`: bytes per buffer at each
    buffer level it occupies."""

    name: str
    stages: tuple[tuple[str, str], ...]
    depth: int
    slot: tuple[tuple[str, float], ...] = ()

    @property
    def cross(self) -> bool:
        """Between the AIC and its AIVs (through a GM workspace) rather than on one core."""
        return len({core for core, _ in self.stages}) > 1

    @property
    def lanes(self) -> tuple[str, ...]:
        return tuple(str(a) for a in range(AIVS)) if any(core == AIV for core, _ in self.stages) else ("",)

    def flag(self, k: int, lane: str) -> str:
        """Stage 0's flag counts free buffers; stage k's, buffers handed to it."""
        kind = "free" if k == 0 else "full" if len(self.stages) == 2 else self.stages[k][1]
        return f"{self.name}.{kind}{lane}"

    def describe(self) -> str:
        return f"queue '{self.name}' ({' -> '.join(f'{c}.{p}' for c, p in self.stages)})"


def stage(method: Callable) -> Callable:
    """A kernel's stage: a method whose first argument is the core's Code; misuse inside it is reported under its
    name."""

    @functools.wraps(method)
    def run(self, code: "Code", *args, **kwargs):
        code.stages.append(method.__name__)
        try:
            return method(self, code, *args, **kwargs)
        finally:
            code.stages.pop()

    return run


class TileProgram:
    """The queues and resident buffers of one kernel launch (Ascend C's TPipe) on `chip`; `buffering` (0 = as
    written) is the depth of its double-buffered queues."""

    def __init__(self, kernel: str, chip: Chip, buffering: int = 0):
        self.kernel, self.chip, self.buffering = kernel, chip, buffering
        self.queues: dict[str, Queue] = {}
        self.reserved: dict[str, float] = {}
        self.flag_of: dict[str, tuple[Queue, int, str]] = {}  # flag -> (queue, stage, lane)
        self.users: dict[str, set[str]] = {}  # queue -> stages that used it (for messages)
        self.fragments: dict[tuple, tuple[tuple[Node, ...], Tally]] = {}  # Code.fragment's built fragments
        self.written: dict[int, tuple[tuple[Node, ...], Tally]] = {}  # id of a Code.body() -> (body, its tally)
        self._sides: dict[tuple[str, str, bool], tuple[Any, int]] = {}  # side()'s answers

    def error(self, what: str, q: Queue | None = None, where: str | set[str] = "",
              field: str = "tiling") -> NpusimError:
        """`where`: the stage, or the stages that used the queue."""
        names = sorted(where) if isinstance(where, set) else [where] if where else []
        at = f" in stage{'s' if len(names) > 1 else ''} {', '.join(repr(n) for n in names)}" if names else ""
        on = f" {q.describe()}" if q else ""
        return NpusimError(f"{self.kernel}{at}:{on} {what}", field=field)

    # ------------------------------------------------------------------------------------------------ declaring
    def queue(self, name: str, *stages: tuple[str, str], depth: int, slot: dict[str, float] | None = None,
              fixed: bool = False) -> Queue:
        """A queue through `stages` ((core kind, pipe), producer first) with `depth` buffers of `slot` bytes per
        level; depth 2 (double buffering) follows the plan's buffering unless `fixed`."""
        if name in self.queues:
            raise self.error(f"declares queue '{name}' twice")
        if len(stages) < 2 or any(core not in CORE_PIPES or pipe not in CORE_PIPES[core] for core, pipe in stages):
            raise self.error(f"queue '{name}' needs two or more (core, pipe) stages of {dict(CORE_PIPES)}")
        if len(stages) > 2 and len({core for core, _ in stages}) > 1:
            raise self.error(f"queue '{name}': a queue between cores has two stages (one hand-off through GM)")
        if self.buffering and depth == 2 and not fixed:
            depth = self.buffering
        q = Queue(name, tuple(stages), depth, tuple((slot or {}).items()))
        self.queues[name] = q
        self.users[name] = set()
        for k in range(len(stages)):
            for lane in q.lanes:
                self.flag_of[q.flag(k, lane)] = (q, k, lane)
        return q

    def reserve(self, level: str, nbytes: float) -> None:
        """A resident buffer (Ascend C's TBuf: Q kept in L1, a running state in UB) beside the queues."""
        self.reserved[level] = self.reserved.get(level, 0.0) + nbytes

    def code(self, core: str, aiv: int = 0) -> "Code":
        """An empty program body for the AIC or AIV `aiv` of an AI core."""
        if core not in (AIC, AIV) or not 0 <= aiv < AIVS:
            raise self.error(f"has no core '{core}' {aiv} (aic, or aiv 0..{AIVS - 1})")
        return Code(self, core, aiv)

    # ------------------------------------------------------------------------------------------------ results
    def buffers(self) -> dict[str, float]:
        """Bytes per core of each buffer level: every queue's depth x slot, and the reserved buffers."""
        out: dict[str, float] = {}
        for q in self.queues.values():
            for level, nbytes in q.slot:
                out[level] = out.get(level, 0.0) + q.depth * nbytes
        for level, nbytes in self.reserved.items():
            out[level] = out.get(level, 0.0) + nbytes
        return out

    def tiling(self) -> dict[str, int]:
        return {"buffering": self.buffering} if self.buffering else {}

    def flags(self) -> dict[str, int]:
        """Initial counts: a queue's free buffers on every lane, nothing handed on yet."""
        return {q.flag(k, lane): q.depth if k == 0 else 0
                for q in self.queues.values() for lane in q.lanes for k in range(len(q.stages))}

    def groups(self, bands: list[Band], cores: int) -> tuple[Group, ...]:
        """The bands spread over `cores` (base.distribute) once the queues fit and every one is filled and
        drained."""
        self.check_used(bands)
        return distribute(bands, cores, self.flags())

    def placed(self, runs: list[list[Band]]) -> tuple[Group, ...]:
        """Core c runs the bands of runs[c] in order (base.place), once the queues fit and every one is filled and
        drained."""
        self.check_used([b for run in runs for b in run])
        return place(runs, self.flags())

    def check_used(self, bands: list[Band]) -> None:
        """The queues fit, and every queue the bands drain is filled by them (and the other way round)."""
        self.check_fits()
        bodies = [(b.aic or (), AIC) for b in bands] + [(body, AIV) for b in bands for body in b.aiv + b.lead]
        waits: set[str] = set()
        sets: set[str] = set()
        for body, core in bodies:
            known = self.written.get(id(body))
            waited, raised = (known[1] if known and known[0] is body else Tally.of(body, self, core)).flags()
            waits |= waited
            sets |= raised
        for flag, (q, k, _) in self.flag_of.items():
            if k and flag in waits and flag not in sets:
                raise self.error(f"is drained by stage {q.stages[k][1]} but nothing fills it", q, self.users[q.name])
            if k and flag in sets and flag not in waits:
                raise self.error(f"is filled but no {q.stages[k][1]} stage drains it", q, self.users[q.name])

    def check_fits(self) -> None:
        cap, used = capacity(self.chip), self.buffers()
        for level, total in used.items():
            if level in cap and total > cap[level]:
                held = [q for q in self.queues.values() if dict(q.slot).get(level)]
                parts = ", ".join(f"'{q.name}' {q.depth} x {dict(q.slot)[level] / 1024:g} KiB" for q in held)
                if self.reserved.get(level):
                    parts += f", resident {self.reserved[level] / 1024:g} KiB"
                users = set().union(*(self.users[q.name] for q in held))
                raise self.error(f"the buffers of {level.upper()} ({parts}) need {total / 1024:g} KiB per core but "
                                 f"{self.chip.name} has {cap[level] / 1024:g} KiB ({(total - cap[level]) / 1024:g} "
                                 "KiB too many)", None, users, field=f"tiling.{level}")

    def side(self, flag: str, core: str, waiting: bool) -> tuple[Any, int]:
        """What awaiting (or raising) `flag` on `core` does to the count `check_balance` checks: the flag itself on
        a queue within one core; on a cross-core queue, its lane on this side (buffers taken or drained: +1,
        filled or freed: -1); an unknown flag marks the body for the full check, which names it."""
        memo = self._sides.get((flag, core, waiting))
        if memo is not None:
            return memo
        if flag not in self.flag_of:
            out: tuple[Any, int] = (("?", flag), 1)
        else:
            q, k, lane = self.flag_of[flag]
            last = len(q.stages) - 1
            if not q.cross:
                out = (flag, -1 if waiting else 1)
            elif core == q.stages[0][0]:
                out = ((q.name, lane), 1 if waiting and k == 0 else -1 if not waiting and k == last else 0)
            else:
                out = ((q.name, lane), 1 if waiting and k == last else -1 if not waiting and k == 0 else 0)
        self._sides[(flag, core, waiting)] = out
        return out

    def check_balance(self, body: tuple[Node, ...], code: "Code", where: str, tally: "Tally | None" = None) -> None:
        """One pass of `body` on `code`'s core leaves every queue as it found it (see the module docstring); a body
        whose `tally` nets to zero everywhere passes without a recount."""
        if tally is not None and not any(tally.net.values()):
            return
        waits, sets = Counter(), Counter()
        for n in body:
            if isinstance(n, Instr):
                waits.update(n.wait)
                sets.update(n.set)
        for flag in sorted(waits.keys() | sets.keys()):
            if flag not in self.flag_of:
                raise self.error(f"has flag '{flag}' in {where} that no queue of this program raises", None,
                                 code.stage_name)
            q, _, lane = self.flag_of[flag]
            free, last = q.flag(0, lane), q.flag(len(q.stages) - 1, lane)
            if not q.cross:
                a, b, what = sets[flag], waits[flag], "raised {} times but awaited {} times"
            elif code.core == q.stages[0][0]:
                a, b, what = waits[free], sets[last], "taken {} times but filled {} times"
            else:
                a, b, what = waits[last], sets[free], "drained {} times but freed {} times"
            if a != b:
                raise self.error(f"is unbalanced in one pass of {where}: '{flag}' {what.format(a, b)}", q,
                                 code.stage_name or self.users[q.name])


class Tally:
    """What balance is checked on, counted as a body is written (so a fragment spliced at many places is counted
    once): per check of `TileProgram.check_balance` (a flag of a queue on one core, a lane of a cross-core queue on
    this side) the buffers handed on minus those taken back (`net`: all zero when the body balances), and every flag
    awaited and raised in the body, its loops' included (`waited`, `raised`: what `TileProgram.groups` checks)."""

    __slots__ = ("net", "waited", "raised", "parts")

    def __init__(self) -> None:
        self.net: dict[Any, int] = {}
        self.waited: set[str] = set()
        self.raised: set[str] = set()
        self.parts: list[Tally] = []  # spliced fragments and loop bodies, whose flags join waited / raised

    def instr(self, prog: TileProgram, core: str, wait: tuple[str, ...], set_: tuple[str, ...]) -> None:
        net = self.net
        for flags, waiting in ((wait, True), (set_, False)):
            for f in flags:
                key, sign = prog.side(f, core, waiting)
                if sign:
                    net[key] = net.get(key, 0) + sign
        self.waited.update(wait)
        self.raised.update(set_)

    def add(self, other: "Tally") -> None:
        """Another body's instructions spliced into this one."""
        net = self.net
        for key, n in other.net.items():
            net[key] = net.get(key, 0) + n
        self.nest(other)

    def nest(self, other: "Tally") -> None:
        """A loop's body inside this one."""
        self.parts.append(other)

    def flags(self) -> tuple[set[str], set[str]]:
        """Every flag awaited and every flag raised in the body, its parts' included (each distinct part once)."""
        waited, raised, seen, todo = set(self.waited), set(self.raised), {id(self)}, list(self.parts)
        while todo:
            t = todo.pop()
            if id(t) not in seen:
                seen.add(id(t))
                waited |= t.waited
                raised |= t.raised
                todo += t.parts
        return waited, raised

    @classmethod
    def of(cls, body: tuple[Node, ...], prog: TileProgram, core: str) -> "Tally":
        t = cls()
        for n in body:
            if type(n) is Loop:
                t.nest(cls.of(n.body, prog, core))
            else:
                t.instr(prog, core, n.wait, n.set)
        return t


class Code:
    """One core's program being written (see the module docstring): waits collect for the next instruction, sets
    go on the last one."""

    def __init__(self, prog: TileProgram, core: str, aiv: int):
        self.prog, self.core, self.aiv = prog, core, aiv
        self.stages: list[str] = []
        self._bodies: list[list[Node]] = [[]]
        self._tallies: list[Tally] = [Tally()]
        self._waits: list[tuple[str, str, Queue]] = []  # (flag, pipe that must wait on it or "", queue)

    @property
    def stage_name(self) -> str:
        return self.stages[-1] if self.stages else ""

    def _error(self, what: str, q: Queue | None = None) -> NpusimError:
        return self.prog.error(what, q, self.stage_name)

    # ------------------------------------------------------------------------------------------------ queue calls
    def alloc(self, q: Queue, lane: int | None = None) -> None:
        """AllocTensor: the next instruction waits for a free buffer."""
        self._on(q, 0, "alloc")
        self._waits += [(q.flag(0, ln), "", q) for ln in self._lanes(q, lane)]

    def deque(self, q: Queue, at: str = "", lane: int | None = None) -> None:
        """DeQue: the next instruction (on the consuming stage's pipe, `at` or the last) waits for a full buffer."""
        k = self._stage(q, at)
        self._on(q, k, "deque")
        self._waits += [(q.flag(k, ln), q.stages[k][1], q) for ln in self._lanes(q, lane)]

    def enque(self, q: Queue, to: str = "", lane: int | None = None) -> None:
        """EnQue: the last instruction hands its buffer to stage `to` (default the last)."""
        k = self._stage(q, to)
        self._on(q, 0, "enque")
        last = self._last(q, "enque")
        if (self.core, last.pipe) not in q.stages[:k]:
            raise self._error(f"is enqueued to {q.stages[k][1]} by {self.core}.{last.pipe}, not by an earlier stage",
                              q)
        self._raise(tuple(q.flag(k, ln) for ln in self._lanes(q, lane)))

    def free(self, q: Queue, lane: int | None = None) -> None:
        """FreeTensor: the last instruction gives the buffer back to the producer."""
        self._on(q, len(q.stages) - 1, "free")
        self._last(q, "free")
        self._raise(tuple(q.flag(0, ln) for ln in self._lanes(q, lane)))

    def _stage(self, q: Queue, pipe: str) -> int:
        if not pipe:
            return len(q.stages) - 1
        ks = [k for k in range(1, len(q.stages)) if q.stages[k][1] == pipe]
        if not ks:
            raise self._error(f"has no stage on {pipe}", q)
        return ks[0]

    def _on(self, q: Queue, k: int, call: str) -> None:
        """The queue is this program's and stage k of it runs on this core."""
        if self.prog.queues.get(q.name) is not q:
            raise self._error(f"uses {q.describe()} of another program")
        if q.stages[k][0] != self.core:
            raise self._error(f"calls {call} on the {self.core}, but that end is on the {q.stages[k][0]}", q)
        if self.stage_name:
            self.prog.users[q.name].add(self.stage_name)

    def _lanes(self, q: Queue, lane: int | None) -> tuple[str, ...]:
        if self.core == AIV:
            return (str(self.aiv),)
        if lane is not None and str(lane) not in q.lanes:
            raise self._error(f"has no lane {lane} (lanes: one per AIV of a queue with the AIVs)", q)
        return q.lanes if lane is None else (str(lane),)

    def _last(self, q: Queue, call: str) -> Instr:
        body = self._bodies[-1]
        if not body or not isinstance(body[-1], Instr):
            raise self._error(f"{call} has no instruction before it in this body to carry its flag", q)
        return body[-1]

    def _raise(self, flags: tuple[str, ...]) -> None:
        body = self._bodies[-1]
        body[-1] = dataclasses.replace(body[-1], set=body[-1].set + flags)
        self._tallies[-1].instr(self.prog, self.core, (), flags)

    # ------------------------------------------------------------------------------------------------ instructions
    def op(self, pipe: str, name: str, action: Any = None, **cost: Any) -> None:
        """One instruction (trace.Instr fields as keywords) carrying the waits collected since the last one."""
        if "wait" in cost or "set" in cost:
            raise self._error(f"instruction {pipe}:{name} names flags; hand buffers through queues instead")
        if pipe not in CORE_PIPES[self.core]:
            raise self._error(f"has no {pipe} pipe on the {self.core} (instruction {name})")
        for flag, need, q in self._waits:
            if need and need != pipe:
                raise self._error(f"is dequeued by {self.core}.{pipe} ({name}); its consumer stage is {need}", q)
        wait = tuple(f for f, _, _ in self._waits)
        self._bodies[-1].append(Instr(pipe, name, action=action, wait=wait, **cost))
        self._tallies[-1].instr(self.prog, self.core, wait, ())
        self._waits = []

    def addr(self, **bindings: Any) -> None:
        """Scalar address arithmetic binding the block's coordinates (base.addr)."""
        self._quiet("address arithmetic")
        self._bodies[-1].append(addr(**bindings))

    def extend(self, nodes: tuple[Node, ...], tally: Tally | None = None) -> None:
        """A prebuilt fragment (from `fork().nodes()`, its `tally` if known), spliced as it is."""
        self._quiet("a spliced fragment")
        self._bodies[-1].extend(nodes)
        self._tallies[-1].add(tally or Tally.of(nodes, self.prog, self.core))

    def fork(self) -> "Code":
        """An empty body on the same core, for a fragment built once and spliced many times."""
        sub = Code(self.prog, self.core, self.aiv)
        sub.stages = list(self.stages)
        return sub

    def fragment(self, write: Callable[..., None], *args: Any) -> None:
        """Splice the fragment that `write(code, *args)` (a stage) writes on this core, built once per program for
        each (write, core, AIV, args): a loop-compressed trace repeats a few fragments at many places."""
        key = (write, self.core, self.aiv, args)
        built = self.prog.fragments.get(key)
        if built is None:
            sub = self.fork()
            write(sub, *args)
            tally = sub._tallies[0]
            tally.net = {k: n for k, n in tally.net.items() if n}
            built = self.prog.fragments[key] = (sub.nodes(), tally)
        self.extend(*built)

    def nodes(self) -> tuple[Node, ...]:
        """The fragment written so far (no balance check: a fragment may hand a buffer to the next one)."""
        self._quiet("the end of a fragment")
        return tuple(self._bodies[0])

    @contextmanager
    def loop(self, count: int, var: str = "") -> Iterator[None]:
        """`count` passes of the body written inside the `with`; each pass must balance."""
        self._quiet(f"loop '{var}'")
        self._bodies.append([])
        self._tallies.append(Tally())
        yield
        self._quiet(f"the end of loop '{var}'")
        body, tally = tuple(self._bodies.pop()), self._tallies.pop()
        self.prog.check_balance(body, self, f"loop '{var}'", tally)
        self._bodies[-1].append(Loop(count, body, var))
        self._tallies[-1].nest(tally)

    def pingpong(self, count: int, var: str, make: Callable[[int, Lin], None], start: int = 0) -> None:
        """`count` iterations of a double-buffered body, unrolled by two so each copy names its static buffer slot:
        make(slot, i) writes one iteration, i its index as an expression of `var`. `start`: the slot of the first
        iteration (1 when the buffers' alternation carries on from a previous loop that ended on slot 0)."""
        if start and count:
            make(1, Lin(0))
        pairs, odd = divmod(count - bool(start and count), 2)
        first = 1 if start else 0
        if pairs:
            with self.loop(pairs, var):
                make(0, lin((var, 2), base=first))
                make(1, lin((var, 2), base=first + 1))
        if odd:
            make(0, Lin(count - 1))

    def sync_all(self) -> None:
        """AscendC SyncAll between phases: this vector core bumps a GM counter once its results are out (MTE3) and
        polls it (MTE2); the engine and the functional executor run `sync_all` as a barrier over all cores."""
        if self.core != AIV:
            raise self._error("calls sync_all on the AIC (only the vector cores synchronise this way)")
        q = self.prog.queues.get("sync") or self.prog.queue("sync", (AIV, "mte3"), (AIV, "mte2"), depth=0)
        self.op("mte3", "sync_all", bytes=32.0, dtype="int32", src="ub", dst="gm", hit=1.0)
        self.enque(q)
        self.deque(q)
        self.op("mte2", "sync_poll", bytes=32.0, dtype="int32", src="gm", dst="ub", hit=1.0)

    def body(self) -> tuple[Node, ...]:
        """The finished body of a block (run once per block, so it must balance like a loop body)."""
        nodes = self.nodes()
        self.prog.check_balance(nodes, self, "a block", self._tallies[0])
        self.prog.written[id(nodes)] = (nodes, self._tallies[0])
        return nodes

    def _quiet(self, where: str) -> None:
        if self._waits:
            flags = ", ".join(f for f, _, _ in self._waits)
            raise self._error(f"waits on {flags} are pending at {where}: write the instruction that carries them "
                              "first", self._waits[0][2])
