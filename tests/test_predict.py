"""End-to-end prediction: the bundled default, what-if directions, memory refusal, bad plans, determinism."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim import api
from npusim.errors import NpusimError

# A small, fast deployment: V3.1-shaped R1 decode on CloudMatrix384 (no indexer kernels needed), its one instance
# also prefilling (co-located) so that TTFT is predicted too.
SMALL = dict(hw="cloudmatrix384", model="deepseek-v3.1", plan="r1-a3-decode-a16", input=4096, output=256,
             batch=1024, quant="w8a8c8")
COLOCATED = {"plan.colocated": "true"}


@pytest.fixture(scope="module")
def small():
    return api.predict(**SMALL, overrides=COLOCATED)


def test_prediction_is_consistent(small):
    assert small.ttft > 0 and small.tpot > 0
    assert small.tpot == pytest.approx(small.decode_step / (1 + 0.7))  # MTP1 accepting 0.7 (published convention)
    assert small.tokens_per_s_per_chip == pytest.approx(1024 / small.tpot / 64)
    for phase in ("prefill", "decode"):
        step = getattr(small, phase)
        assert step.time >= max(lt.time for lt in step.layers)
        assert small.memory[phase].fits
    frame = small.breakdown("decode")
    assert frame["share_pct"].sum() == pytest.approx(100.0)
    assert {"engine", "collective"} <= set(frame["model"])


def test_identical_inputs_give_identical_outputs(small):
    assert api.predict(**SMALL, overrides=COLOCATED).to_json() == small.to_json()


@pytest.mark.parametrize("key,low,high", [
    ("hbm.bandwidth", "1.2TB/s", "3.2TB/s"),
    ("tiers.ub.bandwidth", "100GB/s", "400GB/s"),
    ("aic.count", "16", "24"),
    ("clock", "1.2GHz", "1.85GHz"),
])
def test_more_hardware_is_never_slower(key, low, high):
    slow = api.predict(**SMALL, overrides={key: low, **COLOCATED})
    fast = api.predict(**SMALL, overrides={key: high, **COLOCATED})
    assert fast.tpot <= slow.tpot * (1 + 1e-9)
    assert fast.ttft <= slow.ttft * (1 + 1e-9)


@settings(max_examples=6, deadline=None)
@given(st.floats(0.5, 4.0))
def test_hbm_bandwidth_monotone(scale):
    base = api.predict(**SMALL, overrides={"hbm.bandwidth": f"{1.6 * scale}TB/s"})
    more = api.predict(**SMALL, overrides={"hbm.bandwidth": f"{1.6 * scale * 1.5}TB/s"})
    assert more.decode_step <= base.decode_step * (1 + 1e-9)


def test_plan_overrides_flow_through():
    fewer = api.predict(**{**SMALL, "batch": 512})
    assert fewer.decode_step < api.predict(**SMALL).decode_step
    no_overlap = api.predict(**SMALL, overrides={"plan.streams.comm_overlap": "false"})
    assert no_overlap.decode.exposed_comm >= api.predict(**SMALL).decode.exposed_comm


def test_configuration_that_does_not_fit_is_refused():
    with pytest.raises(NpusimError, match="does not fit in HBM"):
        api.predict(**{**SMALL, "batch": 200000})


def test_plan_that_does_not_divide_the_model_is_refused():
    with pytest.raises(NpusimError, match="does not divide"):
        api.predict(**SMALL, overrides={"plan.decode.attention.tp": "3", "plan.decode.attention.dp": "1",
                                        "plan.decode.ranks": "3", "plan.decode.moe.ep": "3"})


def test_cli_default_main_job(cli):
    r = cli("predict", "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["model"] == "deepseek-v3.2-exp" and out["system"] == "cloudmatrix384" and out["quant"] == "bf16"
    assert out["summary"]["ttft_s"] > 0 and out["summary"]["tpot_s"] > 0
    assert {row["phase"] for row in out["phases"]} == {"prefill", "decode"}


def test_cli_trace_and_table(cli, tmp_path):
    trace = tmp_path / "t.json"
    args = ["predict", "--hw", SMALL["hw"], "--model", SMALL["model"], "--plan", SMALL["plan"], "--input", "4096",
            "--batch", "1024", "--quant", "w8a8c8", "--trace", trace]
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert "TTFT" in r.stdout and "TPOT" in r.stdout and "top 12 ops" in r.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["args"]["name"] for e in events if e["name"] == "thread_name"} >= {"compute", "comm"}


@pytest.mark.parametrize("args,needle", [
    (["--batch", "0"], "--batch"),
    (["--model", "deepseek-v9"], "unknown model 'deepseek-v9'"),
    (["--hw", "cloudmatrix385"], "did you mean 'cloudmatrix384'"),
    (["--plan", "nope"], "unknown plan 'nope'"),
    (["--quant", "int3"], "unknown quantisation 'int3'"),
    (["--set", "plan.decode.moe.ep=3"], "decode.moe"),
    (["--batch", "100000"], "does not fit in HBM"),
])
def test_cli_bad_input(cli, args, needle):
    r = cli("predict", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert needle in r.stderr, r.stderr
