"""Runs a tile trace on NumPy arrays: every instruction's action, in an order its set/wait flags allow.

Each AI-core group runs its programs (AIC, AIVs) round-robin, an instruction stalling while a flag it waits on is
zero, exactly the semaphore semantics the engine times; a trace whose flags deadlock is refused. Copies of a
folded group run one after another with the env var `core` bound to their core id. Results are rounded to each
action's dtype. On-chip buffers are private to a program, "ws.*" workspaces to a group, other names are GM
("gm.*": a kernel's GM workspace, allocated by its first write and shared by all groups).

An instruction named "sync_all" is the all-core barrier (AscendC SyncAll): a program reaching it waits until every
program of every group has reached it or ended, so a later phase (e.g. split-KV's combine) reads what all cores wrote.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from npusim.errors import NpusimError
from npusim.functional.numerics import rnd
from npusim.functional import vector_ops  # noqa: F401  (registers the vector-tile kernels' actions)
from npusim.functional.ops import OPS
from npusim.kernels.tile import Act, Ref, value
from npusim.kernels.trace import Instr, Trace, unroll


class _Memory:
    def __init__(self, gm: dict[str, np.ndarray], ws: dict[str, np.ndarray]):
        self.gm, self.ws, self.local = gm, ws, {}

    def space(self, name: str) -> dict[str, np.ndarray]:
        if name in self.gm or name.startswith("gm."):
            return self.gm
        return self.ws if name.startswith("ws.") else self.local

    def window(self, ref: Ref, env: dict[str, int], arr: np.ndarray | None):
        start = [value(s, env) for s in ref.start]
        lim = []
        for d, (s, n) in enumerate(zip(start, ref.size)):
            stop = value(ref.stop[d], env) if d < len(ref.stop) and ref.stop[d] is not None else None
            ext = arr.shape[d] if arr is not None else s + n
            end = ext if n < 0 else min(s + n, ext)
            lim.append(min(end, stop) if stop is not None else end)
        return start, lim

    def read(self, ref: Ref, env: dict[str, int], fill: float = 0.0) -> np.ndarray:
        arr = self.space(ref.name).get(ref.name)
        if arr is None:
            raise NpusimError(f"trace reads '{ref.name}' before anything wrote it")
        start, lim = self.window(ref, env, arr)
        lo = [max(s, 0) for s in start]  # a tile that starts before the array (a window at the first rows)
        part = arr[tuple(slice(a, max(a, e)) for a, e in zip(lo, lim))]
        size = tuple(p if n < 0 else n for p, n in zip(part.shape, ref.size))
        if part.shape == size:
            return part.copy()
        out = np.full(size, fill)
        out[tuple(slice(a - s, a - s + p) for a, s, p in zip(lo, start, part.shape))] = part
        return out

    def write(self, ref: Ref, env: dict[str, int], val: np.ndarray) -> None:
        space = self.space(ref.name)
        arr = space.get(ref.name)
        start, lim = self.window(ref, env, arr)
        if space is not self.gm or ref.name.startswith("gm."):  # buffer or workspace: allocated by its first write
            need = [s + (n if n >= 0 else v) for s, n, v in zip(start, ref.size, np.shape(val))]
            if arr is None or any(a < b for a, b in zip(arr.shape, need)):
                grown = np.zeros([max(a, b) for a, b in zip(arr.shape if arr is not None else need, need)])
                if arr is not None:
                    grown[tuple(slice(0, a) for a in arr.shape)] = arr
                arr = space[ref.name] = grown
            start, lim = self.window(ref, env, arr)
        sl = tuple(slice(s, max(s, e)) for s, e in zip(start, lim))
        val = np.broadcast_to(val, tuple(n if n >= 0 else e - s for n, s, e in zip(ref.size, start, lim)))
        arr[sl] = val[tuple(slice(0, max(0, e - s)) for s, e in zip(start, lim))]


def _run(act: Act, mem: _Memory, env: dict[str, int]) -> None:
    if act.op == "let":  # bindings in order: later ones may use earlier ones
        for k, v in act.args:
            env[k] = value(v, env)
        return
    args = {k: value(v, env) for k, v in act.args}
    ins = [mem.read(r, env, args.get("fill", 0.0) if i == 0 else 0.0) for i, r in enumerate(act.ins)]
    if act.op not in OPS:
        raise NpusimError(f"trace action '{act.op}' has no functional meaning; known: {', '.join(sorted(OPS))}")
    out = OPS[act.op](*ins, shape=act.out.size if act.out else (), **args)
    if act.out is not None:
        mem.write(act.out, env, rnd(out, act.dtype))


def execute(trace: Trace, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute every group of the trace on `tensors` (GM: inputs and preallocated outputs, modified in place)."""
    gm = {k: np.array(v, dtype=np.float64) for k, v in tensors.items()}
    cores = []
    for g in trace.groups:
        for copy in range(g.copies):
            ws: dict[str, np.ndarray] = {}
            progs = [(unroll(p.body, {"core": g.index + copy, "aiv": i - (g.aic is not None)}), _Memory(gm, ws))
                     for i, p in enumerate(g.programs)]
            cores.append(_Core(progs, dict(g.flags)))
    while True:  # one phase per sync_all: every core runs up to its barrier, then all pass it together
        for core in cores:
            core.run()
        if not any(core.at_barrier() for core in cores):
            return gm
        for core in cores:
            core.pass_barrier()


class _Core:
    """The programs of one AI core (AIC and AIVs) run round-robin under their group's flags."""

    def __init__(self, progs: list[tuple[Iterator, _Memory]], flags: dict[str, int]):
        self.progs, self.flags = progs, flags
        self.pending: list[tuple[Instr, dict] | None] = [next(it, None) for it, _ in progs]

    def at_barrier(self) -> bool:
        return any(p is not None and p[0].op == "sync_all" for p in self.pending)

    def pass_barrier(self) -> None:
        for i, p in enumerate(self.pending):
            if p is not None and p[0].op == "sync_all":
                for f in p[0].set:
                    self.flags[f] = self.flags.get(f, 0) + 1
                self.pending[i] = next(self.progs[i][0], None)

    def run(self) -> None:
        pending, flags = self.pending, self.flags
        while True:
            progressed = False
            for i, (it, mem) in enumerate(self.progs):
                while pending[i] is not None and pending[i][0].op != "sync_all":
                    ins, env = pending[i]
                    if any(flags.get(f, 0) <= 0 for f in ins.wait):
                        break
                    for f in ins.wait:
                        flags[f] -= 1
                    if ins.action is not None:
                        _run(ins.action, mem, env)
                    for f in ins.set:
                        flags[f] = flags.get(f, 0) + 1
                    progressed = True
                    pending[i] = next(it, None)
            stalled = [p for p in pending if p is not None and p[0].op != "sync_all"]
            if not stalled:
                return
            if not progressed:
                waits = [f"{p[0].pipe}:{p[0].op} waits {p[0].wait}" for p in stalled]
                raise NpusimError(f"trace deadlocks: every program stalls on a flag ({'; '.join(waits)})")
