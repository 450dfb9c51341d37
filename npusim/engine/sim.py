"""The discrete-event execution of one tile trace on one chip (simpy).

Model
-----
* Every (group, core, pipe) that has instructions is a *runner*: a stream that walks its pipe's instructions in
  program order. Runners of one core run concurrently; that is the whole pipe parallelism of a DaVinci core.
* An instruction first takes its `wait` flags (counting semaphores scoped to the group, initial counts from
  `Group.flags`), then occupies its pipe for its start-up latency (`latency_cycles / clock`) plus its work, then
  raises its `set` flags. Pipes are pipelined units: an instruction issued back to back behind the previous one of
  its pipe (no flag wait) hides its latency behind that one's work, so only max(0, latency - previous work) shows;
  after a flag wait the full latency is paid. (This is what lets DMA streams keep HBM busy.)
  A flag raised by one core and awaited by another (AIC <-> AIV hand-off through GM) becomes visible only after
  `chip.overheads.cross_core_sync`.
* Work: CUBE takes max(flops / cube rate, operand bytes / cube feed rate); VECTOR likewise with the vector unit;
  both rates are scaled by `chip.efficiency.cube` / `.vector`. On-core copies (MTE1, FIXPIPE to L1...) move at
  their pipe's route rate. GM goes through L2: with Ascend C's default CACHE_MODE_NORMAL every GM access of MTE2,
  MTE3 and FIXPIPE enters L2, a miss is filled from GM, and a line replaced in L2 is written back to GM first
  ("Setting a Proper L2 CacheMode", CANN 8.5 Ascend C best practices, atlas_ascendc_best_practices_10_00014, A2 and
  A3). So a GM read is a fluid flow of all its bytes through the L2 read server and, for the share it misses
  (1 - `hit`), one through HBM; one core's DMA moves the hits at the pipe's GM route and the misses at its
  `hbm>DST` route where the chip gives one (a stream waiting on HBM latency), each flow capped so that both would
  end together at that mixed rate. A GM write is a flow through the L2 write server and ends there, L2 being a
  write-back cache; its bytes not marked `hit` (a workspace re-read soon stays in L2) are dirty and go on to HBM
  later. HBM serves reads first and drains the dirty bytes with the bandwidth the reads leave, as a memory
  controller buffers writes and turns to them when no read waits (gem5 src/mem/MemCtrl.py @ 392c1ce,
  write_low_thresh_perc "Threshold to start writes if the read queue is empty"; mem_ctrl.cc processNextReqEvent
  @ 145853d). The dirty bytes are bounded by L2's size: a write finding that many waits until the drain has made
  room (the replacement writes back before the new data enters), and while writes wait the drain takes a fair share
  of HBM per waiting write beside the reads (gem5 forces writes past write_high_thresh_perc). A kernel ends when
  HBM has every dirty byte (servers.WriteBack): its write traffic is its own, so no kernel beats its roofline by
  leaving writes to the next. L2 reads and writes are separate servers (the ini's l2_read_rate and l2_write_rate
  are separate paths), HBM one; the servers' bandwidths are scaled by `chip.efficiency.l2` / `.hbm` (servers.py).
* Discrete gathers: a GM read that stands for `issues` DMA instructions (the rows a gather selects, one instruction
  per row or pair of rows) first spends the time the core takes to issue the instructions after the first
  (`issue_cycles` each: the scalar's index read, address arithmetic and the copy's issue; the first is in the
  start-up latency), less its uncontended transfer, which streams behind the issue; then it transfers.
* Barrier chains: a VECTOR instruction that stands for `issues` instructions separated by PipeBarrier<PIPE_V> (the
  short dependent steps of a per-row reduction, a 4x4 Sinkhorn) adds `issue_cycles` for each one after the first:
  the barrier drains the pipeline and the scalar unit issues the next, a cost no streaming rate hides.
* An instruction named "sync_all" is the all-core barrier (AscendC SyncAll): after its own work the runner waits
  until every runner holding a sync_all has reached one or ended, and every program without one has ended (the
  functional executor's rule; free streams, below, excepted), then raises its sets. Folded copies count as their number.
* An on-core op that raises no flag followed by one that waits on none run as one op (a chain): nothing else can
  observe the boundary, and the second's start-up hides behind the first's work exactly as when issued back to
  back. This spares an event per link and is exact; recorded runs (Chrome traces) keep every instruction.
* A pipe whose stream neither waits, sets nor moves GM data (the scalar pipe's address arithmetic) cannot affect any
  other pipe: it is not run as a process but timed in closed form (each instruction its work plus the start-up not
  hidden behind the previous one's work), and the kernel lasts at least that long. Left running it would race ahead
  of the pipeline and keep the chip from ever looking periodic.
* Folded groups (`Group.copies = n`): the n copies run the same program on the same sizes from the same instant,
  so they stay in lockstep; one representative is simulated and each of its flows weighs n in the shared servers
  (it gets n shares and the others see n competitors). Statistics are multiplied by n where they are totals.

Loop compression (steady state, then exact extrapolation)
---------------------------------------------------------
Instructions carry no iteration-dependent data, so the simulated chip is a deterministic machine whose future
depends only on its state: each runner's position (loop frames and instruction index), what it is doing (time left
in its instruction, flag it waits on, its flows), the flag counts and waiter queues, the flows in the servers
(bytes left), the dirty bytes in L2 and the writes waiting for room, and cross-core flag raises in flight. Loop
iteration counters matter only when a loop exits, and the dirty bytes only when they run out or fill L2: while
they do neither, the drain takes whatever the reads leave at any level, so a level that grew (reads keep HBM busy)
or shrank over a period that is otherwise periodic is extrapolated like the totals, for as many periods as it
provably stays clear of zero and of L2's size (_drift).

Whenever a runner starts a loop iteration, the engine snapshots that state with times taken relative to now
(cheap: a few tuples per runner). If it equals (within 1e-6 relative) a snapshot taken at an earlier start of the
same loop by the same runner, the chip is periodic: after one period of dt seconds every loop counter that moved
moved by the same d >= 0 again, and loops that were re-entered are back at the same place. The engine then jumps
S whole periods at once: clock, pending events and cross-core raises shift by S*dt, every moved counter advances by
S*d, and busy times and bytes moved grow by S times their increase over the period. S is the largest
number of periods after which no moved loop has reached its last iteration, so every loop's exit (the epilogue)
and the start-up before the pipeline fills (the prologue) are simulated, never extrapolated. Periods of up to
`HISTORY` iterations are found by comparing with the last `HISTORY` snapshots: ping-pong buffers alternate every
two, and core groups running out of phase (e.g. after unequal work) share HBM and L2 in a pattern that recurs only
every few blocks.

The result differs from a full simulation only by the 1e-6 matching tolerance; tests check it.

Folded groups and phase (a modelling limit)
-------------------------------------------
Phase between folded groups is worth knowing about: each group stands for its copies in lockstep, and
how far apart the groups run decides how evenly they load the shared L2. An L2-bound kernel whose groups meet the
long loop in phase leaves L2 idle between bursts; out of phase it keeps it busier. For the causal 128K SFA on a 910C
die this spans 494-510 ms (-2.8 % to +0.4 % of the 508 ms of its balanced dealing), and when groups enter out of
phase the cycle they settle into can depend on float round-off. The tilings deal equal work to every core (the
causal ramps in paired units) so the groups run together, as the uniform (non-causal) shapes of the predictions do.

Dirty bytes belong to their kernel (a modelling limit)
-----------------------------------------------------
On the chip a kernel's dirty lines stay in L2 after it ends and are written back when later traffic replaces them;
npusim drains them within the kernel, in the HBM time its reads leave and after its last instruction, so a kernel's
time holds its own write traffic (in a step each kernel's write-back stands for the one its successors would do in
their idle HBM time). Only writes wait for room; a read miss never waits for a replacement's write-back, and the
kernel's L2 holds only its dirty bytes (its reused inputs are the trace's `hit` fractions, whatever L2 holds).

Faster is not always sooner (a modelling limit)
-----------------------------------------------
The shared servers are fair, not critical-path aware: a faster unit can start a transfer earlier, where it takes
bandwidth from one on the critical path, and a faster producer can fill its buffers and then pay the DMA start-up
that a slower one hid, so a fixed trace can end later on a faster chip. No work-conserving sharing rule blind to
the critical path is monotone everywhere (Graham's scheduling anomalies), and the hardware's arbiters are not
critical-path aware either. Reads first and writes ending in L2 removed the main source (issue 15's census,
benchmarks/monotonicity_census.py, at 831206a: 37 of 5,157 checks slower, writes sharing HBM with the reads the
critical path waited on: a W8A8 q_b_proj 256 x 1536 x 24576 on a 910B2 with twice the cube rate 60.9 -> 65.0 us,
RoPE 2048 tokens x 129 heads on a 910C with twice the vector rate 63.3 -> 65.1 us). What the census still finds,
9 of 3,474 checks (fewer checks: a step no longer times a carried input's launch cold as well), every one the
smaller chip's own tiling running later on the larger chip:
* L2 shared by phase-locked pipelines: V4 attention over 8192 tokens and keys with the 1:128 compressed keys on a
  910B1 or a 910C die, twice the HBM bandwidth, +3.9 % (2729.5 -> 2835.2 us): the cyclic schedule of the AICs' and
  AIVs' L2 streams has two steady states, and HBM 1.10x or faster starts it in the slower one (1.05x: 2727.1 us,
  1.10x: 2823.6 us); the lightning indexer with twice the cube rate +0.13 % (910B3 decode) and +0.18 % (a 910C's
  128K prefill), V4 attention 128 x 1024 with twice the HBM bandwidth +0.14 %, SFA on a 950DT with twice the vector
  rate +0.02 % (and the 32K prefill's TTFT that holds it, +0.01 %). With L2 ten times faster on both chips each of
  these is gone.
* Latency no longer hidden: the V4 indexer's KV compressor (m = 8) on a 950DT with twice the HBM bandwidth, +0.9 %
  (6.685 -> 6.742 us launched as a step does): its loads then outrun the cube, fill the L1 double buffer, and each
  load after a wait for a free buffer pays the DMA start-up that back-to-back loads hid.
A slower chip's schedule is one a faster chip could run (pace each unit to the slower rate), but neither the
hardware nor a tuner that measures tilings does that, so npusim reports the time the faster chip's pipes, run as
fast as they can, take. The tilings never make this worse for a buffer (npusim.engine.tune), but a rate's what-if
can show it; tests/test_monotonicity.py checks the rates end to end over its kernel families and predictions.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from heapq import heappop, heappush

import simpy
from simpy.events import NORMAL

from npusim.errors import NpusimError
from npusim.kernels.trace import CORE_PIPES, Instr, Trace
from npusim.engine.layout import GroupLayout, LoopView, layout
from npusim.engine.servers import FluidServer, Flow, WriteBack
from npusim.spec.chip import Chip

HISTORY = 12  # longest period, in loop iterations, that the steady-state check recognises
TOLERANCE = 1e-6  # relative difference under which two snapshots are the same state


class Flag:
    """A counting semaphore of one group (set_flag / wait_flag and the AIC<->AIV cross-core flags)."""

    __slots__ = ("name", "uid", "count", "waiters")

    def __init__(self, name: str, uid: int, count: int):
        self.name = name
        self.uid = uid
        self.count = count
        self.waiters: list[Runner] = []

    def release(self) -> None:
        if self.waiters:
            runner = self.waiters.pop(0)
            runner.act = GRANTED
            runner.wake()
        else:
            self.count += 1


class Barrier:
    """The all-core barrier: opens when the runners holding it have all arrived or ended (weighted by their copies)
    and every runner of a program without it has finished."""

    __slots__ = ("need", "arrived", "pending", "waiters")

    def __init__(self, need: int, pending: int):
        self.need = need  # weight of the runners whose stream holds a sync_all
        self.arrived = 0
        self.pending = pending  # weight of unfinished runners of programs without one
        self.waiters: list[Runner] = []

    def arrive(self, weight: int, runner: Runner) -> None:
        self.arrived += weight
        self.waiters.append(runner)
        self.open()

    def finished(self, weight: int) -> None:
        self.pending -= weight
        self.open()

    def retired(self, weight: int) -> None:
        """A runner that held barriers ended: later barriers no longer wait for it (a phase it has no part in)."""
        self.need -= weight
        self.open()

    def open(self) -> None:
        if self.waiters and self.arrived >= self.need and self.pending <= 0:
            waiters, self.waiters, self.arrived = self.waiters, [], 0
            for runner in waiters:
                runner.wake()


@dataclass(frozen=True, slots=True)
class Op:
    """An instruction compiled against the chip: what it waits for, how long it holds its pipe, what it raises."""

    name: str
    waits: tuple[Flag, ...]
    sets: tuple[tuple[Flag, float], ...]  # (flag, visibility delay)
    latency: float  # start-up seconds, hidden behind the previous instruction of the pipe when issued back to back
    work: float  # seconds of on-core work (besides shared-server transfers)
    flows: tuple[tuple[FluidServer, float, float], ...]  # GM transfers: (server, bytes per copy, per-core cap)
    barrier: bool = False  # sync_all: wait for every core before raising the sets
    tail: float = -1.0  # on-core ops: the work behind which the next op's latency hides (else measured)
    count: int = 1  # instructions it stands for (a chain of on-core ops is run as one, see _chain)
    dirty: float = 0.0  # a GM write: bytes per copy it leaves in L2 for HBM (its `hit` share stays in L2)


@dataclass(frozen=True, slots=True)
class CLoop:
    count: int
    body: tuple  # of Op | CLoop
    uid: int


class Frame:
    __slots__ = ("loop", "pos", "iter", "serial")

    def __init__(self, loop: CLoop, serial: int):
        self.loop = loop
        self.pos = 0
        self.iter = 0
        self.serial = serial


# runner activities
IDLE, RUNNING, WAITING, TRANSFER, GRANTED, DONE = range(6)


class Runner:
    """One pipe of one core of one group: its in-order instruction stream, a generator that one simpy event of its
    own resumes. Each wait schedules that event again, exactly where simpy would schedule a process's timeout or
    the event it waits for (so events run in the same order), without allocating an event or a process per
    instruction."""

    __slots__ = ("env", "index", "group", "core", "pipe", "weight", "stack", "act", "start", "end", "flag",
                 "lead", "busy", "ops", "sync", "starts", "unbarred", "event", "resume")

    def __init__(self, sim: "Simulation", index: int, group: int, core: str, pipe: str, weight: int, body: CLoop,
                 starts: int, unbarred: bool = False):
        self.env = sim.env
        self.index = index
        self.group = group
        self.core = core  # e.g. "aic" or "aiv1"
        self.pipe = pipe
        self.weight = weight
        self.stack = [Frame(body, sim.next_serial())]
        self.act = IDLE
        self.start = self.end = 0.0  # of the instruction in progress
        self.flag: Flag | None = None
        self.lead = 0.0  # work of the previous instruction, behind which the next one's latency hides
        self.busy = 0.0  # seconds the pipe was occupied (one copy)
        self.ops = 0  # instructions executed (one copy)
        self.sync = 0.0  # cross-core hand-off latency issued (one copy)
        self.starts = starts  # loop iterations its stream starts in all (the most frequent starter paces snapshots)
        self.unbarred = unbarred  # its program has no sync_all: a barrier waits for it to finish
        self.event = simpy.Event(sim.env)  # the one event the runner waits for at a time, scheduled again each time
        self.resume: tuple = ()  # its callbacks: the stream's generator resumed

    def launch(self, sim: "Simulation") -> None:
        """Run the stream up to its first wait."""
        stream = self.process(sim)
        self.resume = (stream.send,)
        stream.send(None)

    def wake(self, delay: float = 0.0) -> None:
        """Resume the stream `delay` from now, its event scheduled as simpy schedules a timeout (delay 0: as an
        event that succeeds now, after the events already due)."""
        event, env = self.event, self.env
        event.callbacks = self.resume
        heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), event))  # Environment.schedule inlined

    def process(self, sim: "Simulation"):
        """The stream, resumed by its event after each wait (flag, work, transfer, barrier); it ends parked."""
        env, stack = self.env, self.stack
        transfer, spans = sim.transfer, sim.spans
        while stack:
            frame = stack[-1]
            body = frame.loop.body
            end = len(body)
            while frame.pos < end:
                node = body[frame.pos]
                if node.__class__ is CLoop:
                    break
                latency = node.latency - self.lead
                if latency < 0.0:
                    latency = 0.0
                for flag in node.waits:
                    if flag.count:
                        flag.count -= 1
                    else:
                        flag.waiters.append(self)
                        self.act, self.flag = WAITING, flag
                        yield
                        self.flag = None
                        latency = node.latency
                self.start = now = env._now
                fixed = latency + node.work
                if fixed:
                    self.act, self.end = RUNNING, now + fixed
                    self.wake(fixed)
                    yield
                if node.flows:
                    self.act = TRANSFER
                    transfer(self, node)
                    yield
                self.act = IDLE
                start, now = self.start, env._now  # (a steady-state jump may have moved the start)
                self.lead = now - start - latency if node.tail < 0.0 else node.tail
                self.busy += now - start
                self.ops += node.count
                if spans is not None:
                    spans.append((self.index, node.name, start, now))
                if node.barrier:
                    self.act = WAITING
                    sim.barrier.arrive(self.weight, self)
                    yield
                    self.act = IDLE
                for flag, delay in node.sets:
                    if delay:
                        self.sync += delay
                        sim.raise_later(flag, delay)
                    else:
                        flag.release()
                frame.pos += 1
            if frame.pos < end:  # a loop: enter it
                inner = Frame(body[frame.pos], sim.next_serial())
                stack.append(inner)
                sim.on_iteration(self, inner)
                continue
            frame.iter += 1
            if frame.iter < frame.loop.count:
                frame.pos = 0
                sim.on_iteration(self, frame)
            else:
                stack.pop()
                if stack:
                    stack[-1].pos += 1
        self.act = DONE
        if sim.barrier is not None:
            (sim.barrier.finished if self.unbarred else sim.barrier.retired)(self.weight)
        if sim.pacer is self:
            sim.elect_pacer()
        yield  # parked: never resumed


@dataclass(frozen=True)
class Snapshot:
    time: float
    key: tuple  # exact structure: positions, activities, flag counts, who is transferring
    numbers: tuple[float, ...]  # relative times and bytes left, compared with TOLERANCE
    counters: tuple[tuple[int, int], ...]  # (serial, iteration) of every frame, aligned with `frames`
    frames: tuple[Frame, ...]
    totals: tuple[float, ...]  # accumulated statistics, extrapolated by the jump
    dirty: "Dirty"


@dataclass(frozen=True, slots=True)
class Dirty:
    """The bytes written to L2 and not yet to HBM at a snapshot (servers.WriteBack)."""

    level: float
    emptied: int  # times they ran out so far
    accepted: float  # bytes taken into L2 so far


@dataclass(frozen=True)
class Outcome:
    """What one simulation measured (per copy where a group is folded)."""

    time: float  # seconds from the first instruction to the last
    runners: tuple[Runner, ...]
    servers: dict[str, FluidServer]
    events: int  # simpy events processed (the jumps skip the events of the periods they cover)
    extrapolated: float  # seconds of the time covered by steady-state jumps
    spans: list | None  # (runner index, op, start, end) when recorded


class Simulation:
    def __init__(self, trace: Trace, chip: Chip, record: bool = False, compress: bool = True):
        self.trace = trace
        self.compress = compress
        self.chip = chip
        self.env = simpy.Environment()
        self.spans: list | None = [] if record else None
        self._serial = itertools.count()
        self._uid = itertools.count()
        eff = chip.efficiency
        self.hbm = WriteBack(self.env, "hbm", chip.hbm.bandwidth * eff.hbm, chip.l2.size)
        self.servers = {"hbm": self.hbm,
                        "l2": FluidServer(self.env, "l2", chip.l2.read_bandwidth * eff.l2),
                        "l2w": FluidServer(self.env, "l2w", chip.l2.write_bandwidth * eff.l2)}
        self.flags: list[Flag] = []
        self.pending: list[list] = []  # cross-core raises in flight: [flag, due time] (a jump moves the time)
        self.runners: list[Runner] = []
        self.free: list[Runner] = []  # timed in closed form, not run
        self.history: dict[tuple[int, int], list[Snapshot]] = {}
        self.events = 0
        self.extrapolated = 0.0
        self.held: list[Runner] = []  # the runners whose stream holds a sync_all
        for g, group in enumerate(layout(trace)):
            self._build_group(g, group)
        unbarred = sum(r.weight for r in self.runners if r.unbarred and r.act != DONE)
        # free streams (address arithmetic) never hold the barrier
        self.barrier = Barrier(sum(r.weight for r in self.held), unbarred) if self.held else None
        self.pacer: Runner | None = None
        if compress:
            self.elect_pacer()

    def next_serial(self) -> int:
        return next(self._serial)

    # ------------------------------------------------------------------------------------------------- building
    def _build_group(self, g: int, group: GroupLayout) -> None:
        flags = {n: Flag(n, len(self.flags) + i, count) for i, (n, count) in enumerate(group.flags)}
        self.flags.extend(flags.values())
        sync = self.chip.overheads.cross_core_sync
        for prog in group.programs:
            ops = [self._compile(ins, prog.kind, tuple(flags[n] for n in ins.wait),
                                 tuple((flags[n], sync if far else 0.0) for n, far in zip(ins.set, remote)))
                   for ins, remote in zip(prog.instrs, prog.remote)]
            for pipe in CORE_PIPES[prog.kind]:
                view = prog.views.get(pipe)
                if not view:
                    continue
                runner = Runner(self, len(self.runners), g, prog.core, pipe, group.copies,
                                CLoop(1, self._body(view, ops), next(self._uid)), prog.starts[pipe],
                                not prog.barrier)
                self.runners.append(runner)
                if pipe in prog.held:
                    self.held.append(runner)
                if _free(runner.stack[0].loop):
                    runner.busy, runner.ops = _closed_form(runner.stack[0].loop)
                    runner.act = DONE
                    self.free.append(runner)

    def _body(self, view: tuple, ops: list[Op]) -> tuple:
        """A pipe's view compiled: its ops (on-core runs chained unless spans are recorded) and loops."""
        out: list = []
        for node in view:
            if node.__class__ is LoopView:
                out.append(CLoop(node.count, self._body(node.body, ops), next(self._uid)))
                continue
            op = ops[node]
            last = out[-1] if out else None
            if last.__class__ is Op and self.spans is None and _chains(last, op):
                out[-1] = _chain(last, op)
            else:
                out.append(op)
        return tuple(out)

    def _compile(self, ins: Instr, core: str, waits: tuple[Flag, ...], sets) -> Op:
        chip = self.chip
        spec = (chip.aic if core == "aic" else chip.aiv).pipes[ins.pipe]
        clock = chip.clock
        work = 0.0
        path = f"{ins.src}>{ins.dst}"  # a dtype-specific route (e.g. 4-bit L1->L0 extract) overrides the path's rate
        route = spec.routes.get(f"{path}:{ins.dtype}", spec.routes.get(path, spec.bytes_per_cycle)) * clock
        if ins.pipe in ("cube", "vector"):
            eff = chip.efficiency.cube if ins.pipe == "cube" else chip.efficiency.vector
            unit = ins.bytes / (spec.bytes_per_cycle * clock)
            if ins.flops:
                table = chip.aic.cube.flop_per_cycle if ins.pipe == "cube" else chip.aiv.vector.flop_per_cycle
                if ins.dtype not in table:
                    raise NpusimError(f"{self.trace.kernel}: {ins.pipe} instruction '{ins.op}' uses dtype "
                                      f"'{ins.dtype or '(none)'}' but {chip.name} has {ins.pipe} rates only for "
                                      f"{', '.join(table)}")
                unit = max(unit, ins.flops / (table[ins.dtype] * clock))
            # a chain of `issues` dependent instructions, each behind a PipeBarrier: every further one waits for the
            # one before to leave the pipeline and is issued anew (`issue_cycles`), whatever its own work
            work = unit / eff + (ins.issues - 1) * (spec.issue_cycles or 0.0) / clock
        elif ins.src == "gm":
            # a discrete gather: the core issues its DMA instructions one by one; the rows stream behind the issue
            work = max(0.0, (ins.issues - 1) * (spec.issue_cycles or 0.0) / clock - ins.bytes / route)
        elif ins.dst != "gm":
            work = ins.bytes / route
        flows, dirty = self._gm_flows(ins, spec, route)
        return Op(ins.op, waits, sets, spec.latency_cycles / clock, work, flows, ins.op == "sync_all",
                  -1.0 if flows else work, dirty=dirty)

    def _gm_flows(self, ins: Instr, spec, route: float) -> tuple[tuple, float]:
        """The flows of a GM transfer and the bytes per copy a write leaves dirty in L2.

        A read crosses L2 whole, and the share it misses (1 - hit) comes from HBM first; one core's DMA moves the
        hits at the pipe's rate and the misses at its HBM rate, one after the other, so each flow is capped to end
        when both would uncontended. A write goes to L2 at the pipe's rate and ends there; the share not marked
        `hit` (a workspace re-read soon stays in L2) is dirty, for the HBM server to drain (servers.WriteBack)."""
        if ins.src == "gm" and ins.bytes > 0:
            hits = ins.bytes * ins.hit
            misses = ins.bytes - hits
            span = hits / route + misses / min(route, spec.routes.get(f"hbm>{ins.dst}", math.inf) * self.chip.clock)
            return tuple((self.servers[name], size, size / span)
                         for name, size in (("hbm", misses), ("l2", ins.bytes)) if size > 0), 0.0
        if ins.dst == "gm" and ins.bytes > 0:
            return ((self.servers["l2w"], ins.bytes, route),), ins.bytes * (1.0 - ins.hit)
        return (), 0.0

    # ------------------------------------------------------------------------------------------------ execution
    def transfer(self, runner: Runner, op: Op) -> None:
        """Start the op's flows; the runner wakes when the last one finishes (a write's, when L2 has taken its dirty
        bytes)."""
        if len(op.flows) == 1:
            server, size, cap = op.flows[0]
            end = runner.wake
            if op.dirty:
                dirty, weight = op.dirty * runner.weight, runner.weight
                end = lambda: self.hbm.accept(dirty, weight, runner.wake)  # noqa: E731
            server.start(Flow(runner.index, size, cap, runner.weight, end))
            return
        left = [len(op.flows)]

        def done():
            left[0] -= 1
            if not left[0]:
                runner.wake()

        for server, size, cap in op.flows:
            server.start(Flow(runner.index, size, cap, runner.weight, done))

    def raise_later(self, flag: Flag, delay: float) -> None:
        token = [flag, self.env.now + delay]
        self.pending.append(token)

        def arrive(_event):
            self.pending.remove(token)  # (or an equal one: the same flag due at the same time)
            flag.release()

        self.env.timeout(delay).callbacks.append(arrive)

    def run(self) -> Outcome:
        env = self.env
        for runner in self.runners:
            if runner.act != DONE:
                runner.launch(self)
        queue, events = env._queue, 0
        while queue:  # simpy's Environment.step inlined (no event here ever fails)
            env._now, _, _, event = heappop(queue)
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            events += 1
        self.events += events
        for runner in self.runners:  # the parked streams, whose frames hold the simulation: it is then freed by
            runner.resume = ()  # reference counting, not left to the collector (a sweep collects after each point)
        stuck = [r for r in self.runners if r.act != DONE]
        if stuck:
            r = stuck[0]
            what = f"waits forever on flag '{r.flag.name}'" if r.flag else "never finishes"
            raise NpusimError(f"{self.trace.kernel}: the trace deadlocks: group {r.group} {r.core} {r.pipe.upper()} "
                              f"{what} (a set/wait pair or an initial count in Group.flags is missing)")
        end = max([env.now, self.hbm.finish()] + [r.busy for r in self.free])  # the kernel ends once HBM has its writes
        return Outcome(end, tuple(self.runners), self.servers, self.events, self.extrapolated, self.spans)

    # ------------------------------------------------------------------------------------------- steady state
    def elect_pacer(self) -> None:
        """The unfinished runner that starts loop iterations most often takes the snapshots (one is enough: the
        snapshot covers the whole chip, and more takers would only multiply the cost)."""
        live = [r for r in self.runners if r.act != DONE]
        self.pacer = max(live, key=lambda r: r.starts) if live else None

    def on_iteration(self, runner: Runner, frame: Frame) -> None:
        if runner is not self.pacer:
            return
        snap = self._snapshot()
        history = self.history.setdefault((runner.index, frame.loop.uid), [])
        for old in reversed(history):
            periods, moved = self._periods(old, snap, self.hbm.capacity)
            if periods > 0:
                self._jump(old, snap, periods, moved)
                return
        history.append(snap)
        if len(history) > HISTORY:
            history.pop(0)

    def _snapshot(self) -> Snapshot:
        now = self.env.now
        key, numbers, counters, frames, totals = [], [], [], [], []
        for r in self.runners:
            key.append((tuple((f.loop.uid, f.pos) for f in r.stack), r.act, r.flag.uid if r.flag else -1))
            numbers.append(r.lead)
            if r.act == RUNNING:
                numbers.append(r.end - now)
            for f in r.stack:
                counters.append((f.serial, f.iter))
                frames.append(f)
            totals.extend((r.busy, r.ops, r.sync))
        for flag in self.flags:
            key.append((flag.count, tuple(w.index for w in flag.waiters)))
        if self.barrier is not None:
            key.append((self.barrier.arrived, self.barrier.pending, len(self.barrier.waiters)))
        for server in self.servers.values():
            structure, left = server.state()
            key.append(structure)
            numbers.extend(left)
            totals.extend((server.moved, server.busy))
        for flag, due in sorted(self.pending, key=lambda t: t[1]):
            key.append(flag.uid)
            numbers.append(due - now)
        dirty = Dirty(*self.hbm.level(now), self.hbm.accepted)
        return Snapshot(now, tuple(key), tuple(numbers), tuple(counters), tuple(frames), tuple(totals), dirty)

    @staticmethod
    def _periods(old: Snapshot, new: Snapshot, capacity: float) -> tuple[int, list[tuple[Frame, int]]]:
        """How many whole periods old -> new can be repeated before any moved loop reaches its last iteration
        (or the dirty bytes in L2, if they moved, might run out or fill it: _drift)."""
        if new.time <= old.time or old.key != new.key:
            return 0, []
        for a, b in zip(old.numbers, new.numbers):
            if not _same(a, b):
                return 0, []
        periods, moved = _drift(old.dirty, new.dirty, capacity), []
        for (s0, i0), (s1, i1), frame in zip(old.counters, new.counters, new.frames):
            if s0 != s1:
                if i0 != i1:  # a loop re-entered and now elsewhere: not the same state
                    return 0, []
            elif i1 > i0:
                periods = min(periods, (frame.loop.count - 1 - i1) // (i1 - i0))
                moved.append((frame, i1 - i0))
            elif i1 < i0:
                return 0, []
        if not moved or periods == math.inf:
            return 0, []
        return int(periods), moved

    def _jump(self, old: Snapshot, new: Snapshot, periods: int, moved: list[tuple[Frame, int]]) -> None:
        """Advance the whole chip by `periods` periods of the steady state, exactly as simulating them would."""
        shift = periods * (new.time - old.time)
        env = self.env
        env._now += shift  # simpy has no public clock jump; a uniform shift keeps its event heap ordered
        env._queue[:] = [(t + shift, prio, eid, ev) for t, prio, eid, ev in env._queue]
        for frame, d in moved:
            frame.iter += periods * d
        if self.spans is not None:  # an instruction in flight resumes `shift` later: the span sits before it
            for r in self.runners:
                if r.act != DONE:
                    begin = r.start if r.act in (RUNNING, TRANSFER) else new.time
                    self.spans.append((r.index, f"steady state x{periods}", begin, begin + shift))
        for r in self.runners:
            r.start += shift
            r.end += shift
        for token in self.pending:
            token[1] += shift
        grown = [b + periods * (b - a) for a, b in zip(old.totals, new.totals)]
        it = iter(grown)
        for r in self.runners:
            r.busy, r.ops, r.sync = next(it), next(it), next(it)
        for server in self.servers.values():
            server.moved, server.busy = next(it), next(it)
            server.shift(shift)
        if not _same(old.dirty.level, new.dirty.level):
            self.hbm.dirty += periods * (new.dirty.level - old.dirty.level)
        self.hbm.accepted += periods * (new.dirty.accepted - old.dirty.accepted)
        self.extrapolated += shift
        # snapshots of the loops that moved are stale; those of enclosing loops stay comparable (the jump is part of
        # their next period), so an outer loop of identical iterations with inner jumps is found periodic too
        jumped = {frame.loop.uid for frame, _ in moved}
        for key in [k for k in self.history if k[1] in jumped]:
            del self.history[key]


def _same(a: float, b: float) -> bool:
    """Two snapshot numbers are the same state (within the matching tolerance)."""
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=1e-15)


def _drift(old: Dirty, new: Dirty, capacity: float) -> float:
    """How many periods the dirty bytes in L2 allow to jump. Any number when their level repeats. When it moved by
    delta, the rest of the chip is still periodic if they never ran out (the drain then takes whatever the flows
    leave, at any level) and no write waited for room, and it stays so only while the level provably keeps clear of
    zero and capacity: a period adds at most its inflow before anything drains, and drains at most inflow - delta
    (bounds, not the path, so a jump may stop a period early: exact, only less compressed)."""
    if _same(old.level, new.level):
        return math.inf
    if new.emptied != old.emptied or old.level <= 0.0 or new.level <= 0.0:
        return 0
    delta = new.level - old.level
    inflow = new.accepted - old.accepted
    drained = inflow - delta
    if new.level - drained <= 0.0 or new.level + inflow > capacity:
        return 0
    room = capacity - inflow - new.level if delta > 0.0 else new.level - drained
    return math.floor(room / abs(delta))


def _chains(a: Op, b: Op) -> bool:
    """Whether b can run as part of a: both on-core (fixed durations), nobody sees a end (no sets) and b starts
    the moment a ends (no waits). The chain then takes exactly the time of the two issued back to back."""
    return a.tail >= 0.0 and b.tail >= 0.0 and not (a.sets or a.barrier or b.waits or b.barrier)


def _chain(a: Op, b: Op) -> Op:
    """a then b as one op: b's start-up hides behind a's last work, and the next op's behind b's."""
    work = a.work + max(0.0, b.latency - a.tail) + b.work
    return Op(a.name, a.waits, b.sets, a.latency, work, (), False, b.tail, a.count + b.count)


def _free(loop: CLoop) -> bool:
    """A stream that no other pipe waits on and that waits on none, moving no GM data."""
    return all(not (op.waits or op.sets or op.flows or op.barrier) for op in _ops(loop))


def _closed_form(loop: CLoop) -> tuple[float, int]:
    """(seconds, instructions) of a free stream issued back to back: each op's work plus the start-up that its
    predecessor's work does not hide (predecessors taken cyclically within each body)."""
    busy, ops = 0.0, 0
    prev = loop.body[-1].tail if isinstance(loop.body[-1], Op) else 0.0
    for node in loop.body:
        if isinstance(node, CLoop):
            b, n = _closed_form(node)
            busy, ops, prev = busy + b, ops + n, 0.0
        else:
            busy, ops, prev = busy + node.work + max(0.0, node.latency - prev), ops + node.count, node.tail
    return busy * loop.count, ops * loop.count


def _ops(loop: CLoop):
    """Every compiled op of a runner's stream once."""
    for node in loop.body:
        if isinstance(node, CLoop):
            yield from _ops(node)
        else:
            yield node
