"""Serving on the engine: a lone request takes `npusim predict`'s times; capacity, link and MTP come from the plan;
`npusim serve` end to end and its refusals.

What "equal to predict" means here. A request served alone (concurrency 1) runs its prompt as one prefill step of
batch 1 on one rank, and decodes at batch 1 on one rank while the other ranks idle. predict's prefill batch is 1 and
its decode `batch` is global, so the same busiest-rank shape is predict at batch = attention-DP ranks. Hence:
- TTFT = predict's TTFT exactly: the prefill step, plus the KV transfer when disaggregated, under SGLang's PD flow
  (the prefill's token is streamed as the cache lands on the idle decode rank; vLLM's PD adds the decode's first
  step, which recomputes the prompt's last token);
- with output 2 there is one decode step, at context input + 1, so TPOT = predict's decode_step at that context;
  predict's tpot divides by 1 + mean accepted drafts, while the simulation draws acceptance: with every draft
  accepted both emit 1 + depth tokens a step, and the simulated TPOT over a longer answer equals predict's tpot at
  the mean context (step time is near-linear in context there).
The step models are used unwrapped (no grid) so that interpolation between grid nodes is not part of the comparison.
"""

import json

import numpy as np
import pytest

from npusim import api
from npusim.errors import NpusimError
from npusim.graph.accounting import cache_footprint
from npusim.serving import ClosedLoop, Fixed, Scheduler, Slo, simulate
from npusim.serving.predicted import ServedPlan, kv_link, mtp_from_plan

SMALL = dict(hw="cloudmatrix384", model="deepseek-v3.1", plan="r1-a3-decode-a16", quant="w8a8c8")  # co-located
COLOCATED = {"plan.colocated": "true"}  # serve runs a one-instance plan co-located; predict times its TTFT so
PD = dict(hw="cloudmatrix384", model="deepseek-v3.2-exp", plan="v32-a3-pd-a17", quant="bf16")  # disaggregated
SMALL_ARGS = ("--hw", "cloudmatrix384", "--model", "deepseek-v3.1", "--plan", "r1-a3-decode-a16", "--quant", "w8a8c8",
              "--input", "2048", "--output", "16")


def lone(config, input_tokens, output_tokens, overrides=None, scheduler=Scheduler()):
    served = ServedPlan.of(api.load_setup(**config, overrides=overrides), scheduler=scheduler)
    raw = {phase: grid.model for phase, grid in served.models.items()}  # same object twice when co-located
    result = simulate(served.deployment, ClosedLoop(1, Fixed(input_tokens), Fixed(output_tokens)), raw, requests=2)
    ranks = (served.deployment.decode or served.deployment.prefill).ranks
    return result.requests, ranks


@pytest.mark.parametrize("config", [SMALL, PD], ids=["co-located", "disaggregated"])
def test_a_lone_request_takes_predicts_ttft_and_decode_step(config):
    r, ranks = lone(config, 2048, 2, scheduler=Scheduler("sglang"))
    p = api.predict(**config, input=2048, output=2, batch=ranks, context=2049,
                    overrides=COLOCATED if config is SMALL else None)
    assert r.ttft.tolist() == pytest.approx([p.ttft] * 2, rel=1e-12)
    assert r.tpot.tolist() == pytest.approx([p.decode_step] * 2, rel=1e-12)
    assert (p.kv_transfer > 0) == (config is PD)


def test_with_every_draft_accepted_a_lone_requests_tpot_is_predicts_tpot():
    every = {"plan.mtp.acceptance": "1"}  # MTP1: each step emits 2 tokens, as predict's tpot assumes
    r, ranks = lone(SMALL, 2048, 17, every)
    p = api.predict(**SMALL, input=2048, output=17, batch=ranks, overrides=every)  # context 2048 + 8, the mean
    assert r.tpot.iloc[0] == pytest.approx(p.tpot, rel=1e-3)


def test_capacity_link_and_mtp_come_from_the_plan():
    setup = api.load_setup(**PD)
    served = ServedPlan.of(setup)
    d, pre, dec = served.deployment, served.models["prefill"].capacity, served.models["decode"].capacity
    assert (d.prefill.ranks, d.decode.ranks) == (1, 128)  # CP64 prefill is one DP rank; decode DP128
    per_token = cache_footprint(setup.model, setup.quant).bytes_per_token
    assert dec.kv_bytes_per_token == per_token and pre.kv_bytes_per_token == per_token / 64  # CP splits the cache
    mem = api.predict(**PD, input=2048, output=2, batch=128).memory["decode"]
    assert dec.kv_capacity <= mem.capacity - mem.weights - mem.comm_buffers
    for tokens in (1, 2048, 131072):
        sim_time = kv_link(setup).time(tokens, pre.kv_bytes_per_token)
        assert sim_time == pytest.approx(api.kv_transfer(setup.model, setup.plan, setup.system, setup.quant, tokens),
                                         rel=1e-9)
    mtp3 = mtp_from_plan(api.load_setup(**PD, overrides={"plan.mtp.depth": "3", "plan.mtp.acceptance": "1.44"}).plan)
    p = mtp3.acceptance
    assert p + p**2 + p**3 == pytest.approx(1.44, rel=1e-9)
    assert np.mean(mtp3.emitted(np.random.default_rng(0), 200_000)) == pytest.approx(2.44, rel=0.01)
    assert served.models["prefill"] is not served.models["decode"]
    co = ServedPlan.of(api.load_setup(**SMALL))
    assert co.models["prefill"] is co.models["decode"] and co.deployment.mtp.acceptance == pytest.approx(0.7)


def test_serve_cli_runs_end_to_end(cli, tmp_path):
    run = cli("serve", *SMALL_ARGS, "--rate", "20", "--requests", "100", "--slo", "ttft=3s,tpot=100ms",
              "--format", "json", "--figures", tmp_path)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["summary"]["completed"] == 100 and out["slo"] == {"ttft": 3.0, "tpot": 0.1}
    assert out["setup"]["plan"] == "r1-a3-decode-a16" and "request" not in run.stderr  # no bar off a terminal
    assert (tmp_path / "latency_cdfs.png").exists() and (tmp_path / "timeline.png").exists()
    table = cli("serve", *SMALL_ARGS, "--concurrency", "2", "--requests", "4")
    assert table.returncode == 0, table.stderr
    assert "latency (ms)" in table.stdout and "ttft" in table.stdout


def test_serve_cli_rate_sweep_finds_the_knee(cli, tmp_path):
    run = cli("serve", *SMALL_ARGS, "--rates", "1,1000", "--requests", "300", "--slo", "ttft=2s", "--figures", tmp_path)
    assert run.returncode == 0, run.stderr
    assert "knee: the SLO (ttft 2 s) is met at 1 requests/s and missed at 1000 (TTFT p99)" in run.stdout
    assert (tmp_path / "rate_sweep.png").exists()


@pytest.mark.parametrize("args, says", [
    (("--trace", "TRACE"), "line 3"),
    (("--plan", "no-such-plan", "--rate", "1"), "no-such-plan"),
    (("--rate", "-1"), "must be positive"),
    ((), "give a load: --rate, --rates, --concurrency or --trace"),
    (("--trace", "TRACE", "--concurrency", "2"), "drop --concurrency"),
    (("--rate", "1", "--mixed-chunk"), "mixed chunks are SGLang"),
    (("--rate", "1", "--prefill-delay", "30"), "prefill delayer is SGLang's"),
    (("--rates", "4,2"), "increasing order"),
    (("--rate", "1", "--slo", "ttft=fast"), "--slo"),
    (("--rate", "1", "--input", "gauss:5"), "not a length distribution"),
])
def test_serve_cli_refuses_bad_input_in_one_sentence(cli, tmp_path, args, says):
    trace = tmp_path / "bad.csv"
    trace.write_text("arrival,input,output\n0.0,100,10\n0.5,abc,10\n")
    run = cli("serve", *(str(trace) if a == "TRACE" else a for a in args), "--requests", "5")
    assert run.returncode == 2
    assert says in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_a_summary_meets_an_slo_at_a_percentile():
    served = ServedPlan.of(api.load_setup(**SMALL))
    s = served.run(ClosedLoop(1, Fixed(2048), Fixed(4)), requests=2).summary
    assert s.meets(Slo(ttft=s.ttft.p99 * 1.01, tpot=s.tpot.p99 * 1.01))
    assert not s.meets(Slo(ttft=s.ttft.p99 * 0.99)) and s.meets(Slo(ttft=s.ttft.p50 * 1.01), "p50")


def test_the_plans_prefill_chunk_chunks_a_lone_prompt_as_predict_does():
    chunked = {"plan.prefill_chunk": "512"}
    r, ranks = lone(SMALL, 2048, 2, chunked)
    p = api.predict(**SMALL, input=2048, output=2, batch=ranks, context=2049, overrides={**chunked, **COLOCATED})
    assert r.ttft.iloc[0] == pytest.approx(p.ttft, rel=1e-9)


def test_prefill_and_decode_instances_have_their_own_running_limits():
    setup = api.load_setup(**PD)
    served = ServedPlan.of(setup, max_batch=32, running={"prefill": 2, "decode": 48})
    assert (served.models["prefill"].capacity.max_batch, served.models["decode"].capacity.max_batch) == (2, 48)
    with pytest.raises(NpusimError, match="one pool"):
        ServedPlan.of(api.load_setup(**SMALL), running={"decode": 4})


def test_serve_cli_sglang_scheduler_with_a_rate_and_a_concurrency_cap(cli):
    run = cli("serve", *SMALL_ARGS, "--rate", "50", "--concurrency", "3", "--requests", "12", "--scheduler",
              "sglang", "--format", "json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["summary"]["completed"] == 12 and out["setup"]["deployment"]["scheduler"]["policy"] == "sglang"
    assert out["summary"]["mean_in_system"] <= 3 + 1e-9


def test_serve_names_an_instance_by_its_dies_and_the_knee_by_the_whole_slo():
    """The A17 prefill is one CP64 group: one attention-DP rank of 64 dies, whose KV cache is the group's (it printed
    'prefill 1 x 1 DP ranks' and 'per rank: KV cache'); a TPOT limit no rate meets is the knee even when TTFT is met
    (it printed 'TTFT p99 stays within 2 s')."""
    from refusal import run
    r = run("serve", "--input", "512", "--output", "4", "--rates", "1,2", "--requests", "4", "--slo",
            "ttft=2s,tpot=1us")
    assert r.returncode == 0, r.stderr
    assert "prefill 1 x 64 dies (1 attention-DP rank of 64 dies), decode 1 x 128 dies (128 attention-DP ranks of " \
           "1 die)" in r.stdout
    assert "per attention-DP rank (prefill 64 dies, decode 1 die): KV cache" in r.stdout
    assert "the SLO (ttft 2 s, tpot 1 us) is missed already at 1 requests/s (TPOT p99)" in r.stdout


def test_a_budget_beyond_the_chunk_reserves_activations_for_the_chunk_that_runs():
    """SGLang's --max-prefill-tokens 262144 beside --chunked-prefill-size 32768: a step's prompt tokens stay within
    the chunk (PrefillAdder's rem_chunk_tokens), so the HBM left for the cache is the 32K budget's, not refused."""
    setup = api.load_setup("atlas-800-a3", "deepseek-v3.1", "r1-a3-sglang-pd-w4a8", None, {"chips": "16"})
    wide = ServedPlan.of(setup, token_budget=262144, chunk_size=32768)
    narrow = ServedPlan.of(setup, token_budget=32768)
    assert wide.deployment.chunk_size == 32768
    for role in ("prefill", "decode"):
        assert wide.models[role].capacity.kv_capacity == narrow.models[role].capacity.kv_capacity
    assert wide.models["prefill"].capacity.token_budget == 262144
    with pytest.raises(NpusimError, match="positive number of tokens"):
        ServedPlan.of(setup, chunk_size=0)
