"""The tile-program layer: queues become the flags the engine and the executor run, and misuse is refused at
trace-build time naming the kernel, the queue and the stage."""

import inspect
import re

import numpy as np
import pytest

from npusim.engine import simulate
from npusim.errors import NpusimError
from npusim.functional.executor import execute
from npusim.kernels import attention, gemm, indexer, projection, rowwise, vector
from npusim.kernels.base import Band
from npusim.kernels.program import AIC, AIV, TileProgram, stage
from npusim.kernels.tile import Act, Ref, lin
from npusim.kernels.trace import Trace
from npusim.spec.chip import load_chip

CHIP = load_chip("910b2")
ROWS, COLS = 8, 64


class Copy:
    """A vector kernel on the layer: CopyIn (GM -> UB), Compute (x + 1), CopyOut (UB -> GM), one row block each."""

    def __init__(self, prog: TileProgram, depth: int = 2):
        self.inq = prog.queue("in", (AIV, "mte2"), (AIV, "vector"), depth=depth, slot={"ub": 4.0 * COLS})
        self.outq = prog.queue("out", (AIV, "vector"), (AIV, "mte3"), depth=depth, slot={"ub": 4.0 * COLS})

    @stage
    def copy_in(self, v):
        v.alloc(self.inq)
        v.op("mte2", "load", Act("load", Ref("ub.x", (0, 0), (1, COLS)), (Ref("x", (lin(("blk", 1)), 0), (1, COLS)),)),
             bytes=4.0 * COLS, dtype="fp32", src="gm", dst="ub")
        v.enque(self.inq)

    @stage
    def compute(self, v):
        v.deque(self.inq)
        v.alloc(self.outq)
        v.op("vector", "add", Act("add", Ref("ub.y", (0, 0), (1, COLS)), (Ref("ub.x", (0, 0), (1, COLS)),
                                                                          Ref("one", (0, 0), (1, COLS)))),
             flops=COLS, bytes=4.0 * COLS, dtype="fp32", src="ub", dst="ub")
        v.free(self.inq)
        v.enque(self.outq)

    @stage
    def copy_out(self, v):
        v.deque(self.outq)
        v.op("mte3", "store", Act("store", Ref("y", (lin(("blk", 1)), 0), (1, COLS)), (Ref("ub.y", (0, 0), (1, COLS)),)),
             bytes=4.0 * COLS, dtype="fp32", src="ub", dst="gm")
        v.free(self.outq)


def copy_trace(prog: TileProgram, body) -> Trace:
    groups = prog.groups([Band(ROWS, None, (body,))], CHIP.aiv.count)
    return Trace("copy", CHIP.name, {"rows": ROWS}, groups, 0.0, 8.0 * ROWS * COLS, prog.buffers())


def test_a_pipeline_written_with_queues_runs_on_both_executors():
    prog = TileProgram("copy", CHIP)
    k, v = Copy(prog), prog.code(AIV)
    k.copy_in(v), k.compute(v), k.copy_out(v)
    trace = copy_trace(prog, v.body())
    _, load, add, store = trace.groups[0].aiv[0].body[0].body  # after the block address
    assert (load.wait, load.set) == (("in.free0",), ("in.full0",))
    assert (add.wait, add.set) == (("in.full0", "out.free0"), ("in.free0", "out.full0"))
    assert trace.groups[0].flags["in.free0"] == 2 and trace.buffers == {"ub": 4 * 4.0 * COLS}
    x = np.arange(ROWS * COLS, dtype=float).reshape(ROWS, COLS)
    out = execute(trace, {"x": x, "one": np.ones((1, COLS)), "y": np.zeros((ROWS, COLS))})
    assert np.array_equal(out["y"], x + 1)
    assert simulate(trace, CHIP).time > 0


def test_buffering_is_the_depth_of_the_double_buffered_queues():
    prog = TileProgram("copy", CHIP, buffering=3)
    single = prog.queue("one", (AIC, "mte2"), (AIC, "mte1"), depth=1)
    fixed = prog.queue("ws", (AIC, "fixpipe"), (AIV, "mte2"), depth=2, fixed=True)
    assert Copy(prog).inq.depth == 3 and single.depth == 1 and fixed.depth == 2
    assert prog.tiling() == {"buffering": 3}


def test_cross_core_queues_wait_on_both_vector_cores_or_one_lane():
    prog = TileProgram("cv", CHIP)
    s = prog.queue("s", (AIC, "fixpipe"), (AIV, "mte2"), depth=2)
    c = prog.code(AIC)
    c.alloc(s)
    c.op("fixpipe", "store")
    c.enque(s)
    c.alloc(s, lane=1)
    c.op("fixpipe", "store")
    c.enque(s, lane=1)
    first, second = c.nodes()
    assert first.wait == ("s.free0", "s.free1") and first.set == ("s.full0", "s.full1")
    assert second.wait == ("s.free1",) and second.set == ("s.full1",)
    v = prog.code(AIV, 1)
    v.deque(s)
    v.op("mte2", "load")
    v.free(s)
    assert v.nodes()[0].wait == ("s.full1",) and v.nodes()[0].set == ("s.free1",)


def test_a_buffer_may_skip_a_stage_of_its_queue():
    """One UB buffer through load -> compute -> store; a first tile that needs no compute goes to the store."""
    prog = TileProgram("ring", CHIP)
    ab = prog.queue("ab", (AIV, "mte2"), (AIV, "vector"), (AIV, "mte3"), depth=2)
    v = prog.code(AIV)
    v.alloc(ab)
    v.op("mte2", "load")
    v.enque(ab, to="mte3")
    v.deque(ab, at="mte3")
    v.op("mte3", "store")
    v.free(ab)
    load, store = v.body()
    assert load.set == ("ab.mte30",) and store.wait == ("ab.mte30",) and store.set == ("ab.free0",)


def test_a_fragment_is_written_once_and_spliced_with_its_flags_counted():
    """Code.fragment builds a stage's fragment once per arguments; spliced into a loop it counts towards the loop's
    balance like instructions written there (a copy-in without its compute is refused, with both it passes)."""
    calls = []

    class Counted(Copy):
        @stage
        def copy_in(self, v):
            calls.append(1)
            super().copy_in.__wrapped__(self, v)

    prog = TileProgram("copy", CHIP)
    k, v = Counted(prog), prog.code(AIV)
    with v.loop(3, "t"):
        v.fragment(k.copy_in)
        v.fragment(k.compute)
        v.fragment(k.copy_out)
    v.fragment(k.copy_in)
    v.fragment(k.compute)
    v.fragment(k.copy_out)
    body = v.body()
    assert len(calls) == 1 and body[0].body[0] is body[1]
    w = prog.code(AIV)
    with pytest.raises(NpusimError, match=r"queue 'in' .* unbalanced in one pass of loop 't': 'in.free0' raised 0 "
                                          "times but awaited 1 times"):
        with w.loop(2, "t"):
            w.fragment(k.copy_in)


def test_dequeuing_from_a_queue_nobody_fills_is_refused():
    prog = TileProgram("copy", CHIP)
    k, v = Copy(prog), prog.code(AIV)
    k.copy_out(v)  # 'out' drained, never filled (a fragment: not yet checked for balance)
    with pytest.raises(NpusimError, match=r"copy in stage 'copy_out': queue 'out' .* nothing fills it"):
        prog.groups([Band(1, None, (v.nodes(),))], 1)


def test_an_unbalanced_loop_is_refused_naming_queue_and_stage():
    prog = TileProgram("copy", CHIP)
    k, v = Copy(prog), prog.code(AIV)
    with pytest.raises(NpusimError, match=r"copy in stage 'copy_in': queue 'in' .* unbalanced in one pass of loop "
                                          r"'t': 'in.free0' raised 0 times but awaited 1 times"):
        with v.loop(4, "t"):
            k.copy_in(v)


def test_a_deque_on_another_pipe_than_the_consumer_is_refused():
    prog = TileProgram("copy", CHIP)
    k, v = Copy(prog), prog.code(AIV)
    k.copy_in(v)
    v.deque(k.inq)
    with pytest.raises(NpusimError, match=r"queue 'in' .* dequeued by aiv.mte3 \(store\); its consumer stage is "
                                          "vector"):
        v.op("mte3", "store")


def test_a_depth_that_does_not_fit_the_buffer_is_refused():
    prog = TileProgram("copy", CHIP, buffering=3)
    prog.queue("big", (AIV, "mte2"), (AIV, "vector"), depth=2, slot={"ub": CHIP.aiv.buffers.ub / 2})
    with pytest.raises(NpusimError, match=r"copy: the buffers of UB \('big' 3 x .* KiB too many\)"):
        prog.groups([], 1)


def test_flags_are_never_named_by_hand():
    prog = TileProgram("copy", CHIP)
    v = prog.code(AIV)
    with pytest.raises(NpusimError, match="names flags"):
        v.op("mte2", "load", wait=("in.free",))


@pytest.mark.parametrize("module", [gemm, indexer, projection, attention, vector, rowwise])
def test_kernels_on_the_layer_write_no_flags(module):
    source = inspect.getsource(module)
    assert not re.search(r"\b(wait|set)=", source)


def test_plan_buffering_is_the_queue_depth_of_kernels_on_the_layer():
    """A plan's buffering reaches a kernel on the layer as its double-buffered queues' depth (L1, L0 and the two
    L0C accumulators here; the row-wise kernel's UB in and out), buffer use following."""
    from npusim.kernels.catalog import kernel
    from npusim.parallel.optime import kernel_trace

    chip = load_chip("910c-die")
    k = kernel("gemm", {"m": 2048, "n": 1536, "k": 7168, "l0c_depth": 2})
    single, double = kernel_trace(k, chip, 1), kernel_trace(k, chip, 0)
    assert {f: single.groups[0].flags[f] for f in ("l1.free", "l0.free", "l0c.free")} == {
        "l1.free": 1, "l0.free": 1, "l0c.free": 1}
    assert double.groups[0].flags["l1.free"] == 2 and single.tiling["buffering"] == 1
    assert single.buffers == {level: used / 2 for level, used in double.buffers.items()}
    assert simulate(single, chip).time > simulate(double, chip).time
    rows, rows2 = (kernel_trace(kernel("rowwise", {"rows": 8192, "dim": 1536}), chip, b) for b in (1, 2))
    assert rows.groups[0].flags["ub.free0"] == rows.groups[0].flags["out.free0"] == 1
    assert rows.buffers["ub"] == rows2.buffers["ub"] / 2
