"""KV transfer between pools as the hardware moves it: the slowest of sender egress, link and receiver ingress,
never faster than the bytes allow, queued per rank under load."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim import api
from npusim.graph.accounting import cache_footprint
from npusim.parallel.transfer import exposed, kv_path, shards
from npusim.serving import ClosedLoop, Deployment, Fixed, Link, Pool, Scheduler, simulate
from npusim.serving.predicted import kv_link
from npusim.serving.stepmodel import AnalyticStepModel, Capacity

PD_PLANS = ("v32-a3-pd-a17", "v32-a2-pd", "v32-950dt-pd", "r1-a3-sglang-pd-w4a8", "v32-a3-sglang-pd-tp4")
SYSTEM_OF = {"v32-a3-pd-a17": "cloudmatrix384", "v32-a2-pd": "atlas-800-a2", "v32-950dt-pd": "atlas-950-superpod",
             "r1-a3-sglang-pd-w4a8": "atlas-800-a3", "v32-a3-sglang-pd-tp4": "atlas-800-a3"}
MODEL_OF = {"r1-a3-sglang-pd-w4a8": "deepseek-v3.1"}
NODES = {"atlas-800-a2": {"chips": "48"}, "atlas-800-a3": {"chips": "32"}}  # the plans span several nodes (RoCE)


def setup_of(plan, overrides=None, quant="w8a8c8"):
    system = SYSTEM_OF[plan]
    return api.load_setup(system, MODEL_OF.get(plan, "deepseek-v3.2-exp"), plan, quant,
                          {**NODES.get(system, {}), **(overrides or {})})


def test_the_128k_pd_example_moves_its_cache_at_the_decode_dies_ingress():
    """The issue's case: a 6.28 GB W8A8C8 128K cache lands on one decode die (DP attention), whose UB port
    (196 GB/s at the HIXL-fitted efficiency.link) bounds it: tens of ms, not the 0.2 ms of dividing the bytes over
    the 64 prefill senders."""
    s = setup_of("v32-a3-pd-a17")
    t = api.kv_transfer(s.model, s.plan, s.system, s.quant, 131072)
    size = 131072 * cache_footprint(s.model, s.quant).bytes_per_token
    assert size == pytest.approx(6.28e9, rel=0.01)
    ingress = s.system.tiers["ub"].bandwidth * s.system.chip_spec.efficiency.link
    assert t >= size / s.system.tiers["ub"].bandwidth > 0.032
    assert t == pytest.approx(size / ingress, rel=0.03)  # the fixed costs are a few per cent of it
    p = api.predict(s.system.name, s.model.name, s.plan.name, quant="w8a8c8", input=131072, batch=128)
    assert p.kv_transfer == pytest.approx(t, rel=1e-12) and p.ttft == pytest.approx(p.prefill.time + t, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(plan=st.sampled_from(PD_PLANS), tokens=st.integers(1, 131072),
       bandwidth=st.sampled_from(["5GB/s", "25GB/s", "196GB/s", "1TB/s"]), eff=st.sampled_from(["0.3", "0.72", "1"]))
def test_no_transfer_beats_its_bytes_over_the_slowest_server(plan, tokens, bandwidth, eff):
    s = setup_of(plan)
    tier = kv_path(s.model, s.plan, s.system, s.quant).tier
    s = setup_of(plan, {f"tiers.{tier}.bandwidth": bandwidth, "efficiency.link": eff})
    path = kv_path(s.model, s.plan, s.system, s.quant)
    size = tokens * cache_footprint(s.model, s.quant).bytes_per_token
    t = api.kv_transfer(s.model, s.plan, s.system, s.quant, tokens)
    assert path.egress <= s.system.tiers[tier].bandwidth and path.ingress <= s.system.tiers[tier].bandwidth
    assert t >= size / path.senders / path.egress  # each sender die ships its shard through its own port
    assert t >= size / path.receivers / path.ingress  # each receiver die takes its shard through its own
    assert t >= size / max(path.senders, path.receivers) / path.link
    assert t >= size / min(path.senders * path.egress, path.receivers * path.ingress)


@settings(max_examples=40, deadline=None)
@given(plan=st.sampled_from(PD_PLANS), tokens=st.integers(1024, 65536), factor=st.sampled_from([1.5, 2.0, 8.0]))
def test_more_bandwidth_never_slows_a_transfer(plan, tokens, factor):
    s = setup_of(plan)
    path = kv_path(s.model, s.plan, s.system, s.quant)
    faster = dataclasses.replace(path, egress=path.egress * factor, link=path.link * factor,
                                 ingress=path.ingress * factor)
    assert faster.time(tokens) <= path.time(tokens)


def test_gqa_caches_split_over_attention_tp_as_memory_counts_them():
    s = api.load_setup("atlas-800-a3", "workloads/models/hf/Qwen3-235B-A22B/config.json", "r1-a3-sglang-mixed-tp4", "w8a8")
    inst = s.plan.instance("decode")
    assert s.model.is_gqa and shards(s.model, inst) == inst.pp * inst.attention.cp * min(inst.attention.tp, 4)


def test_chunks_sent_as_they_end_leave_only_the_tail_exposed():
    s = setup_of("v32-a3-pd-a17")
    path = kv_path(s.model, s.plan, s.system, s.quant)
    whole = exposed(path, [(4096, 1.0)])
    assert whole == pytest.approx(path.time(4096))
    streamed = exposed(path, [(2048, 0.5), (2048, 1.0)])  # the first half moved during the second chunk
    assert streamed == pytest.approx(path.time(2048)) and streamed < whole


@settings(max_examples=25, deadline=None)
@given(users=st.integers(2, 6), prefill_ranks=st.integers(1, 4), decode_ranks=st.integers(1, 3),
       tokens=st.integers(256, 8192), policy=st.sampled_from(["sglang", "vllm"]))
def test_transfers_into_one_decode_rank_queue_on_its_ingress(users, prefill_ranks, decode_ranks, tokens, policy):
    """Under load no cache lands faster than its bytes allow, and each decode rank's ingress serves one transfer at
    a time: consecutive landings on a rank are at least the later transfer's time apart (prompts of one chunk)."""
    cap = Capacity(kv_bytes_per_token=70e3, kv_capacity=20e9, max_batch=8, token_budget=16384)
    s = setup_of("v32-a3-pd-a17")
    link = kv_link(s)
    d = Deployment(prefill=Pool(ranks=prefill_ranks), decode=Pool(ranks=decode_ranks), link=link,
                   scheduler=Scheduler(policy))
    r = simulate(d, ClosedLoop(users, Fixed(tokens), Fixed(3)), AnalyticStepModel(cap), seed=0,
                 requests=3 * users).requests
    one = link.time(tokens, cap.kv_bytes_per_token)
    start = r.prefill_end if policy == "sglang" else r.decode_admitted
    assert (r.kv_ready - start >= one * (1 - 1e-9)).all()
    for _, rank in r.groupby("decode_rank"):
        landed = rank.kv_ready.sort_values().to_numpy()
        assert all(b - a >= one * (1 - 1e-9) for a, b in zip(landed, landed[1:]))


def test_a_prefix_hit_removes_its_prefill_work_and_transfer_in_predict_and_serve():
    """Half of a 4K prompt cached: predict's prefill computes the other half against the cached blocks and only it
    crosses to the decode pool; a lone served request pays the same transfer."""
    s = setup_of("v32-a3-pd-a17")
    whole = api.predict("cloudmatrix384", "deepseek-v3.2-exp", "v32-a3-pd-a17", input=4096, batch=128, quant="w8a8c8")
    half = api.predict("cloudmatrix384", "deepseek-v3.2-exp", "v32-a3-pd-a17", input=4096, batch=128, quant="w8a8c8",
                      prefix_hit=0.5)
    assert half.prefill.time < whole.prefill.time
    assert half.kv_transfer == pytest.approx(api.kv_transfer(s.model, s.plan, s.system, s.quant, 2048), rel=1e-12)
    assert half.kv_transfer < whole.kv_transfer and half.scenario["prefix_hit"] == 0.5
    assert half.memory["prefill"].kv_cache == whole.memory["prefill"].kv_cache  # cached blocks keep their memory
    cap = Capacity(kv_bytes_per_token=70e3, kv_capacity=20e9, max_batch=8, token_budget=16384)
    link = kv_link(s)
    d = Deployment(prefill=Pool(), decode=Pool(), link=link, scheduler=Scheduler("sglang"))
    r = simulate(d, ClosedLoop(1, Fixed(4096), Fixed(3), prefix_hit=0.5), AnalyticStepModel(cap), seed=0,
                 requests=2).requests
    assert (r.kv_ready - r.prefill_end).tolist() == pytest.approx([link.time(2048, 70e3)] * 2, rel=1e-12)
    with pytest.raises(Exception, match=r"\[0, 1\)"):
        api.predict(prefix_hit=1.0)


def test_a_layerwise_push_leaves_only_the_last_layers_share_after_the_prefill():
    """vLLM-Ascend's MooncakeLayerwiseConnector: the decode preallocates, the prefill pushes each layer during its
    forward, so a long prompt's cache lands one layer's share after the forward ends (the pull connector moves it
    all after it); the scheduler refuses the layerwise connector for SGLang, whose backends send per chunk."""
    cap = Capacity(kv_bytes_per_token=70e3, kv_capacity=20e9, max_batch=8, token_budget=65536)
    link = kv_link(setup_of("v32-a3-pd-a17"))
    runs = {}
    for connector in ("pull", "layerwise"):
        d = Deployment(prefill=Pool(), decode=Pool(), link=link, scheduler=Scheduler("vllm", connector=connector))
        runs[connector] = simulate(d, ClosedLoop(1, Fixed(32768), Fixed(3)), AnalyticStepModel(cap), seed=0,
                                   requests=2).requests
    whole = link.time(32768, 70e3)
    pull, layerwise = (runs[c].kv_ready - runs[c].prefill_end for c in ("pull", "layerwise"))
    assert pull.tolist() == pytest.approx([whole] * 2, rel=1e-9)
    assert layerwise.tolist() == pytest.approx([link.latency + (whole - link.latency) / link.layers] * 2, rel=1e-9)
    assert (runs["layerwise"].decode_admitted <= runs["layerwise"].scheduled).all()
    with pytest.raises(Exception, match="layerwise"):
        Scheduler("sglang", connector="layerwise")


def test_sglangs_prealloc_keeps_512_tokens_per_active_request():
    """SGLang's decode prealloc reserves num_reserved_decode_tokens (512) for every active request: two 2,000-token
    prompts on a 5,000-token decode rank fit as caches (4,000) but not with 2 x 512 reserved, so the second waits
    for the first to finish before its prefill even starts; vLLM's pull connector admits both."""
    per_token = 70e3
    cap = Capacity(kv_bytes_per_token=per_token, kv_capacity=5000 * per_token, max_batch=8, token_budget=16384)
    link = kv_link(setup_of("v32-a3-pd-a17"))
    runs = {policy: simulate(Deployment(prefill=Pool(), decode=Pool(), link=link, scheduler=Scheduler(policy)),
                             ClosedLoop(2, Fixed(2000), Fixed(8)), AnalyticStepModel(cap), seed=0, requests=2).requests
            for policy in ("sglang", "vllm")}
    first, second = runs["sglang"].sort_values("decode_admitted").itertuples()
    assert second.decode_admitted >= first.finish and second.scheduled >= second.decode_admitted
    assert runs["vllm"].decode_admitted.max() < runs["vllm"].finish.min()


def test_a_prefill_ranks_running_limit_counts_the_caches_it_still_sends():
    """SGLang's prefill keeps a finished prompt in its inflight queue, slot and cache held, until the transfer is
    done: with --max-running-requests 1 the next prompt's prefill waits for the first cache to leave."""
    link = Link(bandwidth=1e9)  # slow: each 2,000-token cache takes 0.14 s, longer than its prefill
    pre = AnalyticStepModel(Capacity(kv_bytes_per_token=70e3, kv_capacity=20e9, max_batch=1, token_budget=16384))
    dec = AnalyticStepModel(Capacity(kv_bytes_per_token=70e3, kv_capacity=20e9, max_batch=8, token_budget=16384))
    d = Deployment(prefill=Pool(), decode=Pool(), link=link, scheduler=Scheduler("sglang"))
    r = simulate(d, ClosedLoop(2, Fixed(2000), Fixed(4)), {"prefill": pre, "decode": dec}, seed=0,
                 requests=2).requests.sort_values("scheduled")
    first, second = r.itertuples()
    assert second.scheduled >= first.kv_ready > first.prefill_end


def test_sglangs_decode_preallocates_beyond_its_running_limit():
    """SGLang's decode req-to-token pool has 2 x the running limit of extra slots (pre_alloc_size, limits <= 32):
    with 2 running per rank, 6 requests get their caches reserved and sent at once, and the later ones wait to join,
    their prefill done, while vLLM's pull connector admits only the running limit."""
    cap = Capacity(kv_bytes_per_token=70e3, kv_capacity=20e9, max_batch=2, token_budget=16384)
    link = kv_link(setup_of("v32-a3-pd-a17"))
    admitted = {}
    for policy in ("sglang", "vllm"):
        d = Deployment(prefill=Pool(ranks=6), decode=Pool(), link=link, scheduler=Scheduler(policy))
        r = simulate(d, ClosedLoop(8, Fixed(1024), Fixed(64)), AnalyticStepModel(cap), seed=0, requests=8).requests
        first_finish = r.finish.min()
        admitted[policy] = int((r.decode_admitted < first_finish).sum())
    assert admitted == {"sglang": 6, "vllm": 2}
