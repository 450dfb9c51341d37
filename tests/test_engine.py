"""Engine: steady-state compression vs full simulation, folding vs unfolded cores, shared servers, properties, CLI."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from engine_traces import gemm_like
from npusim.engine import chrome_events, clear_memo, roofline, simulate, simulate_timeline
from npusim.engine.sim import Simulation
from npusim.errors import NpusimError
from npusim.kernels import catalog
from npusim.kernels.trace import Group, Instr, Loop, Program, Trace
from npusim.spec.chip import load_chip

CHIP = load_chip("910b2")


def test_compression_matches_full_simulation():
    for shape, kw in [((1024, 1024, 1024), {}), ((1000, 1500, 3000), {"depth": 3}),
                      ((2048, 2048, 2048), {"hit": 0.9, "bk": 128}), ((512, 4096, 8192), {"bm": 64})]:
        trace = gemm_like(*shape, **kw)
        fast = Simulation(trace, CHIP).run()
        full = Simulation(trace, CHIP, compress=False).run()
        assert fast.extrapolated > 0.1 * fast.time  # the jumps did part of the work
        assert fast.events < full.events
        assert fast.time == pytest.approx(full.time, rel=0.01)
        for a, b in zip(fast.runners, full.runners):
            assert a.busy == pytest.approx(b.busy, rel=0.01) and a.ops == b.ops


@pytest.mark.parametrize("shape,opts,chip", [({"tokens": 2048, "keys": 4096}, {"block_n": 256}, "910b2"),  # pairs
                                             ({"tokens": 1, "keys": 131072, "batch": 2, "causal": 0},
                                              {"dtype": "fp8"}, "950pr")])  # ranges + merge (the 950's Mat-Duce)
def test_compression_matches_full_simulation_of_the_indexer(shape, opts, chip):
    """Outer loops of identical units whose inner loops were jumped are found periodic too; exact all the same."""
    chip = load_chip(chip)
    trace = catalog.kernel("lightning_indexer", shape, **opts).trace(chip)
    fast, full = Simulation(trace, chip).run(), Simulation(trace, chip, compress=False).run()
    assert fast.extrapolated > 0.3 * fast.time and fast.events < full.events
    assert fast.time == pytest.approx(full.time, rel=1e-9)
    for a, b in zip(fast.runners, full.runners):
        assert a.busy == pytest.approx(b.busy, rel=1e-6) and a.ops == b.ops


def test_compression_finds_a_long_joint_period():
    """Two cores streaming at 5:6 rates meet the same joint state only every 6 iterations of the faster one (the
    joint state of core groups running out of phase recurs only every few blocks); the steady state is still found,
    and exact."""
    def loads(n: int, kib: int) -> Program:
        return Program("aic", (Loop(n, (Instr("mte2", "load", bytes=kib * 1024.0, src="gm", dst="l1"),)),))
    trace = Trace("phases", "910b2", {}, (Group(loads(600, 320)), Group(loads(500, 384))), 0.0, 0.0, {})
    fast, full = Simulation(trace, CHIP).run(), Simulation(trace, CHIP, compress=False).run()
    assert fast.events < full.events / 10 and fast.extrapolated > 0.9 * fast.time
    assert fast.time == pytest.approx(full.time, rel=1e-9)
    for a, b in zip(fast.runners, full.runners):
        assert a.busy == pytest.approx(b.busy, rel=1e-6) and a.ops == b.ops


def test_chained_on_core_ops_time_as_issued_one_by_one():
    """Runs of on-core ops with no flag between them execute as one op (fewer events); recorded runs keep every
    instruction, so the two must agree on time, busy time and instruction counts."""
    trace = catalog.kernel("sparse_flash_attention", {"tokens": 64, "keys": 8192}).trace(CHIP)
    chained, single = Simulation(trace, CHIP).run(), Simulation(trace, CHIP, record=True).run()
    assert chained.events < single.events
    assert chained.time == pytest.approx(single.time, rel=1e-12)
    for a, b in zip(chained.runners, single.runners):
        assert a.ops == b.ops and a.busy == pytest.approx(b.busy, rel=1e-9)


def test_sync_all_waits_for_every_core():
    """A core reaching SyncAll early waits for the slow core's arrival and for programs without a barrier to end."""
    work = lambda n: Instr("vector", "work", bytes=n * 256.0, dtype="fp32", src="ub", dst="ub")  # noqa: E731
    after = Instr("vector", "after", bytes=256.0, dtype="fp32", src="ub", dst="ub", wait=("go",))
    sync = Instr("mte3", "sync_all", set=("go",))
    fast = Program("aiv", (work(10), Instr("vector", "done", set=("ready",)), Instr("mte3", "wait", wait=("ready",)),
                           sync, after))
    slow = Program("aiv", (work(10000), Instr("vector", "done", set=("ready",)),
                           Instr("mte3", "wait", wait=("ready",)), sync, after))
    lone = Program("aic", (Instr("cube", "mmad", flops=2.0 * 128 ** 3 * 400, dtype="fp16", set=("x",)),))
    trace = Trace("barrier", "910b2", {}, (Group(None, (fast,)), Group(None, (slow,)), Group(lone)), 0.0, 0.0, {})
    out = Simulation(trace, CHIP, record=True).run()
    starts = {(out.runners[i].group, op): t0 for i, op, t0, _ in out.spans}
    ends = {(out.runners[i].group, op): t1 for i, op, _, t1 in out.spans}
    assert starts[(0, "after")] >= ends[(1, "work")] and starts[(0, "after")] >= ends[(2, "mmad")]
    no_barrier = Trace("barrier", "910b2", {}, trace.groups[:1], 0.0, 0.0, {})
    assert Simulation(no_barrier, CHIP).run().time < out.time / 10


def test_free_scalar_stream_is_timed_in_closed_form():
    """Address arithmetic that nothing waits on is not simulated instruction by instruction but still counted."""
    scalar = CHIP.aic.pipes["scalar"].latency_cycles / CHIP.clock
    prog = Program("aic", (Loop(1000, (Instr("scalar", "addr"),
                                       Instr("cube", "mmad", flops=2.0 * 16 ** 3, dtype="fp16")),),))
    out = Simulation(Trace("free", "910b2", {}, (Group(prog),), 0.0, 0.0, {}), CHIP).run()
    s = next(r for r in out.runners if r.pipe == "scalar")
    assert s.ops == 1000 and s.busy == pytest.approx(1000 * scalar) and out.time >= s.busy


def test_folded_group_equals_its_cores_simulated_one_by_one():
    folded = Simulation(gemm_like(2048, 2048, 1024), CHIP).run()
    cores = Simulation(gemm_like(2048, 2048, 1024, copies_folded=False), CHIP).run()
    assert folded.time == pytest.approx(cores.time, rel=1e-9)
    assert folded.servers["hbm"].moved == pytest.approx(cores.servers["hbm"].moved, rel=1e-9)


def stream(cores: int, nbytes: float) -> Trace:
    """Every core streams `nbytes` from HBM in 64 KiB loads: pure bandwidth."""
    n = int(nbytes // 65536)
    prog = Program("aic", (Loop(n, (Instr("mte2", "load", bytes=65536, src="gm", dst="l1"),)),))
    return Trace("stream", "910b2", {"cores": cores}, (Group(prog, copies=cores),), 0.0, cores * n * 65536.0,
                 {"l1": 65536})


def test_hbm_is_shared_not_multiplied():
    one = simulate(stream(1, 64e6), CHIP, launch="none")
    many = simulate(stream(24, 64e6), CHIP, launch="none")
    mte2 = CHIP.aic.pipes["mte2"]
    loads = int(64e6 // 65536)  # back to back: only the first load's latency shows
    expected = (mte2.latency_cycles + loads * 65536 / mte2.routes["hbm>l1"]) / CHIP.clock
    assert one.time == pytest.approx(expected, rel=1e-6)  # one core: its own DMA stream from HBM limits
    hbm = CHIP.hbm.bandwidth * CHIP.efficiency.hbm
    assert many.time == pytest.approx(24 * 64e6 / hbm, rel=0.02)  # 24 cores: HBM saturates
    assert many.bound == "hbm" and many.servers["hbm"] == pytest.approx(1.0, rel=0.02)


def copy(tiles: int, kib: int, l2: str = "") -> tuple[Trace, object]:
    """Every vector core copies `tiles` tiles of `kib` KiB GM -> UB -> GM, double buffered, every byte missing L2
    (reads from HBM, writes left dirty); with `l2` the chip's L2 size, which bounds the dirty bytes."""
    b = kib * 1024.0
    body = (Instr("mte2", "load", bytes=b, src="gm", dst="ub", wait=("free",), set=("full",)),
            Instr("mte3", "store", bytes=b, src="ub", dst="gm", wait=("full",), set=("free",)))
    cores = CHIP.aiv.count
    group = Group(None, (Program("aiv", (Loop(tiles, body),)),), copies=cores, flags={"free": 2})
    trace = Trace("copy", "910b2", {}, (group,), 0.0, 2.0 * cores * tiles * b, {"ub": 2 * b})
    return trace, load_chip("910b2", {"l2.size": l2}) if l2 else CHIP


def test_hbm_serves_reads_first_and_a_write_ends_in_l2():
    """A copy on every vector core: the stores end once L2 has them, so the loads stream back to back and get HBM
    first; the dirty bytes drain with what the loads leave and after them, and the kernel ends when HBM has every
    byte (never before its roofline). (48 cores x 100 x 32 KiB = 150 MiB: the dirty bytes fit the 192 MiB L2.)"""
    trace, chip = copy(100, 32)
    out = Simulation(trace, chip, record=True, compress=False).run()
    hbm = chip.hbm.bandwidth * chip.efficiency.hbm
    loads = max(end for i, op, _, end in out.spans if op == "load")
    stores = next(r for r in out.runners if r.pipe == "mte3")
    assert loads == pytest.approx(trace.hbm_bytes / 2 / hbm, rel=0.02)
    assert out.time == pytest.approx(trace.hbm_bytes / hbm, rel=0.01) and out.time >= roofline(trace, chip)[0]
    assert stores.busy < 0.6 * out.time
    assert out.servers["hbm"].moved == pytest.approx(trace.hbm_bytes)


def test_a_write_waits_for_hbm_once_l2_holds_its_size_in_dirty_bytes():
    """The same copy with a 4 MiB L2: once that much is dirty, each store waits for HBM to write back as much (its
    share of HBM beside the loads), so the stores take about as long as the kernel; the kernel's time is the same as
    with an L2 no write waits for (1 GiB): HBM moves the same bytes either way."""
    trace, chip = copy(200, 32, "4 MiB")
    out = Simulation(trace, chip).run()
    stores = next(r for r in out.runners if r.pipe == "mte3")
    assert stores.busy > 0.9 * out.time
    assert out.time == pytest.approx(Simulation(*copy(200, 32, "1 GiB")).run().time, rel=1e-3)


@pytest.mark.parametrize("l2", ["", "4 MiB", "1 B"])
def test_compression_is_exact_while_dirty_bytes_accumulate_or_wait(l2):
    """The dirty bytes grow every period (the loads keep HBM busy: no period repeats their level), or writes wait
    for the drain at capacity, or every write waits (a 1-byte L2): the steady state is found all the same, exact."""
    trace, chip = copy(400, 32, l2)
    fast, full = Simulation(trace, chip).run(), Simulation(trace, chip, compress=False).run()
    assert fast.extrapolated > 0.5 * fast.time and fast.events < full.events / 10
    assert fast.time == pytest.approx(full.time, rel=1e-9)
    assert fast.servers["hbm"].moved == pytest.approx(full.servers["hbm"].moved, rel=1e-9)
    for a, b in zip(fast.runners, full.runners):
        assert a.busy == pytest.approx(b.busy, rel=1e-6) and a.ops == b.ops


def test_a_discrete_gather_is_bound_by_its_instruction_issue():
    """A gather of n rows issued one DMA instruction per row takes the n - 1 issues after the first (the first is in
    the start-up latency) when they outlast its transfer; a contiguous load of the same bytes (issues=1) and a chip
    without an issue cost keep the transfer time; a slower issue is never faster."""
    def gather(issues: int, cycles: float) -> float:
        chip = load_chip("910b2", {"aiv.pipes.mte2.issue_cycles": cycles})
        aiv = Program("aiv", (Loop(100, (Instr("mte2", "gather", bytes=32 * 1152.0, dtype="bf16", src="gm", dst="ub",
                                                hit=1.0, issues=issues),)),))
        return simulate(Trace("g", "910b2", {}, (Group(None, (aiv,)),), 0.0, 0.0, {}), chip, launch="none").time
    mte2 = CHIP.aiv.pipes["mte2"]
    transfer = 32 * 1152 / (mte2.bytes_per_cycle * CHIP.clock)
    assert gather(1, 84) == pytest.approx(gather(32, 0)) == pytest.approx(gather(1, 0))
    assert gather(1, 0) == pytest.approx(100 * transfer + mte2.latency_cycles / CHIP.clock, rel=1e-6)
    assert gather(32, 84) == pytest.approx(100 * 31 * 84 / CHIP.clock + mte2.latency_cycles / CHIP.clock, rel=1e-6)
    assert gather(32, 84) < gather(32, 120)


def test_a_barrier_chain_pays_each_further_vector_instruction():
    """A vector op standing for a chain of n PipeBarrier'd instructions adds (n - 1) x issue_cycles to its work,
    streaming or not; one instruction (issues=1) and a chip without the cost keep the unit's time; a slower issue is
    never faster."""
    def chain(issues: int, cycles: float) -> float:
        chip = load_chip("910b2", {"aiv.pipes.vector.issue_cycles": cycles})
        aiv = Program("aiv", (Loop(50, (Instr("vector", "reduce", bytes=4096.0, flops=2048.0, dtype="fp32", src="ub",
                                              dst="ub", issues=issues),)),))
        return simulate(Trace("c", "910b2", {}, (Group(None, (aiv,)),), 0.0, 0.0, {}), chip, launch="none").time
    assert chain(1, 59) == pytest.approx(chain(12, 0)) == pytest.approx(chain(1, 0))
    assert chain(12, 59) - chain(1, 59) == pytest.approx(50 * 11 * 59 / CHIP.clock, rel=1e-6)
    assert chain(12, 59) < chain(12, 80)


def test_cross_core_hand_off_costs_sync():
    def handoff(sync: str) -> float:
        chip = load_chip("910b2", {"overheads.cross_core_sync": sync})
        aic = Program("aic", (Loop(50, (Instr("cube", "mmad", flops=2 * 128 ** 3, dtype="fp16", set=("ready",)),
                                        Instr("cube", "take", wait=("done",)))),))
        aiv = Program("aiv", (Loop(50, (Instr("vector", "softmax", bytes=65536, wait=("ready",), set=("done",)),)),))
        trace = Trace("pingpong", "910b2", {}, (Group(aic, (aiv,), copies=24),), 0.0, 0.0, {})
        return simulate(trace, chip, launch="none").time
    assert handoff("2us") - handoff("0s") == pytest.approx(100 * 2e-6, rel=0.01)  # 2 hand-offs per iteration


def test_deadlock_is_a_clear_error():
    prog = Program("aic", (Instr("mte2", "load", bytes=64, src="gm", dst="l1", wait=("never",)),))
    trace = Trace("stuck", "910b2", {}, (Group(prog),), 0.0, 64.0, {})
    with pytest.raises(NpusimError, match="deadlocks.*never"):
        simulate(trace, CHIP)


def test_result_fields_and_memo():
    clear_memo()
    trace = gemm_like(4096, 4096, 4096)
    r = simulate(trace, CHIP)
    assert simulate(trace, CHIP) is r  # memoised by content
    assert simulate(gemm_like(4096, 4096, 4096), CHIP) is r  # an equal trace built again hits too
    assert simulate(trace, load_chip("910b2", {"efficiency.cube": "0.5"})) is not r
    assert r.time > r.roofline and r.roofline_bound == "cube"
    assert set(r.busy) == {"aic.mte2", "aic.mte1", "aic.cube", "aic.fixpipe"}
    assert 0 < r.busy["aic.cube"] <= 1 and r.bound in ("mte2", "l2", "hbm", "cube")
    assert r.flops_per_s == pytest.approx(trace.flops / r.time)
    assert r.launch == CHIP.overheads.kernel_launch


def test_chrome_trace_has_a_track_per_core_and_pipe():
    _, tl = simulate_timeline(gemm_like(1024, 1024, 1024), CHIP)
    events = chrome_events([tl, tl])
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"MTE2", "MTE1", "CUBE", "FIXPIPE", "launch"} <= names
    spans = [e for e in events if e["ph"] == "X"]
    assert any(e["name"].startswith("steady state") for e in spans)
    assert all(e["dur"] >= 0 for e in spans)
    json.dumps(events)
    # a pipe runs one instruction at a time: its spans, steady-state jumps included, never overlap (Perfetto's
    # importer drops slices of a track that overlap without nesting)
    for track in {(e["pid"], e["tid"]) for e in spans}:
        on = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if (e["pid"], e["tid"]) == track)
        assert all(b[0] >= a[1] - 1e-6 for a, b in zip(on, on[1:])), track


# ---------------------------------------------------------------------------------------------- properties
shapes = st.tuples(st.sampled_from([256, 512, 1000, 2048]), st.sampled_from([256, 768, 2048]),
                   st.sampled_from([128, 512, 1536]))
knobs = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _time(trace: Trace, chip) -> float:
    return Simulation(trace, chip).run().time


@knobs
@given(shapes, st.floats(0.0, 1.0), st.sampled_from([2, 3]))
def test_never_faster_than_roofline(shape, hit, depth):
    trace = gemm_like(*shape, hit=hit, depth=depth)
    assert simulate(trace, CHIP, launch="none").time >= roofline(trace, CHIP)[0]


@knobs
@given(shapes, st.sampled_from(["hbm.bandwidth", "l2.read_bandwidth", "aic.pipes.mte2.bytes_per_cycle",
                                "aic.pipes.mte2.routes.hbm>l1", "efficiency.cube",
                                "aic.cube.flop_per_cycle.fp16"]), st.floats(1.0, 3.0))
def test_more_bandwidth_or_compute_is_never_slower(shape, field, factor):
    base = dataclasses.replace(CHIP)
    value = {"hbm.bandwidth": CHIP.hbm.bandwidth, "l2.read_bandwidth": CHIP.l2.read_bandwidth,
             "aic.pipes.mte2.bytes_per_cycle": CHIP.aic.pipes["mte2"].bytes_per_cycle,
             "aic.pipes.mte2.routes.hbm>l1": CHIP.aic.pipes["mte2"].routes["hbm>l1"],
             "efficiency.cube": CHIP.efficiency.cube, "aic.cube.flop_per_cycle.fp16": 8192}[field]
    new = min(value * factor, 1.0) if field.startswith("efficiency") else value * factor
    unit = {"hbm.bandwidth": "B/s", "l2.read_bandwidth": "B/s"}.get(field, "")
    faster = load_chip("910b2", {field: f"{new!r}{unit}"})
    trace = gemm_like(*shape)
    assert _time(trace, faster) <= _time(trace, base) * (1 + 1e-9)


@knobs
@given(shapes, st.floats(0.0, 1.0))
def test_deeper_buffers_are_never_slower(shape, hit):
    assert _time(gemm_like(*shape, hit=hit, depth=3), CHIP) <= _time(gemm_like(*shape, hit=hit, depth=2), CHIP) * (
        1 + 1e-9)


@knobs
@given(shapes, st.floats(0.0, 1.0))
def test_identical_inputs_give_bit_identical_results(shape, hit):
    clear_memo()
    a = simulate(gemm_like(*shape, hit=hit), CHIP)
    clear_memo()
    b = simulate(gemm_like(*shape, hit=hit), CHIP)
    assert a == b and a.time.hex() == b.time.hex()


# ------------------------------------------------------------------------------------------------------ CLI
def test_cli_kernel_sim(tmp_path):
    out = tmp_path / "gemm.json"
    run = subprocess.run([sys.executable, "-m", "npusim.cli.main", "kernel", "sim", "gemm", "--hw", "910c-die",
                          "--shape", "2048,2048,2048,dtype=fp16", "--trace", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "aic.cube" in run.stdout and "bound:" in run.stdout and "roofline:" in run.stdout
    assert "24 cores as 2 folded groups (16 + 8)" in run.stdout  # 256 blocks: 10 waves and 16 left over
    assert json.loads(out.read_text())["traceEvents"]
    bad = subprocess.run([sys.executable, "-m", "npusim.cli.main", "kernel", "sim", "gemm", "--hw", "910c-die",
                          "--shape", "1,2,3,4,5"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_device_launch_adds_task_dispatch_and_core_start():
    trace = stream(4, 1e6)
    bare, device = simulate(trace, CHIP, launch="none"), simulate(trace, CHIP, launch="device")
    o = CHIP.overheads
    assert device.time == pytest.approx(bare.time + o.task_dispatch + o.core_start)
    assert device.launch == pytest.approx(o.task_dispatch + o.core_start)
