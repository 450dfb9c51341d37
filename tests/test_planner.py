"""npusim plan: the recommended plan meets the SLO by predict, pruning keeps what the full search keeps, clear errors."""

import pytest

from npusim import api
from npusim.errors import NpusimError
from npusim.planner import SearchSpace, search, write_plan
from npusim.serving import Slo

SMALL = dict(hw="cloudmatrix384", model="deepseek-v3.2-exp", input=2048, output=256, workers=1,
             space=SearchSpace(max_ranks=32, min_ranks=16, attention_tp=(1, 4), o_proj_tp=(8,), dense_tp=(1,),
                               two_microbatch=(False,), mtp_depths=(0, 1), batch_per_replica=(1, 4, 16, 64)))


@pytest.fixture(scope="module")
def loose():
    """An SLO half-way into what the small space can do, so that bounds prune but plans still meet it."""
    probe = search(slo=Slo(1e3, 1e3), prune=False, **SMALL)
    tpots = sorted(c.tpot for c in probe.frontier)
    ttfts = sorted(c.ttft for c in probe.frontier)
    return Slo(ttfts[len(ttfts) // 2] * 1.01, tpots[len(tpots) // 2] * 1.01)


def test_slo_parse():
    assert Slo.parse("ttft=2s,tpot=30ms") == Slo(2.0, 0.03)
    for bad in ("ttft=2s,tpot=fast", "latency=1s,tpot=3ms", "ttft=1s,ttft=2s"):
        with pytest.raises(NpusimError, match="--slo"):
            Slo.parse(bad)
    with pytest.raises(NpusimError, match="--slo"):  # the planner needs both limits
        search(slo=Slo.parse("ttft=2s"), **SMALL)


def test_recommended_plan_meets_slo_by_predict(loose, tmp_path):
    r = search(slo=loose, **SMALL)
    assert r.recommended is not None and r.pruned > 0
    path = write_plan(r, tmp_path / "rec.yaml")
    p = api.predict(SMALL["hw"], SMALL["model"], str(path), input=SMALL["input"], output=SMALL["output"],
                    batch=r.recommended.batch)
    assert p.ttft <= loose.ttft and p.tpot <= loose.tpot
    assert p.tpot == pytest.approx(r.recommended.tpot) and p.ttft == pytest.approx(r.recommended.ttft)


def test_pruning_keeps_what_the_full_search_keeps(loose):
    full = search(slo=loose, prune=False, **SMALL)
    pruned = search(slo=loose, **SMALL)
    assert pruned.predictions < full.predictions
    key = lambda c: (c.prefill.layout, c.decode.layout, c.decode.batch)  # noqa: E731
    assert {key(c) for c in full.frontier if c.decode.batch} >= {key(c) for c in pruned.frontier}
    assert key(pruned.recommended) == key(full.recommended)
    for c in full.frontier:  # every full-search frontier point is matched or beaten by a pruned-search point
        assert any(o.served_tokens_per_s_per_chip >= c.served_tokens_per_s_per_chip * (1 - 1e-9)
                   and o.chips <= c.chips and o.tpot <= loose.tpot for o in pruned.frontier)


def test_nothing_runs_says_why(cli):
    r = cli("plan", "--input", "1024", "--output", "64", "--ranks", "8", "--mtp", "0", "--workers", "1")
    assert r.returncode == 0 and "no candidate can run" in r.stdout and "HBM" in r.stdout


def test_unmeetable_slo_shows_closest():
    r = search(slo=Slo(1e-4, 1e-4), **SMALL)
    assert r.recommended is None and not r.frontier and r.closest
    v = [c.violation(r.slo) for c in r.closest]
    assert all(x > 1 for x in v)


def test_cli_plan_writes_a_plan_predict_accepts(cli, tmp_path):
    out = tmp_path / "p.yaml"
    slo = "ttft=1000s,tpot=1000s"
    r = cli("plan", "--hw", SMALL["hw"], "--model", SMALL["model"], "--input", SMALL["input"], "--output",
            SMALL["output"], "--slo", slo, "--ranks", "32", "--mtp", "0", "--workers", "1", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "recommended" in r.stdout and out.exists()
    cmd = [line for line in out.read_text().splitlines() if "npusim predict" in line][0].split("npusim predict")[1]
    r2 = cli("predict", *cmd.split(), "--format", "json")
    assert r2.returncode == 0, r2.stderr


@pytest.mark.parametrize("args, needle", [(("--slo", "ttft=2s"), "--slo"),
                                          (("--hw", "nope"), "unknown system"),
                                          (("--max-chips", "4"), "--max-chips"),
                                          (("--mtp", "2"), "--mtp"), (("--ranks", "x"), "--ranks"),
                                          (("--ranks", "32", "--mtp", "0", "--slo", "ttft=1000s,tpot=1000s", "--out",
                                            "/nonexistent-dir/p.yaml"), "--out")])
def test_cli_plan_bad_input_is_one_sentence(cli, args, needle):
    r = cli("plan", "--input", "1024", "--output", "64", *args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_prefix_hit_reaches_the_planners_predictions_and_commands(tmp_path):
    """--prefix-hit is planned for: every frontier plan's TTFT comes from predict with the same hit (shorter than
    without), and the printed predict / serve commands carry it."""
    from npusim.planner.search import commands

    cold = search(slo=Slo(1e3, 1e3), **SMALL)
    warm = search(slo=Slo(1e3, 1e3), prefix_hit=0.5, **SMALL)
    assert warm.scenario.prefix_hit == 0.5
    assert min(c.ttft for c in warm.frontier) < min(c.ttft for c in cold.frontier)
    assert all("--prefix-hit 0.5" in line for line in commands(warm, tmp_path / "plan.yaml"))
    with pytest.raises(NpusimError, match=r"\[0, 1\)"):
        search(slo=Slo(1e3, 1e3), prefix_hit=-0.1, **SMALL)


@pytest.mark.slow
def test_colocated_runs_beside_the_confirming_run_are_the_same_runs(loose):
    """With a second worker the co-located deployments are served in it while the main process serves the frontier
    (search._ahead): the same runs, rows and verdict as one after the other."""
    serial = search(slo=loose, **SMALL)
    beside = search(slo=loose, **{**SMALL, "workers": 2})
    assert serial.colocated, "the small space serves co-located deployments"
    assert [repr(m) for m in beside.colocated] == [repr(m) for m in serial.colocated]
    assert beside.verdict == serial.verdict and beside.recommended == serial.recommended
    assert [repr(s) for s in beside.served] == [repr(s) for s in serial.served]


def test_plan_files_are_the_text_safe_dump_writes(tmp_path):
    """The search writes its candidates' plan files with libyaml's emitter (planner.search._DUMPER), named by their text:
    the text PyYAML's pure-Python safe_dump writes, for every layout of the default space (and a described plan with
    pools), and a document written twice is one file."""
    import yaml

    from npusim.planner.search import _plan_file
    from npusim.planner.space import plan_document
    space = SearchSpace(max_ranks=256, aic=24)
    docs = [plan_document(p, p) for p in space.prefill_layouts()] + \
        [plan_document(None, d) for d in space.decode_layouts()] + \
        [plan_document(space.prefill_layouts()[0], space.decode_layouts()[-1], "npusim plan: " + "a long line " * 20,
                       instances=(3, 21))]
    for doc in docs:
        path = _plan_file(doc, str(tmp_path))
        assert open(path).read() == yaml.safe_dump(doc, sort_keys=False)
        assert _plan_file(dict(doc), str(tmp_path)) == path
    assert len(list(tmp_path.iterdir())) == len({repr(d) for d in docs})
