"""The planner sizes a disaggregated deployment's pools (issue 17): prefill and decode instances from the rate the
decode pool carries and the prefill throughput, with the queueing waits inside the TTFT limit; the written plan holds
those instances, and `npusim serve` on it (the command its header gives) serves what the planner said."""

import shlex

import pytest
import yaml

from npusim.planner import SearchSpace, search, write_plan
from npusim.planner.pools import capacity, erlang_c, size_pools, wait_fits
from npusim.serving import Slo

SC = dict(hw="cloudmatrix384", model="deepseek-v3.2-exp", input=131072, output=1024, quant="w8a8c8")
SLO = Slo(2.0, 0.030)
SPACE = SearchSpace(sizes=(64, 128, 256), attention_tp=(1,), o_proj_tp=(1, 8), dense_tp=(4,),
                    two_microbatch=(False, True), mtp_depths=(3,), batch_per_replica=(1, 2, 4, 8, 16))
TOLERANCE = 0.10  # served steady tok/s per chip vs the planner's (the run's ramp-up costs ~5 %)


def test_erlang_c_and_the_wait_at_the_routed_server():
    """M/M/1 waits with probability rho, M/M/2 at one erlang with 1/3; above 64 servers Halfin-Whitt takes over and
    stays close to the exact value. A request bound to a busy server waits for the rest of its hold: at p99 a rate
    fits only while all-busy x (1 - headroom / hold) <= 0.5 %."""
    assert erlang_c(1, 0.5) == pytest.approx(0.5)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(65, 50.0) == pytest.approx(erlang_c(64, 50.0 * 64 / 65), rel=0.5)
    busy = erlang_c(8, 4.0)
    assert wait_fits(8, 4.0, 1.0, 0.5, "p99") == (busy * 0.5 <= 0.005)
    rates = [capacity(c, 1.3, 0.6, "p99") for c in (1, 2, 4, 8, 16)]
    assert rates == sorted(rates) and all(r < c / 1.3 for r, c in zip(rates, (1, 2, 4, 8, 16)))


def test_pools_feed_the_decode_pool_within_the_budget():
    """A 2 s TTFT limit over a 1.43 s prompt leaves 0.57 s for the prefill queue: more prefill instances than the
    rate alone needs. The pools fit the budget, and the rate is the smaller pool's."""
    pools = size_pools(1024, 1.3, 64, 0.57, 256, 0.023, 64, 768)
    assert pools is not None and pools.prefill * 64 + pools.decode * 64 <= 768
    assert pools.requests_per_s <= capacity(pools.prefill, 1.3, 0.57, "p99") + 1e-12
    assert pools.requests_per_s <= capacity(pools.decode * 256, 1024 * 0.023, 0.0, "p99") + 1e-12
    assert pools.prefill > pools.requests_per_s * 1.3  # utilisation below 1: the queue's headroom
    assert size_pools(1024, 1.3, 64, 0.0, 256, 0.023, 64, 768) is None  # no headroom left by the prompt


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    r = search(slo=SLO, space=SPACE, workers=1, colocated=False, **SC)
    return r, write_plan(r, tmp_path_factory.mktemp("pools") / "plan.yaml")


def test_the_written_plan_holds_the_pools(planned):
    r, path = planned
    c = r.recommended
    doc = yaml.safe_load(path.read_text())
    assert doc["prefill"].get("instances", 1) == c.pools.prefill and doc["decode"].get("instances", 1) == c.pools.decode
    assert c.pools.prefill * c.prefill.layout.ranks + c.pools.decode * c.decode.layout.ranks == c.chips * 2
    assert c.served_tokens_per_s_per_chip == pytest.approx(1024 * c.pools.requests_per_s / c.chips)


def test_serving_the_written_plan_gives_the_planned_tokens_per_chip(planned):
    """The README's 128K example served one prefill instance: 0.29 tok/s per chip at p99. Sized pools, served by the
    plan header's own `npusim serve` command, meet the SLO at p99 and serve within 10 % of the planner's figure."""
    from conftest import run_cli
    import json

    r, path = planned
    c = r.recommended
    serve = next(line for line in path.read_text().splitlines() if line.startswith("#   npusim serve"))
    out = run_cli(*shlex.split(serve.split("npusim ", 1)[1]), "--format", "json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)["summary"]
    assert s["ttft"]["p99"] <= SLO.ttft and s["tpot"]["p99"] <= SLO.tpot
    served = s["steady_output_throughput"] / c.chips
    assert served == pytest.approx(c.served_tokens_per_s_per_chip, rel=TOLERANCE)
    assert served == pytest.approx(r.confirmed.tokens_per_s_per_chip)  # the search's own run is that command's
    assert served > 10 * 0.29
