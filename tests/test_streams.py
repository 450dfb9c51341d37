"""The stream simulator: in-order streams, cross-stream events, shared cores and links, exposed communication."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim.engine.streams import Task, run_streams
from npusim.errors import NpusimError

CAP = {"cores": 24, "link": 1}


def test_comm_overlaps_compute_on_another_stream():
    tl = run_streams([
        Task("attn", "compute", 3.0, units=24),
        Task("dispatch", "comm", 2.0, after=("attn",), resource="link", category="comm"),
        Task("shared_expert", "compute", 1.5, after=("attn",), units=24),
        Task("experts", "compute", 2.0, after=("dispatch", "shared_expert"), units=24),
    ], CAP)
    assert tl.makespan == pytest.approx(7.0)  # 3 + max(2, 1.5) + 2
    assert tl.exposed("comm") == pytest.approx(0.5)
    assert tl.busy("compute") == pytest.approx(6.5)


def test_kernels_on_all_cores_serialise_but_partitions_run_side_by_side():
    full = run_streams([Task("a", "s1", 1.0, units=24), Task("b", "s2", 1.0, units=24)], CAP)
    split = run_streams([Task("a", "s1", 1.5, units=16), Task("b", "s2", 1.5, units=8)], CAP)
    assert full.makespan == pytest.approx(2.0)
    assert split.makespan == pytest.approx(1.5)


def test_bad_schedules_are_refused():
    with pytest.raises(NpusimError, match="unknown task"):
        run_streams([Task("a", "s", 1.0, after=("zzz",))], CAP)
    with pytest.raises(NpusimError, match="needs 48 cores"):
        run_streams([Task("a", "s", 1.0, units=48)], CAP)
    with pytest.raises(NpusimError, match="deadlocks"):
        run_streams([Task("a", "s1", 1.0, after=("b",)), Task("b", "s2", 1.0, after=("a",))], CAP)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 5.0), st.sampled_from(["compute", "comm", "side"]), st.booleans()),
                min_size=1, max_size=12))
def test_schedule_bounds_and_determinism(spec):
    tasks = []
    for i, (dur, stream, dep) in enumerate(spec):
        after = (f"t{i - 1}",) if dep and i else ()
        comm = stream == "comm"
        tasks.append(Task(f"t{i}", stream, dur, after, resource="link" if comm else "cores", units=1 if comm else 24,
                          category="comm" if comm else "compute"))
    tl = run_streams(tasks, CAP)
    assert tl == run_streams(tasks, CAP)
    per_stream = {}
    for t in tasks:
        per_stream[t.stream] = per_stream.get(t.stream, 0.0) + t.duration
    assert tl.makespan >= max(per_stream.values()) - 1e-12  # never faster than any one stream
    assert tl.makespan <= sum(t.duration for t in tasks) + 1e-9  # never slower than running everything in series
    assert tl.exposed("comm") <= tl.busy("comm") + 1e-12


def test_partitions_side_by_side_share_hbm():
    bw = {"hbm": 100.0}
    alone = run_streams([Task("a", "s1", 1.5, units=16, flows=(("hbm", 90.0),))], CAP, bw)
    assert alone.makespan == pytest.approx(1.5)  # alone: its own rate, its own duration
    light = run_streams([Task("a", "s1", 1.0, units=16, flows=(("hbm", 60.0),)),
                         Task("b", "s2", 1.0, units=8, flows=(("hbm", 30.0),))], CAP, bw)
    assert light.makespan == pytest.approx(1.0)  # 60 + 30 B/s fit in 100: neither slows
    heavy = run_streams([Task("a", "s1", 1.0, units=16, flows=(("hbm", 90.0),)),
                         Task("b", "s2", 1.0, units=8, flows=(("hbm", 90.0),))], CAP, bw)
    assert heavy.makespan >= 1.8 - 1e-9  # 180 bytes through 100 B/s at best
    # shared per core: a's 16 cores take 2/3 (done at 90 / 66.7 = 1.35), then b alone at its own 90 B/s
    assert [s.end for s in heavy.spans] == pytest.approx([1.35, 1.85])
    with pytest.raises(NpusimError, match="unknown server"):
        run_streams([Task("a", "s1", 1.0, flows=(("l2", 1.0),))], CAP, bw)


def test_a_comm_kernel_holding_aiv_cores_slows_the_vector_kernel_beside_it():
    """A kernel on all 48 AIVs beside an HCCL AIV kernel holding 16 runs its vector part at 32/48 of its rate for
    as long as the holder runs; a cube-only kernel beside it is not slowed; a holder of every AIV makes it wait."""
    servers = {"aiv": 48.0}
    vector = Task("norm", "compute", 3.0, units=24, flows=(("aiv", 48 * 3.0),))
    alone = run_streams([vector], CAP, servers)
    assert alone.makespan == pytest.approx(3.0)
    comm = Task("ag", "comm", 1.0, resource="link", category="comm", holds=(("aiv", 16.0),))
    beside = run_streams([vector, comm], CAP | {"link": 1}, servers)
    # 1 s at 32/48 of the rate, then the 3 - 2/3 s of work left at full rate
    assert beside.spans[0].end == pytest.approx(1.0 + (3.0 - 32 / 48))
    assert beside.spans[0].end > alone.makespan
    gemm = Task("gemm", "compute", 3.0, units=24)  # no AIV program: no aiv flow
    assert run_streams([gemm, comm], CAP | {"link": 1}, servers).spans[0].end == pytest.approx(3.0)
    mc2 = Task("dispatch", "comm", 1.0, resource="link", category="comm", holds=(("aiv", 48.0),))
    waits = run_streams([vector, mc2], CAP | {"link": 1}, servers)
    assert waits.spans[0].end == pytest.approx(4.0)  # its AIV part waits out the dispatch
    assert waits.spans[1].end == pytest.approx(1.0)  # the holder itself runs at its own time


def test_a_comm_kernel_shares_hbm_and_is_never_faster_than_alone():
    """The collective's local HBM bytes share the server with the kernel beside it, one share per AIV it holds:
    together never faster than either alone, and with more HBM bandwidth never slower."""
    kernel = Task("gemm", "compute", 1.0, units=24, flows=(("hbm", 90.0),))
    comm = Task("combine", "comm", 1.0, resource="link", category="comm", flows=(("hbm", 40.0),), issuers=16)
    ends = {}
    for bw in (100.0, 130.0, 200.0):
        tl = run_streams([kernel, comm], CAP | {"link": 1}, {"hbm": bw})
        ends[bw] = tl.spans[0].end
        assert min(s.end - s.start for s in tl.spans) >= 1.0 - 1e-9
    assert ends[100.0] > 1.0 + 1e-6 and ends[200.0] == pytest.approx(1.0)
    assert ends[100.0] >= ends[130.0] >= ends[200.0]
