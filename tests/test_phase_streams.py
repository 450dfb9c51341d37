"""Streams per phase (prefill.streams / decode.streams over the plan-level streams) and decode-only plans."""

import pytest

from npusim import api
from npusim.planner.space import Layout, SearchSpace, plan_document
from npusim.spec.plan import load_plan

R1 = dict(hw="cloudmatrix384", model="deepseek-v3.1", input=2048, output=256, batch=256, quant="w8a8c8")
PD = "r1-a3-sglang-pd-tp2"  # a disaggregated plan with small instances


def test_phase_streams_lie_over_the_plan_level_ones():
    plan = load_plan(PD, {"streams.comm_overlap": "false", "prefill.streams.two_microbatch": "true"})
    pre, dec = plan.streams_of("prefill"), plan.streams_of("decode")
    assert pre.two_microbatch and not dec.two_microbatch
    assert not pre.comm_overlap and not dec.comm_overlap  # the plan-level switch reaches both phases
    assert pre.graph_mode and dec.graph_mode  # from the file's plan-level streams
    own = load_plan(PD, {"streams.comm_overlap": "false", "decode.streams.comm_overlap": "true"})
    assert own.streams_of("decode").comm_overlap and not own.streams_of("prefill").comm_overlap


def test_prefill_microbatches_leave_decode_alone():
    base = api.predict(plan=PD, **R1)
    pre = api.predict(plan=PD, **R1, overrides={"plan.prefill.streams.two_microbatch": "true"})
    both = api.predict(plan=PD, **R1, overrides={"plan.streams.two_microbatch": "true"})
    assert pre.decode_step == base.decode_step  # the decode step is the one-stream step, bit for bit
    assert pre.prefill.time == both.prefill.time != base.prefill.time
    assert both.decode_step != base.decode_step  # the plan-level flag still applies to both phases


def test_planner_writes_each_phase_its_own_streams():
    doc = plan_document(Layout(64, cp=64, two_microbatch=True), Layout(128, o_proj_tp=8))
    assert doc["prefill"]["streams"] == {"two_microbatch": True}
    assert doc["decode"]["streams"] == {"two_microbatch": False}
    assert "two_microbatch" not in doc["streams"]
    split = plan_document(None, Layout(128, two_microbatch=True, attention_cores=16))
    assert split["decode"]["streams"] == {"two_microbatch": True, "attention_cores": 16}
    space = SearchSpace(sizes=(16,), max_ranks=16, attention_tp=(1,), o_proj_tp=(1,), dense_tp=(1,), mtp_depths=(0,),
                        aic=24)
    assert {(x.two_microbatch, x.attention_cores) for x in space.decode_layouts()} == {(False, 0), (True, 0), (True, 16)}
    assert {x.attention_cores for x in space.prefill_layouts()} == {0}


def test_decode_only_plan_reports_no_ttft(cli):
    p = api.predict(plan="r1-a3-decode-a16", **R1)
    assert p.prefill is None and p.ttft is None and p.prefill_tokens_per_s_per_chip is None
    assert p.phases == ("decode",) and "prefill" not in p.memory
    assert "no prefill instance" in p.notes[0] and p.tpot > 0
    colocated = api.predict(plan="r1-a3-decode-a16", **R1, overrides={"plan.colocated": "true"})
    assert colocated.ttft > 0 and colocated.decode_step == p.decode_step
    r = cli("predict", "--hw", "cloudmatrix384", "--model", "deepseek-v3.1", "--plan", "r1-a3-decode-a16",
            "--input", "2048", "--batch", "256", "--quant", "w8a8c8", "--top", "2")
    assert r.returncode == 0, r.stderr
    assert "TTFT        none" in r.stdout and "no prefill instance" in r.stdout


def test_colocated_needs_one_instance(cli):
    r = cli("predict", "--plan", PD, "--hw", "cloudmatrix384", "--model", "deepseek-v3.1", "--set",
            "plan.colocated=true")
    assert r.returncode == 2 and "colocated" in r.stderr and "Traceback" not in r.stderr


def test_compare_a_decode_only_ladder_draws_tpot(cli, tmp_path):
    fig = tmp_path / "w.png"
    r = cli("compare", "r1-a16-decode-1-one-stream", "r1-a16-decode-3-core-split", "--figure", str(fig),
            "--format", "json")
    assert r.returncode == 0, r.stderr
    assert fig.exists() and fig.stat().st_size > 1000  # the waterfall of TPOT, the decode-only plan's metric
