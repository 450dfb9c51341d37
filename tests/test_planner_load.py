"""npusim plan under a load: the recommended plan meets the SLO percentile in the serving simulation, and `npusim serve`
on the written plan file with the printed command confirms it; an impossible load says so; bad load input is refused."""

import json

import pytest

import npusim
from npusim import serving
from npusim.planner import SearchSpace, Traffic, commands, search, write_plan
from npusim.serving import Slo
from npusim.serving.steady import run_length

# Instances of 32 or 64 ranks, so that plans of 32, 48 and 64 chips compete; solo TTFT ~0.1 s, TPOT ~40-50 ms.
SPACE = dict(hw="cloudmatrix384", model="deepseek-v3.2-exp", input=2048, output=256, workers=1,
             space=SearchSpace(max_ranks=64, min_ranks=32, attention_tp=(1, 4), o_proj_tp=(8,), dense_tp=(1,),
                               two_microbatch=(False,), mtp_depths=(1,), batch_per_replica=(1, 4, 16, 64)))
SLO = Slo(ttft=1.0, tpot=0.06)
RATE = Traffic(rate=8.0)  # past the prefill capacity of the 32-rank instances: queueing pushes their TTFT p99 past 1 s


@pytest.fixture(scope="module")
def loaded():
    return search(slo=SLO, load=RATE, **SPACE)


def test_one_slo_type():
    assert npusim.Slo is serving.Slo is Slo
    slo = Slo.parse("ttft=2s,tpot=30ms")
    assert slo == Slo(2.0, 0.03) and Slo.parse(str(slo)) == slo and Slo.parse("ttft=2s") == Slo(ttft=2.0)


def test_the_load_is_checked_cheapest_first_and_the_failures_say_why(loaded):
    """The pools are sized to carry the load (8 requests/s: past one 32-rank prefill instance, so more prefill
    instances than one), and served cheapest first: the first plan that meets the SLO under it is recommended."""
    served = loaded.served
    assert [s.candidate.chips for s in served] == sorted(s.candidate.chips for s in served)
    assert all(not s.ok for s in served[:-1]) and served[-1].ok
    rec = loaded.recommended
    assert rec is served[-1].candidate and rec.pools.requests_per_s == pytest.approx(RATE.rate)
    assert rec.pools.prefill * rec.prefill.layout.ranks * 1.0 / rec.prefill.step > RATE.rate  # utilisation < 1
    assert served[-1].ttft <= SLO.ttft and served[-1].tpot <= SLO.tpot
    tight = search(slo=Slo(1.0, served[-1].candidate.tpot * 1.01), load=RATE, **SPACE)
    assert "tpot" in tight.served[0].misses  # a TPOT met for one request at the mean context, missed at p99


def test_npusim_serve_confirms_the_recommended_plan(loaded, cli, tmp_path):
    path = write_plan(loaded, tmp_path / "plan.yaml")
    serve = commands(loaded, path)[1]
    rec = loaded.recommended
    # as many requests as a steady window needs at 8/s for the plan's predicted end-to-end latency (was: 200)
    steady = run_length(e2e=rec.ttft + SPACE["output"] * rec.tpot, rate=RATE.rate)
    assert serve in path.read_text() and f"--rate 8.0 --requests {steady} --seed 0" in serve and steady > 200
    run = cli(*serve.split()[1:], "--format", "json")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)["summary"]
    v = loaded.verified
    assert summary["steady"]["verdict"] == "steady" and summary["requests"] == steady
    assert summary["steady_ttft"]["p99"] == pytest.approx(v.ttft, rel=1e-9) and v.ttft <= SLO.ttft
    assert summary["steady_tpot"]["p99"] == pytest.approx(v.tpot, rel=1e-9) and v.tpot <= SLO.tpot


def test_cli_plan_under_a_load_states_it_and_prints_the_serve_command(cli, tmp_path):
    out = tmp_path / "p.yaml"
    r = cli("plan", "--input", 2048, "--output", 256, "--ranks", 32, "--mtp", 1, "--workers", 1,
            "--slo", "ttft=1s,tpot=60ms", "--concurrency", 4, "--out", out)
    assert r.returncode == 0, r.stderr
    steady = run_length(concurrency=4)  # the requests a steady window needs: six rounds of the users and 1000
    assert "load: 4 concurrent users, 200+ requests, seed 0, SLO at p99" in r.stdout
    assert f"served under 4 concurrent users, {steady} requests, seed 0, SLO at p99: TTFT p99" in r.stdout
    assert f"npusim serve --hw cloudmatrix384 --model deepseek-v3.2-exp --plan {out}" in r.stdout and out.exists()
    assert f"--concurrency 4 --requests {steady} --seed 0" in r.stdout


def test_an_impossible_load_says_so_and_shows_the_closest(cli, tmp_path):
    out = tmp_path / "p.yaml"
    r = cli("plan", "--input", 2048, "--output", 256, "--ranks", 32, "--mtp", 1, "--workers", 1,
            "--slo", "ttft=1s,tpot=60ms", "--rate", 1000, "--out", out)
    assert r.returncode == 0, r.stderr
    assert "no plan on the frontier meets the SLO at p99 under this load; the closest" in r.stdout
    assert "below the offered 1000: the queue grows without bound" in r.stdout and not out.exists()


@pytest.mark.parametrize("args, says", [(("--rate", "-1"), "--rate"),
                                        (("--rate", "1", "--concurrency", "2"), "not allowed with"),
                                        (("--concurrency", "0"), "--concurrency"),
                                        (("--rate", "1", "--requests", "0"), "--requests"),
                                        (("--rate", "1", "--percentile", "p95"), "--percentile")])
def test_cli_plan_refuses_a_bad_load_in_one_sentence(cli, args, says):
    r = cli("plan", "--input", "1024", "--output", "64", *args)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
