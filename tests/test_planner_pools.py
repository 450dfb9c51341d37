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


def erlang_c_by_sum(c: int, a: float) -> float:
    """Erlang C from its textbook sum: (a^c / c!) (c / (c - a)) / (sum_{k<c} a^k / k! + (a^c / c!) (c / (c - a)))."""
    terms, t = [], 1.0
    for k in range(c + 1):
        terms.append(t)
        t *= a / (k + 1)
    top = terms[c] * c / (c - a)
    return top / (sum(terms[:c]) + top)


def test_erlang_c_and_the_wait_at_the_routed_server():
    """Erlang C as its textbook sum (M/M/1 waits with probability rho); above 1024 servers Halfin-Whitt's
    approximation overstates the tail (fewer requests/s: conservative). A request bound to a busy server waits for
    the rest of its hold: at p99 a rate fits only while all-busy x (1 - headroom / hold) <= 0.5 %."""
    assert erlang_c(1, 0.5) == pytest.approx(0.5)
    for c, a in ((2, 1.0), (8, 5.0), (64, 50.0), (500, 460.0)):
        assert erlang_c(c, a) == pytest.approx(erlang_c_by_sum(c, a), rel=1e-9)
    for frac in (0.9, 0.95):
        assert erlang_c(1025, 1025 * frac) >= erlang_c(1024, 1024 * frac) * 0.95
    busy = erlang_c(8, 4.0)
    assert wait_fits(8, 4.0, 0.5, "p99") == (busy * 0.5 <= 0.005)
    rates = [capacity(c, 1.3, 0.6, "p99") for c in (1, 2, 4, 8, 16)]
    assert rates == sorted(rates) and all(r < c / 1.3 for r, c in zip(rates, (1, 2, 4, 8, 16)))
    assert capacity(8, 2.6, 1.2, "p99") == pytest.approx(capacity(8, 1.3, 0.6, "p99") / 2)  # in units of the hold


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


def test_pools_sized_for_a_rate_say_when_they_cannot_carry_it():
    """Given a rate, the pools with the fewest ranks that carry it; when none within the budget does, the most
    carrying ones, flagged: an open loop arriving faster than they carry grows its queue without bound."""
    args = (1024, 1.3, 64, 0.57, 256, 0.023, 64, 768)
    most = size_pools(*args)
    enough = size_pools(*args, rate=most.requests_per_s / 2)
    assert enough.requests_per_s == most.requests_per_s / 2 and enough.unmet == ""
    assert enough.prefill * 64 + enough.decode * 64 < most.prefill * 64 + most.decode * 64
    short = size_pools(*args, rate=1000.0)
    assert short.requests_per_s < 1000.0 and "below the offered 1000: the queue grows without bound" in short.unmet
    assert most.unmet == ""  # no rate offered, none unmet
