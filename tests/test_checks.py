"""npusim check: the shipped baseline passes; a changed hardware number drifts until --update; measured files."""

import json
import shutil

import pytest

from npusim.spec.catalog import data_root

BASELINE = data_root() / "workloads" / "baselines" / "default.yaml"


def test_shipped_baseline_passes(cli):
    r = cli("check", BASELINE)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "within tolerance" in r.stdout


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A copy of the data files with one small baseline scenario, as NPUSIM_HOME for the CLI."""
    for d in ("hardware", "workloads"):
        shutil.copytree(data_root() / d, tmp_path / d)
    base = tmp_path / "b.yaml"
    base.write_text("scenarios:\n  v4:\n    run: {hw: atlas-950-superpod, model: deepseek-v4-flash, "
                    "plan: v4flash-950dt-a23, input: 2048, output: 256, batch: 64, quant: model}\n")
    monkeypatch.setenv("NPUSIM_HOME", str(tmp_path))
    return tmp_path, base


def test_hardware_change_drifts_until_update(cli, tree):
    home, base = tree
    r = cli("check", base)
    assert r.returncode == 1 and "new" in r.stdout  # nothing recorded yet
    assert cli("check", base, "--update").returncode == 0
    assert cli("check", base).returncode == 0
    chip = home / "hardware" / "chips" / "950dt.yaml"
    chip.write_text(chip.read_text().replace("bandwidth: {value: 4.0 TB/s", "bandwidth: {value: 2.0 TB/s"))
    r = cli("check", base, "--format", "json")
    assert r.returncode == 1 and "DRIFT" in r.stdout and "--update" in r.stderr
    rows = {row["metric"]: row for row in json.loads(r.stdout)["rows"]}
    assert rows["tpot_s"]["predicted"] > rows["tpot_s"]["baseline"]  # less HBM bandwidth, slower decode
    assert cli("check", base, "--update").returncode == 0
    assert cli("check", base).returncode == 0


@pytest.mark.parametrize("body, needle", [
    ("scenarios: {}\n", "field 'scenarios'"),
    ("scenarios:\n  a: {run: {hw: cloudmatrix384, speed: 3}}\n", "field 'scenarios.a.run.speed'"),
    ("scenarios:\n  a: {run: {hw: cloudmatrix384}, expect: {latency: 1}}\n", "unknown metric 'latency'"),
    ("tolerance: {tpot_s: fast}\nscenarios:\n  a: {run: {hw: cloudmatrix384}}\n", "field 'tolerance.tpot_s'"),
])
def test_bad_baseline_is_one_sentence(cli, tmp_path, body, needle):
    f = tmp_path / "b.yaml"
    f.write_text(body)
    r = cli("check", f)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_update_refuses_set_and_unrunnable_scenarios(cli, tmp_path):
    f = tmp_path / "b.yaml"
    f.write_text("scenarios:\n  a: {run: {hw: cloudmatrix384, plan: v32-a3-pd-a17, input: 1024, output: 64, "
                 "batch: 8}, set: {plan.decode.moe.ep: 3}}\n")
    r = cli("check", f, "--update", "--set", "hbm.bandwidth=2TB/s")
    assert r.returncode == 2 and "--set" in r.stderr
    r = cli("check", f, "--update")
    assert r.returncode == 2 and "scenarios.a" in r.stderr and "Traceback" not in r.stderr


def test_vllm_bench_serve_json(cli, tmp_path):
    result = {"backend": "vllm", "completed": 10, "num_prompts": 10, "max_concurrency": 16,
              "total_input_tokens": 20480, "total_output_tokens": 1280, "median_ttft_ms": 900.0,
              "median_tpot_ms": 40.0, "mean_ttft_ms": 950.0, "mean_tpot_ms": 41.0}
    f = tmp_path / "bench.json"
    f.write_text(json.dumps(result))
    r = cli("check", f, "--hw", "atlas-950-superpod", "--model", "deepseek-v4-flash", "--plan", "v4flash-950dt-a23",
            "--quant", "mxfp8-mxfp4", "--format", "json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)["rows"][0]
    assert (row["input"], row["output"], row["batch"]) == (2048, 128, 16)
    assert row["tpot_ms_measured"] == 40.0 and row["tpot_error_pct"] == pytest.approx(
        100 * (row["tpot_ms_predicted"] / 40.0 - 1), abs=0.02)


def test_measured_csv(cli, tmp_path):
    f = tmp_path / "m.csv"
    f.write_text("name,hw,plan,model,quant,input,output,batch,ttft_ms,tpot_ms\n"
                 "a23-256,atlas-950-superpod,v4flash-950dt-a23,deepseek-v4-flash,mxfp8-mxfp4,8192,1024,256,,8.78\n"
                 "bad,atlas-950-superpod,v4flash-950dt-a23,deepseek-v4-flash,mxfp8-mxfp4,8192,1024,256,1000,x\n")
    r = cli("check", f)
    assert r.returncode == 2 and "Traceback" not in r.stderr  # 'x' is not a time
    f.write_text("name,hw,plan,model,quant,input,output,batch,ttft_ms,tpot_ms\n"
                 "a23-256,atlas-950-superpod,v4flash-950dt-a23,deepseek-v4-flash,mxfp8-mxfp4,8192,1024,256,1000,8.78\n")
    r = cli("check", f, "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert "tpot_error_pct" in r.stdout.splitlines()[0] and "a23-256" in r.stdout


@pytest.mark.parametrize("content, needle", [("{}", "completed"), ("[1]", "not a JSON object"), ("{", "valid JSON")])
def test_bad_measured_json(cli, tmp_path, content, needle):
    f = tmp_path / "x.json"
    f.write_text(content)
    r = cli("check", f)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_check_names_memory_in_the_readmes_units(cli, tmp_path):
    """Issue 29 item 5: the drift table's memory metrics use the README's unit suffix `_GiB`, not `_gib`."""
    base = tmp_path / "b.yaml"
    base.write_text("scenarios:\n  v4:\n    run: {hw: atlas-950-superpod, model: deepseek-v4-flash, "
                    "plan: v4flash-950dt-a23, input: 2048, output: 256, batch: 64, quant: model}\n")
    r = cli("check", base, "--format", "json")
    metrics = [row["metric"] for row in json.loads(r.stdout)["rows"]]
    assert "decode_memory_GiB" in metrics, metrics  # the A23 plan is decode-only: no prefill memory
    assert not any(m.endswith("_gib") for m in metrics)
