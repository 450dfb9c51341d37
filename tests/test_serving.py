"""Request-level serving simulation: queueing laws, solo-request exactness, overload, determinism, KV pressure."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from npusim.errors import NpusimError
from npusim.serving import (AnalyticStepModel, Capacity, ClosedLoop, Deployment, Fixed, GridStepModel, Link,
                            LogNormal, Mtp, OpenLoop, Pool, Scheduler, Slo, Uniform, simulate)

CAP = Capacity(kv_bytes_per_token=70e3, kv_capacity=10e9, max_batch=8, token_budget=4096)
MODEL = AnalyticStepModel(CAP)
CO_LOCATED = Deployment(prefill=Pool(instances=1, ranks=2))
SATURATION = 17.75  # requests/s of CO_LOCATED at 1024 in / 64 out (closed loop, 64 users)


def solo(deployment, input_tokens, output_tokens, prefix_hit=0.0, model=MODEL):
    return simulate(deployment, ClosedLoop(1, Fixed(input_tokens), Fixed(output_tokens), prefix_hit=prefix_hit),
                    model, seed=0, requests=3)


def solo_tpot(model, input_tokens, output_tokens):
    return np.mean([model.decode_time(1, input_tokens + j) for j in range(1, output_tokens)])


def test_one_request_at_a_time_takes_the_step_models_solo_times():
    r = solo(CO_LOCATED, 3000, 50).requests
    assert r.ttft.tolist() == pytest.approx([MODEL.prefill_time(3000, 0, 1)] * 3, rel=1e-12)
    assert r.tpot.tolist() == pytest.approx([solo_tpot(MODEL, 3000, 50)] * 3, rel=1e-12)
    assert r.queue_wait.tolist() == [0.0, 0.0, 0.0]


def test_prefix_hits_and_chunks_change_solo_ttft_as_the_step_model_says():
    hit = solo(CO_LOCATED, 3000, 5, prefix_hit=0.5).requests
    assert hit.ttft.iloc[0] == pytest.approx(MODEL.prefill_time(1500, 1500, 1), rel=1e-12)
    chunked = solo(Deployment(prefill=Pool(), chunk_size=1024), 3000, 5).requests
    expect = MODEL.prefill_time(1024, 0, 1) + MODEL.prefill_time(1024, 1024, 1) + MODEL.prefill_time(952, 2048, 1)
    assert chunked.ttft.iloc[0] == pytest.approx(expect, rel=1e-12)


def test_disaggregated_solo_request_pays_the_cache_transfer_once_in_its_ttft():
    """vLLM PD: prefill, the decode pulls the cache, and its first step (recomputing the prompt's last token) gives
    the first token; SGLang PD: the decode preallocates first, the cache is sent after the prefill's forward and the
    prefill's token is streamed as the request joins the (idle) decode rank."""
    link = Link(bandwidth=50e9, latency=20e-6)
    transfer = link.latency + 3000 * CAP.kv_bytes_per_token / link.bandwidth
    vllm = solo(Deployment(prefill=Pool(), decode=Pool(ranks=2), link=link), 3000, 50).requests
    first_step = MODEL.decode_time(1, 3001)
    assert vllm.ttft.iloc[0] == pytest.approx(MODEL.prefill_time(3000, 0, 1) + transfer + first_step, rel=1e-12)
    assert vllm.tpot.iloc[0] == pytest.approx(solo_tpot(MODEL, 3000, 50), rel=1e-12)
    assert vllm.prefill_rank.iloc[0] == "p0.r0" and vllm.decode_rank.iloc[0].startswith("d0.")
    assert (vllm.decode_admitted >= vllm.prefill_end).all() and (vllm.kv_ready > vllm.decode_admitted).all()
    sglang = solo(Deployment(prefill=Pool(), decode=Pool(ranks=2), link=link, scheduler=Scheduler("sglang")),
                  3000, 50).requests
    assert sglang.ttft.iloc[0] == pytest.approx(MODEL.prefill_time(3000, 0, 1) + transfer, rel=1e-12)
    assert (sglang.decode_admitted <= sglang.scheduled).all()
    assert (sglang.kv_ready - sglang.prefill_end).tolist() == pytest.approx([transfer] * 3, rel=1e-12)


def test_caches_landing_on_one_decode_rank_take_turns_on_its_ingress():
    """Two prefill ranks finish identical prompts at once; the one decode rank's ingress serves them in turn, so the
    second cache lands one transfer later (two decode ranks would take them in parallel)."""
    link = Link(bandwidth=5e9, latency=0.0)
    load = ClosedLoop(2, Fixed(3000), Fixed(4))
    transfer = 3000 * CAP.kv_bytes_per_token / link.bandwidth
    for ranks, gap in ((1, transfer), (2, 0.0)):
        d = Deployment(prefill=Pool(ranks=2), decode=Pool(ranks=ranks), link=link, scheduler=Scheduler("sglang"))
        r = simulate(d, load, MODEL, seed=0, requests=2).requests
        assert sorted(r.kv_ready - r.prefill_end) == pytest.approx([transfer, transfer + gap], rel=1e-9)


@pytest.mark.parametrize("load", [0.5, 0.8])
def test_littles_law_holds_on_the_queue_and_the_system(load):
    rate = load * SATURATION
    result = simulate(CO_LOCATED, OpenLoop(rate, Fixed(1024), Fixed(64)), MODEL, seed=0, duration=400)
    r = result.requests
    assert result.mean_waiting == pytest.approx(rate * r.queue_wait.mean(), rel=0.03)
    assert result.mean_in_system == pytest.approx(rate * r.e2e.mean(), rel=0.03)


def test_past_capacity_queue_and_ttft_grow_without_bound_while_throughput_saturates():
    def run(rate, n):
        return simulate(CO_LOCATED, OpenLoop(rate, Fixed(1024), Fixed(64)), MODEL, seed=0, requests=n).summary

    under = [run(0.6 * SATURATION, n) for n in (300, 600)]
    over = [run(2.0 * SATURATION, n) for n in (300, 600)]
    assert under[1].ttft.mean < 1.3 * under[0].ttft.mean
    assert over[1].ttft.mean > 1.8 * over[0].ttft.mean  # twice the requests, twice the backlog
    assert over[1].mean_waiting > 1.8 * over[0].mean_waiting
    assert over[1].request_throughput == pytest.approx(SATURATION, rel=0.1)
    assert over[0].request_throughput == pytest.approx(over[1].request_throughput, rel=0.05)
    assert run(4.0 * SATURATION, 600).request_throughput == pytest.approx(over[1].request_throughput, rel=0.05)


def busy_run(seed):
    deployment = Deployment(prefill=Pool(instances=2, ranks=2), chunk_size=512, mtp=Mtp(depth=2, acceptance=0.7))
    load = OpenLoop(10.0, LogNormal(900, 0.8, high=8000), Uniform(8, 200), cv=2.5, prefix_hit=0.2)
    return simulate(deployment, load, MODEL, seed=seed, requests=300)


def test_identical_seeds_give_identical_results():
    a, b, c = busy_run(7), busy_run(7), busy_run(8)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert np.array_equal(a.itl, b.itl)
    assert not a.requests.ttft.equals(c.requests.ttft)


def test_kv_exhaustion_preempts_and_admission_control_holds_requests_back():
    small = Capacity(kv_bytes_per_token=70e3, kv_capacity=70e3 * 6000, max_batch=16, token_budget=8192)
    result = simulate(Deployment(prefill=Pool(), kv_headroom=0.0), ClosedLoop(16, Fixed(1000), Fixed(1500)),
                      AnalyticStepModel(small), seed=0, requests=60)
    r, steps = result.requests, result.steps
    assert r.preemptions.sum() > 0 and result.summary.preemptions == r.preemptions.sum()
    assert r.finish.notna().all() and (r.generated == r.output).all()  # recomputed requests still finish
    assert steps.kv_usage.max() <= 1.0
    assert (steps.queue > 0).any() and steps.batch.max() < 16  # the cache, not max_batch, limited the batch


def test_a_request_larger_than_a_ranks_cache_is_refused():
    small = Capacity(kv_bytes_per_token=70e3, kv_capacity=70e3 * 2000, max_batch=16, token_budget=8192)
    with pytest.raises(NpusimError, match="needs 2500 tokens of KV cache"):
        simulate(CO_LOCATED, ClosedLoop(1, Fixed(2000), Fixed(500)), AnalyticStepModel(small), requests=1)


@pytest.mark.parametrize("draw", ["sequential", "binomial"])
def test_mtp_emits_one_plus_accepted_drafts_per_step(draw):
    def steps_per_request(acceptance):
        d = Deployment(mtp=Mtp(depth=3, acceptance=acceptance, draw=draw))
        r = solo(d, 1000, 401).requests
        return r.tpot.iloc[0] * 400 / MODEL.decode_time(1, 1200, 4)

    assert steps_per_request(1.0) == pytest.approx(100, rel=0.01)  # 4 tokens every step
    assert steps_per_request(0.0) == pytest.approx(400, rel=0.01)  # drafts all rejected
    mean_tokens = 1 + (0.6 + 0.6**2 + 0.6**3 if draw == "sequential" else 3 * 0.6)
    assert steps_per_request(0.6) == pytest.approx(400 / mean_tokens, rel=0.1)


def test_attention_dp_ranks_share_the_load():
    deployment = Deployment(prefill=Pool(instances=2, ranks=4))
    r = simulate(deployment, OpenLoop(20.0, Fixed(1024), Fixed(64)), MODEL, seed=1, requests=800).requests
    counts = r.prefill_rank.value_counts()
    assert len(counts) == 8 and counts.max() < 1.5 * counts.min()


def test_slo_goodput_and_json():
    result = simulate(CO_LOCATED, OpenLoop(0.8 * SATURATION, Fixed(1024), Fixed(64)), MODEL, seed=0,
                      requests=400, slo=Slo(ttft=0.5, tpot=0.02))
    s = result.summary
    met = result.met_slo()
    assert s.slo_attainment == pytest.approx(met.mean())
    assert s.goodput == pytest.approx(met.sum() / result.window)
    assert s.goodput <= s.request_throughput
    payload = json.loads(json.dumps(result.to_json()))
    assert payload["summary"]["ttft"]["p99"] == pytest.approx(s.ttft.p99)
    assert list(result.latency_table().metric) == ["ttft", "tpot", "itl", "e2e"]


def test_unfinished_requests_are_reported_not_dropped():
    result = simulate(CO_LOCATED, OpenLoop(2.0 * SATURATION, Fixed(1024), Fixed(64)), MODEL, seed=0, duration=20,
                      slo=Slo(ttft=1.0))
    s = result.summary
    assert s.completed < s.requests and result.requests.finish.isna().sum() == s.requests - s.completed
    assert 0.0 <= s.slo_attainment < 1.0


def test_grid_step_model_is_exact_on_nodes_close_between_and_monotone():
    """Within 2 % where the model is smooth in the axis, 5 % across the roofline's kinks (4 points per octave)."""
    grid = GridStepModel(MODEL)
    assert grid.decode_time(16, 2048) == MODEL.decode_time(16, 2048)
    assert grid.prefill_time(1024, 0, 1) == MODEL.prefill_time(1024, 0, 1)
    rng = np.random.default_rng(0)
    for batch, context in rng.integers(1, [8, 140000], size=(200, 2)):
        assert grid.decode_time(batch, context) == pytest.approx(MODEL.decode_time(batch, context), rel=0.02)
        assert grid.decode_time(batch, context + 37) >= grid.decode_time(batch, context)
        assert grid.decode_time(min(batch + 1, 8), context) >= grid.decode_time(batch, context)
    for new, cached in rng.integers(1, [4096, 100000], size=(200, 2)):
        assert grid.prefill_time(new, cached, 1) == pytest.approx(MODEL.prefill_time(new, cached, 1), rel=0.05)
        assert grid.prefill_time(new + 100, cached, 1) >= grid.prefill_time(new, cached, 1)


def test_grid_never_asks_for_a_shape_beyond_the_rank():
    asked = []

    class Recording(AnalyticStepModel):
        def decode_time(self, batch, context, tokens_per_seq=1):
            asked.append((batch, context))
            return super().decode_time(batch, context, tokens_per_seq)

    GridStepModel(Recording(CAP)).decode_time(7, CAP.kv_tokens - 5)
    assert max(b for b, _ in asked) <= CAP.max_batch and max(c for _, c in asked) <= CAP.kv_tokens


def test_a_serving_run_through_the_grid_matches_the_direct_model():
    load = OpenLoop(10.0, Fixed(1024), Fixed(64))
    direct = simulate(CO_LOCATED, load, MODEL, seed=3, requests=300).summary
    grid = GridStepModel(MODEL)
    via_grid = simulate(CO_LOCATED, load, grid, seed=3, requests=300).summary
    assert via_grid.ttft.mean == pytest.approx(direct.ttft.mean, rel=0.02)
    assert via_grid.tpot.mean == pytest.approx(direct.tpot.mean, rel=0.02)
    assert grid.evaluations < 100


def test_bad_arguments_are_one_sentence():
    load = OpenLoop(1.0, Fixed(10), Fixed(10))
    with pytest.raises(NpusimError, match="not both"):
        simulate(CO_LOCATED, load, MODEL, requests=1, duration=1.0)
    with pytest.raises(NpusimError, match="request count or a duration"):
        simulate(CO_LOCATED, load, MODEL)
    with pytest.raises(NpusimError, match="did you mean 'decode'"):
        simulate(CO_LOCATED, load, {"prefill": MODEL, "decod": MODEL}, requests=1)
    with pytest.raises(NpusimError, match="link"):
        Deployment(decode=Pool())
    with pytest.raises(NpusimError, match="rate"):
        OpenLoop(0.0, Fixed(10), Fixed(10))


def test_disaggregated_decode_preemption_recomputes_on_a_prefill_rank():
    tight = Capacity(kv_bytes_per_token=70e3, kv_capacity=70e3 * 8000, max_batch=16, token_budget=8192)
    deployment = Deployment(prefill=Pool(ranks=2), decode=Pool(), link=Link(bandwidth=50e9), kv_headroom=0.0)
    result = simulate(deployment, ClosedLoop(12, Fixed(1500), Fixed(1200)),
                      {"prefill": MODEL, "decode": AnalyticStepModel(tight)}, seed=0, requests=40)
    r = result.requests
    assert r.preemptions.sum() > 0
    assert r.finish.notna().all() and (r.generated == r.output).all()
    assert result.steps[result.steps.role == "decode"].kv_usage.max() <= 1.0


# ---------------------------------------------------------------------------------------------- framework schedulers
PROMPT = 4096  # = CAP.token_budget: the budget equals the prompt length


def one_rank(scheduler, chunk_size=None):
    return Deployment(prefill=Pool(), chunk_size=chunk_size, scheduler=scheduler)


def test_vllm_budget_counts_decodes_so_a_whole_prompt_waits_for_the_decodes():
    """vLLM semantics, chunked prefill off, budget = prompt: a prompt never fits beside a running decode, so the rank
    serves one request at a time (the trap of a decode-counting budget)."""
    result = simulate(one_rank(Scheduler("vllm")), ClosedLoop(8, Fixed(PROMPT), Fixed(32)), MODEL, seed=0, requests=16)
    steps = result.steps
    assert steps.decode_batch.max() == 1
    assert not ((steps.prefill_tokens > 0) & (steps.decode_batch > 0)).any()


def test_sglang_budget_counts_prompts_only_and_prefill_batches_run_alone():
    """SGLang semantics, same budget: every waiting prompt gets a prefill batch of its own (the first prompt of a
    batch is admitted whatever the budget) while the decodes wait, so the decodes then run batched."""
    result = simulate(one_rank(Scheduler("sglang")), ClosedLoop(8, Fixed(PROMPT), Fixed(32)), MODEL, seed=0,
                      requests=16)
    steps = result.steps
    assert steps.decode_batch.max() == 8
    assert not ((steps.prefill_tokens > 0) & (steps.decode_batch > 0)).any()  # prefill-only batches
    assert steps.prefill_tokens.max() == PROMPT  # max_prefill_tokens: one 4,096-token prompt per batch
    assert result.summary.output_throughput > 3 * simulate(one_rank(Scheduler("vllm")), ClosedLoop(
        8, Fixed(PROMPT), Fixed(32)), MODEL, seed=0, requests=16).summary.output_throughput


def test_sglang_chunks_to_the_chunk_budget_and_mixed_chunks_carry_the_decodes():
    chunked = simulate(one_rank(Scheduler("sglang"), chunk_size=1000), ClosedLoop(4, Fixed(2500), Fixed(16)), MODEL,
                       seed=0, requests=8).steps
    assert chunked.prefill_tokens.max() == 1000 and not ((chunked.prefill_tokens > 0) & (chunked.decode_batch > 0)).any()
    mixed = simulate(one_rank(Scheduler("sglang", mixed_chunk=True), chunk_size=1000),
                     ClosedLoop(4, Fixed(2500), Fixed(16)), MODEL, seed=0, requests=8).steps
    both = mixed[(mixed.prefill_tokens > 0) & (mixed.decode_batch > 0)]
    assert len(both) and (both.prefill_tokens + both.decode_batch <= 1000).all()  # decodes spend the chunk budget
    with pytest.raises(NpusimError, match="SGLang"):
        Scheduler("vllm", mixed_chunk=True)
    with pytest.raises(NpusimError, match="allowed: vllm, sglang"):
        Scheduler("tgi")


def test_sglang_admission_reserves_the_outputs_of_running_requests():
    """The cache holds 8,000 tokens: vLLM admits prompts on their prompt alone; SGLang also reserves min(output,
    4096) for the new request and new_token_ratio x the rest of the running ones', so fewer run at once."""
    small = AnalyticStepModel(Capacity(kv_bytes_per_token=70e3, kv_capacity=70e3 * 8000, max_batch=8,
                                       token_budget=4096))
    load = ClosedLoop(8, Fixed(1000), Fixed(1000))
    vllm = simulate(one_rank(Scheduler("vllm"), 4096), load, small, seed=0, requests=16).steps.decode_batch.max()
    sglang = simulate(one_rank(Scheduler("sglang"), 4096), load, small, seed=0, requests=16).steps.decode_batch.max()
    assert sglang < vllm


def test_a_concurrency_cap_beside_a_request_rate_holds_requests_at_the_client():
    """bench_serving --request-rate R --max-concurrency 1: arrivals far faster than service queue at the client; each
    request is sent when the last completes, so it meets an idle rank and takes the solo times."""
    load = OpenLoop(1000.0, Fixed(3000), Fixed(50), max_concurrency=1)
    r = simulate(CO_LOCATED, load, MODEL, seed=0, requests=5).requests
    assert r.ttft.tolist() == pytest.approx([MODEL.prefill_time(3000, 0, 1)] * 5, rel=1e-12)
    assert (r.arrival.iloc[1:].to_numpy() >= r.finish.iloc[:-1].to_numpy() - 1e-12).all()
    capped = simulate(CO_LOCATED, OpenLoop(1000.0, Fixed(1024), Fixed(64), max_concurrency=3), MODEL, seed=0,
                      requests=60)
    assert capped.mean_in_system <= 3 + 1e-9
    with pytest.raises(NpusimError, match="max_concurrency"):
        OpenLoop(1.0, Fixed(10), Fixed(10), max_concurrency=0)


def test_sglang_prefill_delayer_holds_prompts_until_the_dp_ranks_prefill_together():
    """SGLang's PrefillDelayer on 4 DP ranks: prompts that arrive at one rank while the others decode are held (up to
    30 passes), so fewer steps carry prompts, more ranks prefill in each, and TTFT grows; 1 pass holds nothing."""
    load = ClosedLoop(16, Fixed(1000), Uniform(16, 128))  # requests end apart, so ranks become free apart
    four = Deployment(prefill=Pool(ranks=4))

    def run(passes):
        return simulate(dataclasses.replace(four, scheduler=Scheduler("sglang", prefill_delay=passes)), load, MODEL,
                        seed=0, requests=64)

    off, held = run(0), run(30)
    prefills = (off.steps.prefill_tokens > 0).sum(), (held.steps.prefill_tokens > 0).sum()
    assert prefills[1] < prefills[0]
    assert held.steps.prefill_tokens[held.steps.prefill_tokens > 0].mean() > \
        off.steps.prefill_tokens[off.steps.prefill_tokens > 0].mean()
    assert held.summary.ttft.mean > off.summary.ttft.mean
    assert run(1).requests.equals(off.requests)
    with pytest.raises(NpusimError, match="SGLang's"):
        Scheduler("vllm", prefill_delay=30)
