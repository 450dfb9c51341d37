"""Attention-FFN disaggregation (npusim.parallel.af): the schedule, both sides' memory, the plan checks, the planner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import npusim
from npusim.api import load_setup
from npusim.errors import NpusimError
from npusim.parallel.af import af_step, schedule
from npusim.planner.af import af_plan, size_af
from npusim.spec.plan import load_plan

R1 = str(Path(__file__).resolve().parents[1] / "workloads" / "models" / "hf" / "DeepSeek-R1" / "config.json")


@pytest.fixture(scope="module")
def setup():
    return load_setup("cloudmatrix384", R1, "r1-a3-decode-af", "w8a8c8")


def test_schedule_pipelines_microbatches_through_both_sides():
    layers = [(1.0, 1.0, True)] * 4
    assert schedule(layers, 1, 0.5, 0.5) == pytest.approx(4 * 3.0)  # one microbatch: the sides take turns
    # two microbatches with equal sides and no transfer: each side busy 2 per layer, one attention pass to fill
    assert schedule(layers, 2, 0.0, 0.0) == pytest.approx(4 * 2.0 + 1.0)
    # transfers longer than the other microbatch's work show again
    assert schedule(layers, 2, 2.0, 2.0) > schedule(layers, 2, 0.0, 0.0)
    # a layer without experts never waits for the expert side
    assert schedule([(1.0, 0.0, False)] * 3, 2, 5.0, 5.0) == pytest.approx(6.0)
    # three attention domains on their own dies take turns on the experts: attention 2, experts 1 per domain keep
    # the experts always busy (3 x 1 per layer while each domain computes 2 and waits 1); the last domain's first
    # expert pass starts 2 later: 2 + 3 per layer + its own turn
    assert schedule([(2.0, 1.0, True)] * 4, 1, 0.0, 0.0, domains=3) == pytest.approx(2.0 + 4 * 3.0)
    assert schedule([(2.0, 1.0, True)] * 4, 1, 0.0, 0.0, domains=1) == pytest.approx(4 * 3.0)


def test_af_plan_predicts_with_both_sides(setup):
    p = npusim.predict("cloudmatrix384", R1, "r1-a3-decode-af", input=4096, output=1, batch=6144, context=4096,
                       quant="w8a8c8")
    af = p.af
    assert p.decode_step == af.time and p.decode_chips == 64
    assert af.time >= max(af.attention_busy, af.expert_busy)  # neither side can beat its own work
    assert af.a2e > 0 and af.e2a > af.a2e  # the combine carries BF16 rows, the dispatch INT8
    assert {"decode", "decode_experts"} <= set(p.memory)
    # an expert die holds 4 of 256 routed experts of the 58 MoE layers and the MTP layer, INT8, plus the shared
    # expert of every MoE layer: 3 x 7168 x 2048 weights each
    expert = 3 * 7168 * 2048
    assert af.expert_memory.weights == pytest.approx((59 * 4 + 58) * expert * 1.0, rel=0.02)
    assert af.expert_memory.kv_cache == 0.0
    assert af.attention_memory.kv_cache > 0


def test_microbatches_overlap_the_sides(setup):
    one = af_step(setup.model, af_plan(setup.plan, 64, 64, 1), setup.system, batch=6144, context=4096,
                  quant=setup.quant)
    two = af_step(setup.model, af_plan(setup.plan, 64, 64, 2), setup.system, batch=6144, context=4096,
                  quant=setup.quant)
    assert two.time < one.time
    assert two.attention_utilisation > one.attention_utilisation


def test_more_expert_dies_shorten_the_expert_side(setup):
    steps = [af_step(setup.model, af_plan(setup.plan, 128 - e, e, 2), setup.system, batch=6144, context=4096,
                     quant=setup.quant) for e in (32, 64)]
    assert steps[1].experts.time < steps[0].experts.time
    assert steps[1].attention.time > steps[0].attention.time  # and the fewer attention dies each hold more


def test_planner_sizes_the_two_sides(setup):
    splits = size_af(setup.model, setup.plan, setup.system, ranks=128, batch=6144, context=4096, quant=setup.quant,
                     microbatches=(2,))
    assert [s.expert_ranks for s in splits if s.step] and all(256 % s.expert_ranks == 0 for s in splits)
    times = [s.time for s in splits]
    assert times == sorted(times)
    assert any(s.step is None and "expert dies do not fit" in s.reason for s in splits)  # 2 dies: 128 experts each
    assert splits[0].expert_ranks + splits[0].attention_ranks == 128


@pytest.mark.parametrize("plan, override, words", [
    ("r1-a3-decode-af", {"decode.moe.ep": "32"}, ["decode.moe", "ffn_ranks (64)"]),
    ("r1-a3-prefill-a15", {"prefill.ffn_ranks": "32"}, ["prefill.ffn_ranks", "decode instance"]),
])
def test_af_plan_errors_name_the_field(plan, override, words):
    with pytest.raises(NpusimError) as err:
        load_plan(plan, override)
    for w in words:
        assert w in str(err.value)


def test_emitted_commands_say_af_is_not_expressible(setup):
    from npusim.results.launch import Limits, launch
    out = launch("sglang", setup.plan, setup.model, setup.quant, setup.system, Limits(input=4096, output=1024,
                                                                                        max_batch=8))
    assert any("ffn_ranks 64" in n and "attention-FFN" in n for n in out.notes)


def test_plan_af_cli_writes_the_fastest_split_and_predict_confirms_it(tmp_path):
    import subprocess
    import sys
    out = tmp_path / "af.yaml"
    base = [sys.executable, "-m", "npusim.cli.main"]
    run = subprocess.run(base + ["plan-af", "--model", R1, "--plan", "r1-a3-decode-a16", "--ranks", "64", "--batch",
                                 "2048", "--quant", "w8a8c8", "--microbatches", "2", "--domains", "1",
                                 "--format", "json", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    rows = [r for r in json.loads(run.stdout)["rows"] if not r["refused"]]
    assert rows[0]["step_ms"] == min(r["step_ms"] for r in rows)
    p = npusim.predict("cloudmatrix384", R1, str(out), input=4096, output=1, batch=2048, context=4096,
                       quant="w8a8c8")
    assert p.decode_step * 1e3 == pytest.approx(rows[0]["step_ms"], rel=1e-9)
    assert p.decode_chips == 32
    bad = subprocess.run(base + ["plan-af", "--ranks", "1"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--ranks" in bad.stderr and "Traceback" not in bad.stderr


def test_serving_times_an_af_decode_pool_with_the_af_schedule(tmp_path, setup):
    from npusim.serving.predicted import EngineStepModel, ServedPlan, engine_capacity
    from npusim.serving import Fixed, OpenLoop
    with pytest.raises(NpusimError, match="decode.ffn_ranks"):
        ServedPlan.of(setup)  # decode-only: nothing prefills
    plan = tmp_path / "pd-af.yaml"
    plan.write_text("inherits: r1-a3-decode-af\nprefill:\n  ranks: 32\n  attention: {dp: 32}\n  moe: {ep: 32}\n")
    pd = load_setup("cloudmatrix384", R1, str(plan), "w8a8c8")
    cap = engine_capacity(pd, ("decode",), max_batch=16)
    model = EngineStepModel(pd, cap)
    ours = model.decode_time(16, 4096, tokens_per_seq=2)
    direct = af_step(pd.model, pd.plan, pd.system, batch=16 * 64, context=4096, quant=pd.quant).time
    assert ours == direct
    served = ServedPlan.of(pd, max_batch=16, points_per_octave=1)
    r = served.run(OpenLoop(rate=20.0, input=Fixed(1024), output=Fixed(8)), requests=16, seed=0)
    assert r.summary.completed == 16
