"""Speculative decoding as the frameworks run it: an EAGLE-3 draft model's own passes beside the target's verify,
the same in predict, serve and plan; the model's own MTP layer (NEXTN) stays the default."""

import json
import subprocess
import sys

import pytest

from npusim import api
from npusim.errors import NpusimError
from npusim.serving import ClosedLoop, Fixed
from npusim.serving.predicted import ServedPlan

QWEN = "workloads/models/hf/Qwen3-30B-A3B/config.json"
DRAFT = "workloads/models/hf/drafts/Qwen3-30B-A3B-EAGLE3/config.json"
PLAN = "workloads/plans/qwen3-30b-a3-sglang-mixed-tp2-eagle3.yaml"  # published.md S12
RUN = dict(hw="atlas-800-a3", model=QWEN, plan=PLAN, quant="w8a8", input=3500, output=1500, batch=64)
NONE = {"plan.mtp.depth": "0", "plan.mtp.acceptance": "0"}


def npusim(*args):
    return subprocess.run([sys.executable, "-m", "npusim.cli.main", *args], capture_output=True, text=True)


def test_an_eagle3_draft_runs_its_own_passes_and_weights():
    """Decode: the draft extends over the 1 + 3 verified tokens (with its fc) and runs 2 more single-token passes;
    the target verifies 4 tokens a sequence. Prefill: one draft extend over the prompt. The draft's BF16 weights
    (its layer, lm_head, the target-vocabulary embedding) are stored beside the target's."""
    spec = api.predict(**RUN)
    plain = api.predict(**RUN, overrides=NONE)
    layers = {lt.name: lt for lt in spec.decode.layers}
    assert layers["draft_extend"].repeat == 1 and layers["draft"].repeat == 2
    assert "draft_extend" in {lt.name for lt in spec.prefill.layers}
    extend = spec.breakdown("decode").query("layer == 'draft_extend'")
    assert {"draft_fc", "draft_qkv_embed", "qkv_proj", "attention", "lm_head"} <= set(extend.op)
    assert spec.decode_step > plain.decode_step  # verify 4 tokens and draft 3, per step
    assert spec.tpot < plain.tpot  # 3.17 tokens a step pay for it
    grown = spec.memory["decode"].weights - plain.memory["decode"].weights
    assert 0.5 * 2**30 < grown < 2 * 2**30  # ~0.6 GB embedding + layer + 32K-vocabulary head, BF16


def test_the_speculative_options_are_the_plan_fields_in_predict_serve_and_plan():
    base = ["--hw", "atlas-800-a3", "--model", QWEN, "--quant", "w8a8", "--input", "3500", "--output", "1500",
            "--batch", "64", "--format", "json"]
    by_plan = npusim("predict", *base, "--plan", PLAN)
    by_flags = npusim("predict", *base, "--plan", PLAN, "--set", "plan.mtp.depth=1", "--set", "plan.mtp.acceptance=0",
                      "--draft", DRAFT, "--spec-steps", "3", "--accept-length", "3.17", "--set", "plan.mtp.depth=3",
                      "--set", "plan.mtp.acceptance=2.17")
    assert by_plan.returncode == by_flags.returncode == 0, by_plan.stderr + by_flags.stderr
    assert json.loads(by_plan.stdout)["summary"] == json.loads(by_flags.stdout)["summary"]
    flags_only = npusim("predict", *base, "--plan", PLAN, "--draft", DRAFT, "--spec-steps", "3",
                        "--accept-length", "3.17")
    assert json.loads(flags_only.stdout)["summary"] == json.loads(by_plan.stdout)["summary"]
    low = npusim("predict", *base, "--plan", PLAN, "--accept-length", "0.5")
    assert low.returncode == 2 and "--accept-length" in low.stderr and "Traceback" not in low.stderr
    assert "--draft" in npusim("serve", "--help").stdout and "--accept-length" in npusim("plan", "--help").stdout
    refused = npusim("plan", "--model", QWEN, "--hw", "atlas-800-a3", "--draft", DRAFT, "--mtp", "0")
    assert refused.returncode == 2 and "--draft" in refused.stderr
    one_depth = npusim("plan", "--model", QWEN, "--hw", "atlas-800-a3", "--accept-length", "3", "--mtp", "1,3")
    assert one_depth.returncode == 2 and "one --mtp depth" in one_depth.stderr


def test_a_config_that_is_not_an_eagle3_draft_is_refused_by_name(tmp_path):
    with pytest.raises(NpusimError, match="architectures.*EAGLE-3"):
        api.predict(**RUN, overrides={"plan.mtp.draft": "workloads/models/hf/DeepSeek-V3.2/config.json"})
    with pytest.raises(NpusimError, match="mtp.draft.*not a draft"):
        api.predict(**RUN, overrides={"plan.mtp.draft": str(tmp_path / "missing.json")})
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 2048}))
    with pytest.raises(NpusimError, match="num_attention_heads"):
        api.predict(**RUN, overrides={"plan.mtp.draft": str(bad)})


def test_serving_with_a_draft_emits_its_accepted_tokens_at_the_draft_steps_cost():
    setup = api.load_setup(RUN["hw"], QWEN, PLAN, "w8a8")
    served = ServedPlan.of(setup, max_batch=8, token_budget=4096)
    result = served.run(ClosedLoop(2, Fixed(1024), Fixed(64)), requests=4)
    tokens = result.emissions[:, 1]
    assert result.summary.completed == 4 and tokens.max() == 4  # up to 1 + 3 drafts a step
    step = served.models["decode"].model.decode_time(2, 1100, 4)
    assert step > served.models["decode"].model.decode_time(2, 1100, 1)
