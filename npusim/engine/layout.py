"""A tile trace as the engine lays it out before it knows the chip, worked out once per trace structure.

The engine runs each (group, core, pipe) as a runner over that pipe's instructions compiled against the chip
(npusim.engine.sim). Much of that does not depend on the chip: the flags a group uses and their initial counts, which
of a flag's raises another core awaits (those pay the cross-core delay), each program's distinct instructions (by
the fields the compiler reads: a tiling writes a few dozen distinct instructions as many objects), each pipe's view
of the program as indices into them (loops kept, a pipe's empty loops dropped), which views hold the all-core
barrier and how many loop iterations each starts. `layout` works that out once per trace structure
(`Trace.structure`: every instruction but its functional action), so a sweep that times one trace on many chips (an
HBM-bandwidth axis) walks the trace once; each simulation then compiles the distinct instructions and maps the views.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.errors import NpusimError
from npusim.kernels.trace import CORE_PIPES, Group, Instr, Loop, Node, Trace
from npusim.memo import Lru

MEMO_SIZE = 1024


def compiled_fields(ins: Instr) -> tuple:
    """What the engine's compiler reads of an instruction (instructions equal in these compile alike)."""
    return (ins.pipe, ins.op, ins.bytes, ins.flops, ins.dtype, ins.src, ins.dst, ins.wait, ins.set, ins.hit,
            ins.issues)


@dataclass(frozen=True)
class LoopView:
    """A loop of one pipe's view: `count` times `body` (instruction indices and loops)."""

    count: int
    body: tuple


@dataclass(frozen=True)
class ProgramLayout:
    core: str  # "aic", "aiv0", "aiv1": the core in its group
    kind: str  # "aic" | "aiv"
    instrs: tuple[Instr, ...]  # one instruction per distinct compiled_fields, in order of first appearance
    remote: tuple[tuple[bool, ...], ...]  # per instruction, per flag it sets: another core of the group awaits it
    views: dict[str, tuple]  # pipe -> its instructions (indices into instrs) and loops, in program order
    barrier: bool  # the program holds a sync_all (a runner of a program without one is waited for by barriers)
    held: frozenset[str]  # the pipes whose view holds the sync_all
    starts: dict[str, int]  # pipe -> loop iterations its view starts in all (the top level counting as one)


@dataclass(frozen=True)
class GroupLayout:
    copies: int
    flags: tuple[tuple[str, int], ...]  # every flag of the group, by name, with its initial count
    programs: tuple[ProgramLayout, ...]


_memo: Lru[tuple[GroupLayout, ...]] = Lru(MEMO_SIZE)


def layout(trace: Trace) -> tuple[GroupLayout, ...]:
    """The trace's groups laid out (memoised by Trace.structure, the last MEMO_SIZE used kept)."""
    return _memo.get(trace.structure, lambda: tuple(_group(trace.kernel, group) for group in trace.groups))


def clear() -> None:
    _memo.clear()


def _group(kernel: str, group: Group) -> GroupLayout:
    programs = group.programs
    cores = [p.core if p.core == "aic" else f"aiv{i - (1 if group.aic else 0)}" for i, p in enumerate(programs)]
    waiters: dict[str, set[str]] = {n: set() for n in group.flags}  # flag -> the cores that wait on it
    for core, prog in zip(cores, programs):
        for ins in _instrs(prog.body):
            for n in ins.set:
                waiters.setdefault(n, set())
            for n in ins.wait:
                waiters.setdefault(n, set()).add(core)
    flags = tuple((n, group.flags.get(n, 0)) for n in sorted(waiters))
    return GroupLayout(group.copies, flags, tuple(_program(kernel, core, prog.core, prog.body, waiters)
                                                  for core, prog in zip(cores, programs)))


def _program(kernel: str, core: str, kind: str, body: tuple[Node, ...], waiters: dict[str, set[str]]) -> ProgramLayout:
    if kind not in CORE_PIPES:
        raise NpusimError(f"{kernel}: program on unknown core kind '{kind}' (aic or aiv)")
    index: dict[tuple, int] = {}
    instrs: list[Instr] = []
    views = _views(body, index, instrs)
    unknown = sorted(set(views) - set(CORE_PIPES[kind]))
    if unknown:
        raise NpusimError(f"{kernel}: an {kind.upper()} has no pipe '{unknown[0]}' "
                          f"(its pipes: {', '.join(CORE_PIPES[kind])})")
    barriers = {i for i, ins in enumerate(instrs) if ins.op == "sync_all"}
    held = frozenset(pipe for pipe, view in views.items() if _holds(view, barriers))
    remote = tuple(tuple(bool(waiters[n] - {core}) for n in ins.set) for ins in instrs)
    return ProgramLayout(core, kind, tuple(instrs), remote, views, bool(barriers), held,
                         {pipe: 1 + _starts(view) for pipe, view in views.items()})


def _views(nodes: tuple[Node, ...], index: dict[tuple, int], instrs: list[Instr]) -> dict[str, tuple]:
    """Each pipe's instructions (as indices into `instrs`, which grows with each new one) and loops, in one walk."""
    out: dict[str, list] = {}
    for node in nodes:
        if node.__class__ is Loop:
            if node.count > 0:
                for pipe, body in _views(node.body, index, instrs).items():
                    out.setdefault(pipe, []).append(LoopView(node.count, body))
            continue
        key = compiled_fields(node)
        i = index.get(key)
        if i is None:
            i = index[key] = len(instrs)
            instrs.append(node)
        out.setdefault(node.pipe, []).append(i)
    return {pipe: tuple(view) for pipe, view in out.items()}


def _holds(view: tuple, instrs: set[int]) -> bool:
    return any(_holds(n.body, instrs) if n.__class__ is LoopView else n in instrs for n in view)


def _starts(view: tuple) -> int:
    """Loop iterations a view starts (a loop's each, and those of the loops inside each time)."""
    return sum(n.count * (1 + _starts(n.body)) for n in view if n.__class__ is LoopView)


def _instrs(body: tuple[Node, ...]):
    """Every instruction of a body once (loops not multiplied)."""
    for node in body:
        if isinstance(node, Loop):
            yield from _instrs(node.body)
        else:
            yield node
