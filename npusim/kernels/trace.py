"""The tile trace: what one kernel launch does on each core, instruction by instruction, as a compact program.

This is the contract between the tilings (which write traces), the engine (which times them) and the functional
path (which executes them on arrays). A trace is small even for a 128K-token kernel because loops stay loops
(`Loop(count, body)`) and identical AI-core groups are folded (`Group.copies`).

Ordering follows the hardware: instructions of one pipe on one core run in program order; different pipes run
concurrently; `wait`/`set` name counting semaphores (set_flag / wait_flag, and the cross-core flags between an
AIC and its AIVs) that are scoped to one group. A semaphore's initial count is given in `Group.flags`, which is
how double buffering is written: the producer waits on a "slot free" flag whose initial count is the depth.
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Union

from npusim.errors import NpusimError

PIPES = ("mte2", "mte1", "cube", "fixpipe", "vector", "mte3", "scalar")
CORE_PIPES = {"aic": ("mte2", "mte1", "cube", "fixpipe", "scalar"), "aiv": ("mte2", "vector", "mte3", "scalar")}
BUFFERS = ("gm", "l1", "l0a", "l0b", "l0c", "ub", "bt", "fb")
CORE_BUFFERS = {"aic": ("l1", "l0a", "l0b", "l0c", "bt", "fb"), "aiv": ("ub",)}


@dataclass(frozen=True, slots=True)
class Instr:
    """One tile instruction on one pipe.

    bytes: data moved (MTE*/FIXPIPE) or streamed through the unit (VECTOR); flops: arithmetic (CUBE/VECTOR);
    hit: fraction of a GM read served by L2 instead of HBM (the tiler knows the reuse across cores), of a GM write
    kept in L2 and never written back to HBM within the kernel (a workspace read back and overwritten);
    issues: the DMA instructions the core issues one after another for this transfer (a gather of discrete rows
    issues one per row or pair of rows; 1 for a contiguous tile) or, on VECTOR, the instructions of a chain each
    behind a PipeBarrier that this one stands for (1: one instruction, or a stream the pipe overlaps);
    action: the functional meaning (what arrays it reads and writes), opaque to the engine.
    """

    pipe: str
    op: str
    bytes: float = 0.0
    flops: float = 0.0
    dtype: str = ""
    src: str = ""
    dst: str = ""
    slot: int = 0
    wait: tuple[str, ...] = ()
    set: tuple[str, ...] = ()
    hit: float = 0.0
    issues: int = 1
    action: Any = None


@dataclass(frozen=True, slots=True)
class Loop:
    """`count` repetitions of `body`; `var` names the induction variable for the functional path."""

    count: int
    body: tuple["Node", ...]
    var: str = ""


Node = Union[Instr, Loop]


@dataclass(frozen=True)
class Program:
    core: str  # "aic" | "aiv"
    body: tuple[Node, ...]


@dataclass(frozen=True)
class Group:
    """One AI core in split mode: an AIC and up to two AIVs sharing flags; `copies` identical groups run at once."""

    aic: Program | None
    aiv: tuple[Program, ...] = ()
    copies: int = 1
    flags: dict[str, int] = field(default_factory=dict)
    index: int = 0  # block index of the first copy, for the functional path

    @property
    def programs(self) -> tuple[Program, ...]:
        return ((self.aic,) if self.aic else ()) + self.aiv


@dataclass(frozen=True)
class Trace:
    """One kernel launch on one chip."""

    kernel: str
    chip: str
    shape: dict[str, int]
    groups: tuple[Group, ...]
    flops: float  # useful arithmetic of the op (roofline numerator)
    hbm_bytes: float  # compulsory HBM traffic (roofline)
    buffers: dict[str, float]  # peak bytes used per buffer level per core
    tiling: dict[str, Any] = field(default_factory=dict)
    dtype: str = "bf16"  # the cube dtype that bounds the roofline
    l2_bytes: float = 0.0  # compulsory traffic served by L2 instead of HBM (a warm launch's resident footprint)

    def instructions(self) -> Iterator[tuple[Program, Instr, int]]:
        """Every (program, instruction, multiplicity) with loops multiplied out, without expanding them."""
        for g in self.groups:
            for prog in g.programs:
                for ins, mult in walk(prog.body):
                    yield prog, ins, mult * g.copies

    def pipe_totals(self) -> dict[str, dict[str, float]]:
        """Per pipe: instruction count, bytes and FLOPs summed over all cores."""
        return {p: dict(c) for p, c in self._pipe_totals.items()}

    @functools.cached_property
    def _pipe_totals(self) -> dict[str, dict[str, float]]:
        """pipe_totals, summed once per trace (a sweep times one trace on many chips, each time reading them)."""
        out: dict[str, Counter] = {p: Counter() for p in PIPES}
        for _, ins, mult in self.instructions():
            c = out[ins.pipe]
            c["instructions"] += mult
            c["bytes"] += ins.bytes * mult
            c["flops"] += ins.flops * mult
        return {p: dict(c) for p, c in out.items() if c}

    @functools.cached_property
    def vector_flops(self) -> tuple[tuple[float, str], ...]:
        """(FLOPs x multiplicity, dtype) of each vector instruction that computes, in program order, listed once per
        trace (the roofline times each at its dtype's rate on every chip the trace is timed on)."""
        return tuple((ins.flops * mult, ins.dtype) for _, ins, mult in self.instructions()
                     if ins.pipe == "vector" and ins.flops)

    @functools.cached_property
    def structure(self) -> str:
        """A digest of what the engine times: each group's copies, flags and programs, every instruction but its
        functional action. Computed once per trace (the engine keys its memo by it; a sweep reuses tile traces
        across points, so the walk over a long trace is not repeated)."""
        groups = tuple((g.copies, tuple(sorted(g.flags.items())),
                        tuple((p.core, _structure(p.body)) for p in g.programs)) for g in self.groups)
        return hashlib.blake2b(repr(groups).encode(), digest_size=20).hexdigest()

    @property
    def cores(self) -> dict[str, int]:
        n = Counter()
        for g in self.groups:
            for prog in g.programs:
                n[prog.core] += g.copies
        return dict(n)


def _structure(body: tuple[Node, ...]) -> tuple:
    return tuple((n.count, _structure(n.body)) if isinstance(n, Loop) else
                 (n.pipe, n.op, n.bytes, n.flops, n.dtype, n.src, n.dst, n.wait, n.set, n.hit, n.issues) for n in body)


def walk(body: tuple[Node, ...], mult: int = 1) -> Iterator[tuple[Instr, int]]:
    """Instructions with the product of their enclosing loop counts."""
    for node in body:
        if isinstance(node, Loop):
            yield from walk(node.body, mult * node.count)
        else:
            yield node, mult


def unroll(body: tuple[Node, ...], env: dict[str, int] | None = None) -> Iterator[tuple[Instr, dict[str, int]]]:
    """Instructions in execution order with the loop variables bound (the functional path; small shapes only)."""
    env = dict(env or {})
    for node in body:
        if isinstance(node, Loop):
            for i in range(node.count):
                if node.var:
                    env[node.var] = i
                yield from unroll(node.body, env)
        else:
            yield node, env


def check_fits(trace: Trace, capacity: dict[str, float]) -> None:
    """Refuse a tiling whose buffers exceed the chip's, saying by how much."""
    for level, used in trace.buffers.items():
        cap = capacity.get(level)
        if cap is not None and used > cap:
            raise NpusimError(
                f"{trace.kernel} tiling {trace.tiling} needs {used / 1024:g} KiB of {level.upper()} per core but "
                f"{trace.chip} has {cap / 1024:g} KiB ({(used - cap) / 1024:g} KiB too many)",
                field=f"tiling.{level}")
