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
