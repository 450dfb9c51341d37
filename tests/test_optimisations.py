"""Each optimisation switch moves the prediction the expected way, through the mechanism it acts on."""

import dataclasses

import pytest

from npusim.api import load_setup, predict
from npusim.errors import NpusimError
from npusim.parallel.fusion import placements
from npusim.parallel.optime import OpRun, op_time
from npusim.parallel.shard import shard
from npusim.parallel.step import layer_time
from npusim.results.energy import full_load_power
from npusim.spec.chip import CHIPS, load_chip
from npusim.spec.plan import Fusion, KernelOptions, PrefillAttention

SMALL = dict(hw="cloudmatrix384", model="deepseek-v3.2-exp", plan="v32-a3-pd-a17", input=8192, output=128, batch=128)


@pytest.fixture(scope="module")
def setup():
    return load_setup("cloudmatrix384", "deepseek-v3.2-exp", "v32-a3-pd-a17", "bf16")


@pytest.fixture(scope="module")
def moe_layer(setup):
    step = shard(setup.model, setup.plan, "prefill", batch=1, length=8192, quant=setup.quant)
    return next(lay for lay in step.layers if lay.name == "dsa-moe")


def _op(layer, name):
    return next(o for o in layer.ops if o.name == name)


def test_fusion_keeps_intermediates_on_chip_and_launches_once(setup, moe_layer):
    chip = setup.system.chip_spec
    q_b = _op(moe_layer, "q_b_proj")
    alone, fused = op_time(q_b, chip, OpRun("eager")), op_time(q_b, chip, OpRun("none", input_on_chip=True))
    assert fused.activity.hbm_bytes < alone.activity.hbm_bytes
    assert fused.activity.l2_bytes == alone.activity.l2_bytes  # every GM read crosses L2 either way
    assert fused.time < alone.time
    place = placements([o.name for o in moe_layer.ops], Fusion(mla_prolog=True))
    assert place["attn_norm"].first and not place["q_a_proj"].first and place["q_a_proj"].input_on_chip
    assert not place["kv_cache_update"].output_on_chip  # the cache is persistent state: written to HBM
    plan = setup.plan
    fused_plan = dataclasses.replace(plan, fusion=Fusion(mla_prolog=True, indexer_prolog=True),
                                     streams=dataclasses.replace(plan.streams, graph_mode=False))
    eager = dataclasses.replace(plan, streams=fused_plan.streams)
    a, b = layer_time(moe_layer, eager, setup.system), layer_time(moe_layer, fused_plan, setup.system)
    assert b.activity.hbm_bytes < a.activity.hbm_bytes
    assert b.time < a.time


def test_unfused_topk_adds_a_score_round_trip(setup, moe_layer):
    plan = dataclasses.replace(setup.plan, fusion=Fusion(li_topk=False))
    a, b = layer_time(moe_layer, setup.plan, setup.system), layer_time(moe_layer, plan, setup.system)
    assert "indexer_topk" in [t.op for t in b.ops] and "indexer_topk" not in [t.op for t in a.ops]
    assert b.activity.hbm_bytes > a.activity.hbm_bytes and b.time > a.time


@pytest.mark.parametrize("name", ["q_b_proj", "attn_norm", "experts_gate_up"])
def test_single_buffering_is_never_faster(setup, moe_layer, name):
    chip, op = setup.system.chip_spec, _op(moe_layer, name)
    double = op_time(op, chip, OpRun(options=KernelOptions(buffering=2)))
    single = op_time(op, chip, OpRun(options=KernelOptions(buffering=1)))
    assert single.time >= double.time


def test_tiling_that_does_not_fit_is_refused(setup, moe_layer):
    chip = setup.system.chip_spec
    with pytest.raises(NpusimError, match="KiB too many"):
        op_time(_op(moe_layer, "lightning_indexer"), chip, OpRun(options=KernelOptions(buffering=3)))
    with pytest.raises(NpusimError, match="no option 'block_m'"):
        op_time(_op(moe_layer, "q_b_proj"), chip, OpRun(options=KernelOptions(block_m=64)))
    with pytest.raises(NpusimError, match="released in pairs"):
        op_time(_op(moe_layer, "attention"), chip, OpRun(options=KernelOptions(buffering=1)))


def test_tile_options_reach_the_kernel(setup, moe_layer):
    chip, op = setup.system.chip_spec, _op(moe_layer, "attention")
    default = op_time(op, chip)
    other = op_time(op, chip, OpRun(options=KernelOptions(block_m=256)))
    assert other.time != default.time


def test_chunked_prefill_attends_to_the_cached_prefix():
    one = predict(**{**SMALL, "input": 32768})
    chunked = predict(**{**SMALL, "input": 32768}, overrides={"plan.prefill_chunk": "8192"})
    assert len(chunked.prefill.layers) == 4 * len(one.prefill.layers)
    assert chunked.memory["prefill"].activations < one.memory["prefill"].activations
    # the same causal query-key pairs: the indexer's work is split, not repeated
    pairs = lambda p: sum(t.activity.cube_flops * lt.repeat for lt in p.prefill.layers for t in lt.ops  # noqa: E731
                          if t.kind == "lightning_indexer")
    assert pairs(chunked) == pytest.approx(pairs(one), rel=0.1)
    assert chunked.tpot == one.tpot


def _dsa_ops(p) -> dict[str, str]:
    """Op name -> kernel kind of the prefill's DSA MoE layer (the last chunk's when chunked)."""
    return {t.op: t.kind for lt in p.prefill.layers if lt.name.endswith("dsa-moe") for t in lt.ops}


def test_dense_prefill_below_topk_skips_the_indexer_scoring():
    no_cp = {"plan.prefill.attention.cp": "1", "plan.prefill.attention.dp": "64"}
    sparse, dense = (predict(**{**SMALL, "input": 1024}, overrides={**no_cp, "plan.prefill_attention.kernel": k})
                     for k in ("sparse", "dense"))
    s, d = _dsa_ops(sparse), _dsa_ops(dense)
    assert s["attention"] == "sparse_flash_attention" and "lightning_indexer" in s
    assert d["attention"] == "flash_attention" and "kv_b_proj" in d
    assert not {"lightning_indexer", "idx_q_b_proj", "idx_weights_proj"} & d.keys()
    assert {"idx_k_proj", "indexer_cache_update"} <= d.keys()  # decode still needs the indexer's keys
    assert dense.ttft < sparse.ttft and dense.tpot == sparse.tpot
    long = predict(**{**SMALL, "input": 65536}, overrides={"plan.prefill_attention.kernel": "auto"})
    assert "lightning_indexer" in _dsa_ops(long)


def test_dense_prefill_threshold_counts_the_cached_prefix(setup):
    plan = dataclasses.replace(setup.plan, prefill_attention=PrefillAttention(kernel="auto"))
    kinds = [next(o.kind for lay in shard(setup.model, plan, "prefill", batch=1, length=1024, quant=setup.quant,
                                          cached=cached).layers for o in lay.ops if o.name == "attention")
             for cached in (0, 1024)]
    assert kinds == ["flash_attention", "sparse_flash_attention"]
    # under CP every rank up-projects the keys of the whole gathered prompt, not only its own tokens
    step = shard(setup.model, plan, "prefill", batch=1, length=1024, quant=setup.quant)
    ops = {o.name: o for lay in step.layers if lay.name == "dsa-moe" for o in lay.ops}
    assert ops["kv_b_proj"].shape["m"] == 1024 and ops["attention"].shape["tokens"] == 1024 // 64
    with pytest.raises(NpusimError, match="prefill_attention.kernel.*'flash' is not allowed"):
        load_setup(overrides={"plan.prefill_attention.kernel": "flash"})


def test_ring_cp_overlaps_the_kv_exchange():
    gather = predict(**SMALL)
    ring = predict(**SMALL, overrides={"plan.prefill.attention.cp_mode": "ring"})
    assert ring.prefill.exposed_comm < gather.prefill.exposed_comm
    assert ring.ttft <= gather.ttft


def test_core_partition_runs_kernels_on_their_cores(setup, moe_layer):
    plan = dataclasses.replace(setup.plan, streams=dataclasses.replace(setup.plan.streams, attention_cores=16,
                                                                        two_microbatch=True))
    lt = layer_time(moe_layer, plan, setup.system)
    spans = {s.task.name: s.task for s in lt.timeline.spans}
    assert spans["mb0.attention"].units == 16 and spans["mb0.attention"].stream == "attn"
    assert spans["mb0.experts_gate_up"].units == 8 and spans["mb0.experts_gate_up"].stream == "ffn"
    chip = setup.system.chip_spec
    op = _op(moe_layer, "attention")
    assert op_time(op, chip, OpRun(cores=16)).time > op_time(op, chip).time
    with pytest.raises(NpusimError, match="partition"):
        op_time(op, chip, OpRun(cores=chip.aic.count + 1))


def test_graph_mode_and_kv_offload():
    base = predict(**SMALL)
    eager = predict(**SMALL, overrides={"plan.streams.graph_mode": "false"})
    assert eager.tpot > base.tpot
    off = predict(**SMALL, overrides={"plan.kv_offload.enabled": "true"})
    reuse = predict(**SMALL, overrides={"plan.kv_offload.enabled": "true", "plan.kv_offload.reuse": "0.9"})
    assert off.memory["decode"].kv_cache < base.memory["decode"].kv_cache
    assert off.decode.host_bytes > reuse.decode.host_bytes > 0
    assert off.tpot >= reuse.tpot >= base.tpot


@pytest.mark.parametrize("name", CHIPS.names())
def test_energy_at_full_load_is_the_tdp(name):
    chip = load_chip(name)
    assert full_load_power(chip) == pytest.approx(chip.power.tdp, rel=1e-9)


def test_950_energy_is_its_own():
    """950PR and 950DT are one die with different HBM: the same joules per FLOP and per on-die byte, and each HBM's
    energy per bit in the range of stacked DRAM; no 950 source is 910B2's (HBM2e at 1.6 TB/s, 48 AIV)."""
    from npusim.results.energy import rates
    pr, dt = rates(load_chip("950pr")), rates(load_chip("950dt"))
    for unit in ("cube_flop", "vector_flop", "l2_byte", "core_byte"):
        assert getattr(dt, unit) == pytest.approx(getattr(pr, unit), rel=0.01), unit
    for r in (pr, dt):
        assert 3.0 < r.hbm_byte / 8 * 1e12 < 6.0  # pJ per bit
    for name in ("950pr", "950dt"):
        sources = {k: v for k, v in load_chip(name).provenance.sources.items() if k.startswith("energy.")}
        assert len(sources) == 6 and not any("48 AIV" in v or "HBM2e access" in v for v in sources.values())


def test_energy_in_predictions():
    p = predict(**SMALL)
    for phase in ("prefill", "decode"):
        assert p.joules_per_token[phase] > 0
        e = p.energy[phase]
        chip = load_chip("910c")
        assert chip.power.idle < e.watts < chip.power.tdp
        assert 0 < p.tflops_per_watt(phase) < chip.peak_cube_flops("bf16") / chip.power.tdp / 1e12
    assert "prefill_joules_per_token" in p.summary()


def test_compare_cli_end_to_end(cli, tmp_path):
    d = tmp_path / "scenarios"
    d.mkdir()
    (d / "base.yaml").write_text("input: 8192\noutput: 128\nbatch: 128\nset: {plan.fusion.li_topk: false}\n")
    (d / "fused.yaml").write_text("input: 8192\noutput: 128\nbatch: 128\nlabel: fused\n"
                                  "set: {plan.fusion.li_topk: true, plan.fusion.mla_prolog: true}\n")
    fig = tmp_path / "wf.png"
    r = cli("compare", d / "base.yaml", d / "fused.yaml", "--figure", fig, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert fig.exists() and fig.stat().st_size > 1000
    import json

    rows = json.loads(r.stdout)["rows"]
    assert [row["scenario"] for row in rows] == ["base", "fused"]
    assert rows[1]["TTFT_ms"] < rows[0]["TTFT_ms"]
    bad = cli("compare", d / "base.yaml", d / "nope.yaml", "--figure", "")
    assert bad.returncode == 2 and "no such scenario file" in bad.stderr
