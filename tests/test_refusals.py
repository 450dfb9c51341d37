"""Bad input is refused in one sentence naming the file and the field as the user wrote them, exit 2 — never a
traceback and never a silently wrong answer (issue 15 items 1-3). Each case is a class of input that once gave a
traceback, an acceptance or a wrong name. The CLI runs in this process (`refusal.run`), so the cases are cheap."""

import json

import pytest

from refusal import assert_refused, run

V4_JSON = None  # the HF config of test_models_spec, loaded lazily


def _hf(tmp_path, **changes):
    from test_models_spec import V4_FLASH_HF
    folder = tmp_path / "DeepSeek-V4-Flash"
    folder.mkdir(exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps({**V4_FLASH_HF, **changes}))
    return str(path)


def _file(tmp_path, name, body):
    path = tmp_path / name
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    return str(path)


SMALL = ("--input", "4096", "--output", "64", "--batch", "8")

# ------------------------------------------------------------------------------------ 1. no traceback from input


@pytest.mark.parametrize("argv, needles", [
    (("hw", "show", "910b2", "--set", "hbm.bandwidth='"), ["--set hbm.bandwidth", "not valid YAML"]),
    (("predict", *SMALL, "--set", "plan.decode.moe.ep=[1"), ["--set plan.decode.moe.ep", "not valid YAML"]),
    (("model", "show", "deepseek-v3.1", "--set", "hidden_size={"), ["--set hidden_size", "not valid YAML"]),
])
def test_override_that_is_not_yaml(argv, needles):
    assert_refused(run(*argv), *needles)


@pytest.mark.parametrize("kind", ["scenario", "baseline", "sweep"])
def test_override_in_a_file_that_is_not_yaml_names_the_file(tmp_path, kind):
    bodies = {
        "scenario": ("compare", "name: s\ninput: 4096\nbatch: 8\nset: {hbm.bandwidth: \"'\"}\n", "set.hbm.bandwidth"),
        "baseline": ("check", "scenarios:\n  a:\n    run: {input: 4096, batch: 8}\n    set: {hbm.bandwidth: \"'\"}\n",
                     "scenarios.a.set.hbm.bandwidth"),
        "sweep": ("sweep", "name: s\nbase: {input: 4096, batch: 8}\ngrid: {hbm.bandwidth: [\"'\"]}\n",
                  "grid.hbm.bandwidth"),
    }
    command, body, field = bodies[kind]
    f = _file(tmp_path, f"{kind}.yaml", body)
    argv = (command, f, f) if command == "compare" else (command, f)
    if command == "sweep":
        argv += ("--workers", "1", "--cache", "off", "--no-figures", "--out", str(tmp_path / "out"))
    assert_refused(run(*argv), f, f"field '{field}'", "not valid YAML")


FILE_KINDS = {  # how each file type reaches the CLI
    "chip": lambda f: ("hw", "show", f), "plan": lambda f: ("predict", "--plan", f),
    "model": lambda f: ("model", "show", f), "scenario": lambda f: ("compare", f, f),
    "baseline": lambda f: ("check", f), "sweep": lambda f: ("sweep", f, "--cache", "off"),
    "system": lambda f: ("hw", "show", f),
}


@pytest.mark.parametrize("kind", sorted(FILE_KINDS))
@pytest.mark.parametrize("body, needle", [
    (b"name: x\nlabel: \xff\xfe\n", "not UTF-8"),
    (b"a: " + b"[" * 3000 + b"]" * 3000 + b"\n", "nested too deeply"),
    (b"", "must be a YAML mapping"),
    (b"[1, 2]\n", "must be a YAML mapping"),
], ids=["not-utf8", "deep", "empty", "list"])
def test_unreadable_files(tmp_path, kind, body, needle):
    folder = tmp_path / ("chips" if kind == "chip" else "systems" if kind == "system" else "files")
    folder.mkdir()
    f = _file(folder, f"{kind}.yaml", body)
    assert_refused(run(*FILE_KINDS[kind](f)), f, needle)


@pytest.mark.parametrize("body, needle", [
    (b'{"hidden_size": "\xff"}', "not UTF-8"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    (b"", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
], ids=["not-utf8", "deep", "empty", "list"])
@pytest.mark.parametrize("command", ["model", "check"])
def test_unreadable_json(tmp_path, body, needle, command):
    f = _file(tmp_path, "config.json", body)
    argv = ("model", "show", f) if command == "model" else ("check", f)
    assert_refused(run(*argv), f, needle)


def test_hf_quantization_config_that_is_not_a_mapping(tmp_path):
    f = _hf(tmp_path, quantization_config="fp8")
    assert_refused(run("model", "show", f), f, "field 'quantization_config'", "JSON object")


def test_chip_missing_a_dtype_rate(bad_chip):
    text = open("hardware/chips/910b2.yaml").read()
    f = bad_chip(text.replace("      bf16: 8192\n", "", 1), "nobf16")
    for argv in (("hw", "show", f), ("kernel", "sim", "gemm", "--hw", f, "--shape", "m=256,n=256,k=256,dtype=bf16")):
        assert_refused(run(*argv), f, "field 'aic.cube.flop_per_cycle.bf16'")


def test_sweep_value_of_the_wrong_type(tmp_path):
    f = _file(tmp_path, "s.yaml", "name: s\nbase: {hw: 384}\n")
    assert_refused(run("sweep", f, "--cache", "off"), f, "field 'base.hw'", "must be a name")


# ------------------------------------------------------------------------------------ 2. no silent wrong answer


@pytest.mark.parametrize("override, field", [
    ("hbm.bandwidth=.nan", "hbm.bandwidth"), ("tiers.ub.bandwidth=.nan", "tiers.ub.bandwidth"),
    ("hbm.bandwidth=.inf", "hbm.bandwidth"), ("l2.size=-.inf", "l2.size"),
    ("efficiency.cube=.nan", "efficiency.cube"), ("plan.kv_offload.reuse=.nan", "plan.kv_offload.reuse"),
])
def test_nan_and_infinity_are_refused(override, field):
    assert_refused(run("predict", *SMALL, "--set", override), f"--set {field}")


def test_bare_number_where_a_unit_is_required():
    assert_refused(run("predict", *SMALL, "--set", "hbm.bandwidth=2"), "--set hbm.bandwidth", "no unit")
    assert run("predict", *SMALL, "--set", "efficiency.cube=0.5").returncode == 0  # a plain number stays plain


def test_unknown_kernel_under_plan_kernels():
    r = run("predict", *SMALL, "--set", "plan.kernels.gemmm.base_m=128")
    assert_refused(r, "--set plan.kernels.gemmm", "is not a kernel", "did you mean 'gemm'")


def test_attention_cores_equal_to_the_core_count():
    assert_refused(run("predict", *SMALL, "--set", "plan.streams.attention_cores=24"),
                   "--set plan.streams.attention_cores", "must leave cores")


def test_sweep_in_which_every_point_failed_exits_2_and_each_row_says_why(tmp_path):
    f = _file(tmp_path, "s.yaml", "name: s\nbase: {input: 4096, batch: 8}\ngrid: {hbm.bandwidth: [-1TB/s, 0TB/s]}\n")
    out = tmp_path / "out"
    r = run("sweep", f, "--cache", "off", "--workers", "1", "--no-figures", "--out", out)
    assert_refused(r, f, "every one of its 2 points was refused", "grid.hbm.bandwidth")
    import pandas as pd
    rows = pd.read_csv(out / "s.csv")
    assert rows["error"].str.contains("field 'grid.hbm.bandwidth': must be > 0").all()


# ------------------------------------------------------------------------------------ 3. exit codes and names


def test_bad_baseline_exits_2_not_drift(tmp_path):
    f = _file(tmp_path, "b.yaml", "scenarios:\n  a:\n    run: {input: 4096, batch: 8}\n"
                                  "    set: {plan.decode.moe.ep: 3}\n    expect: {ttft_s: 1.0}\n")
    assert_refused(run("check", f), f, "field 'scenarios.a.set.plan.decode.moe'", "ep x tp = 3x1")


def test_plan_override_names_the_plan_field():
    assert_refused(run("predict", *SMALL, "--set", "plan.kernels.gemm.base_m=7"), "--set plan.kernels.gemm.base_m",
                   "base_m=7")


def test_plan_file_option_names_the_plan_file(tmp_path):
    text = open("workloads/plans/v32-a3-pd-a17.yaml").read()
    f = _file(tmp_path, "p.yaml", text + "\nkernels: {gemm: {base_m: 7}}\n")
    assert_refused(run("predict", *SMALL, "--plan", f), f, "field 'kernels.gemm.base_m'")


def test_input_beyond_the_model_names_input():
    r = run("predict", "--input", "2000000")
    assert_refused(r, "--input:", "max_position_embeddings")
    assert "--seq-len" not in r.stderr


@pytest.mark.parametrize("kind", ["scenario", "baseline", "sweep"])
def test_input_in_a_file_is_named_as_the_file_writes_it(tmp_path, kind):
    if kind == "scenario":
        f = _file(tmp_path, "s.yaml", "name: s\ninput: 2000000\n")
        argv, field = ("compare", f, f), "input"
    elif kind == "baseline":
        f = _file(tmp_path, "b.yaml", "scenarios:\n  a:\n    run: {input: 2000000}\n")
        argv, field = ("check", f), "scenarios.a.run.input"
    else:
        f = _file(tmp_path, "w.yaml", "name: w\ngrid: {input: [2000000]}\n")
        argv = ("sweep", f, "--cache", "off", "--workers", "1", "--no-figures", "--out", tmp_path / "out")
        field = "grid.input"
    assert_refused(run(*argv), f, f"field '{field}'", "max_position_embeddings")


@pytest.mark.parametrize("name, far", [("memory", "energy"), ("cache", "arch")])
def test_did_you_mean_only_close_names(name, far):
    r = run("hw", "show", "910b2", "--set", f"{name}=1")
    assert_refused(r, f"--set {name}: is not a known field")
    assert far not in r.stderr.split("is not a known field")[1].split(";")[0]
    assert_refused(run("hw", "show", "910b2", "--set", "clocks=1GHz"), "did you mean 'clock'")
    assert_refused(run("predict", *SMALL, "--set", "plan.decode.moee.ep=8"), "--set plan.decode.moee:",
                   "did you mean 'moe'")


# ------------------------------------------------------------------------------------ 1. `npusim check` inputs

VLLM = {"completed": 10, "total_input_tokens": 40960, "total_output_tokens": 640, "median_ttft_ms": 500.0,
        "median_tpot_ms": 40.0}


@pytest.mark.parametrize("field, value", [
    ("completed", "ten"), ("total_input_tokens", None), ("total_input_tokens", [1]), ("median_ttft_ms", float("nan")),
    ("median_ttft_ms", float("inf")), ("median_ttft_ms", -5), ("median_tpot_ms", 0), ("max_concurrency", "x"),
    ("completed", 2.5), ("total_output_tokens", True),
])
def test_vllm_bench_json(tmp_path, field, value):
    f = _file(tmp_path, "bench.json", json.dumps({**VLLM, field: value}))
    assert_refused(run("check", f), f, f"field '{field}'")


@pytest.mark.parametrize("body, needle", [
    ("input,output,batch,ttft_ms,tpot_ms\n", "no measurements"),
    ("input,output,batch,ttft_ms,tpot_ms\n4096,64,abc,10,5\n", "field 'batch': row 1"),
    ("input,output,batch,ttft_ms,tpot_ms,context\n4096,64,8,10,5,abc\n", "field 'context': row 1"),
    ("input,output,batch,ttft_ms,tpot_ms\n4096.5,64,8,10,5\n", "field 'input': row 1 has '4096.5', not a whole"),
    ("input,output,batch,ttft_ms,tpot_ms\n4096,64,8,inf,5\n", "field 'ttft_ms'"),
    ("input,output,batch,ttft_ms,tpot_ms\n4096,64,8,10,-5\n", "field 'tpot_ms'"),
    ("input,output,batch,ttft_ms,tpot_ms\n4096,64,8,,5\n", "field 'ttft_ms': row 1 has no value"),
])
def test_measurements_csv(tmp_path, body, needle):
    f = _file(tmp_path, "m.csv", body)
    assert_refused(run("check", f), f, needle)


@pytest.mark.parametrize("body, field", [
    ("scenarios:\n  a: {run: {input: 4096}, expect: {ttft_s: fast}}\n", "scenarios.a.expect.ttft_s"),
    ("scenarios:\n  a: {run: {input: 4096}, expect: {ttft_s: .nan}}\n", "scenarios.a.expect.ttft_s"),
    ("scenarios:\n  a: {run: {input: 4096}, set: [a, b]}\n", "scenarios.a.set"),
    ("scenarios:\n  a: {run: {input: long}}\n", "scenarios.a.run.input"),
    ("scenarios:\n  a: {run: {input: 4096.5}}\n", "scenarios.a.run.input"),
    ("scenarios:\n  a: {run: {hw: 384}}\n", "scenarios.a.run.hw"),
    ("scenarios:\n  a: {run: {input: 4096}, expects: {}}\n", "scenarios.a.expects"),
    ("tolerance: {ttft_s: -1}\nscenarios:\n  a: {run: {input: 4096}}\n", "tolerance.ttft_s"),
])
def test_bad_baselines(tmp_path, body, field):
    f = _file(tmp_path, "b.yaml", body)
    assert_refused(run("check", f), f, f"field '{field}'")


def test_non_integer_token_counts(tmp_path):
    f = _file(tmp_path, "s.yaml", "name: s\ninput: 4096.5\n")
    assert_refused(run("compare", f, f), f, "field 'input'", "whole number")
    w = _file(tmp_path, "w.yaml", "name: w\ngrid: {batch: [8.5]}\n")
    assert_refused(run("sweep", w, "--cache", "off"), w, "field 'grid.batch'")
    assert_refused(run("predict", "--input", "4096.5"), "--input")


# ------------------------------------------------------------------------------------ command-line options

SERVE = ("serve", "--requests", "2", "--input", "128", "--output", "4")


@pytest.mark.parametrize("argv, needles", [
    ((*SERVE, "--rate", "inf"), ["argument --rate", "'inf'"]),
    ((*SERVE, "--rate", "1", "--duration", "inf"), ["argument --duration"]),
    ((*SERVE, "--rates", "1,inf"), ["--rates:", "finite"]),
    ((*SERVE, "--rate", "1", "--input", "lognormal:100:inf"), ["--input:", "sigma"]),
    ((*SERVE, "--concurrency", "0"), ["--concurrency:", "at least 1"]),
    ((*SERVE, "--rate", "1", "--prefix-hit", "2"), ["--prefix-hit:"]),
    (("plan", "--rate", "nan"), ["argument --rate"]),
    (("kernel", "verify", "rowwise", "--shape", "rows=8,dim=64", "--seed", "-1"), ["argument --seed"]),
    ((*SERVE, "--rate", "1", "--seed", "-1"), ["argument --seed"]),
    (("kernel", "verify", "rowwise", "--shape", "rows=8,cols=nan"), ["--shape:", "whole numbers"]),
    (("kernel", "sim", "gemm", "--shape", "m=1.5,n=128,k=128"), ["--shape:", "'m=1.5' is not a whole number"]),
    (("kernel", "show", "flash_attention", "--shape", "tokens=128,keys=128,scale=nan"), ["--shape:", "finite"]),
    (("kernel", "sim", "compressor", "--shape", "m=3,k=3,n=3"), ["--shape:", "n=3 must be"]),  # refused by its trace
])
def test_option_values(argv, needles):
    assert_refused(run(*argv), *needles)


def test_an_output_path_in_the_way_is_refused(tmp_path):
    blocker = tmp_path / "figs"
    blocker.write_text("a file where a directory goes")
    assert_refused(run(*SERVE, "--rate", "1", "--figures", blocker), str(blocker), "cannot read or write")


def test_a_size_of_zero_and_a_rate_too_small_to_time():
    assert_refused(run("kernel", "sim", "gemm", "--shape", "m=0,n=128,k=128"), "--shape:", "'m=0' must be at least 1")
    assert_refused(run("predict", *SMALL, "--set", "hbm.bandwidth=1e-300B/s"), "not a time", "hbm.bandwidth")


# ------------------------------------------------------------------------------------ kernel --shape option values

@pytest.mark.parametrize("kernel, shape, needles", [
    ("flash_attention", "tokens=8,keys=64,dtype=x", ["'dtype=x' is not one of", "'bf16'"]),  # was a KeyError
    ("gemm", "m=64,n=64,k=64,out_dtype=fp99", ["'out_dtype=fp99' is not one of"]),
    ("rowwise", "rows=8,dim=64,dtype=7", ["'dtype=7' is not one of"]),
    ("embedding", "tokens=4,hidden=0", ["'hidden=0' must be at least 1"]),  # was a ZeroDivisionError
    ("gemm", "m=64,n=64,k=64,batch=-1", ["'batch=-1' must be at least 1"]),
    ("flash_attention", "tokens=8,keys=64,heads=-1", ["'heads=-1' must be at least 1"]),  # was a ValueError
    ("mhc_pre", "tokens=8,mix=0", ["'mix=0' must be at least 1"]),
    ("sinkhorn", "rows=8,streams=-1", ["'streams=-1' must be at least 1"]),  # ran for ever
    ("rowwise", "rows=8,dim=64,buffering=-1", ["'buffering=-1' must be at least 0"]),  # was accepted
    ("quantise", "rows=8,elements=128,block=-2", ["'block=-2' must be at least -1"]),
    ("flash_attention", "tokens=8,keys=64,causal=2", ["'causal=2' must be one of 0, 1"]),  # was accepted
    ("sparse_flash_attention", "tokens=1,keys=64,batch=100000000000000000000", ["must be at most 2147483647"]),
    ("mhc_pre", "tokens=8,eps=-1", ["'eps=-1.0' must be above 0"]),
    ("moe_gate", "m=8,k=64,n=64,route_scale=nan", ["'route_scale=nan' is not a finite number"]),
    ("grouped_gemm", "rows=8,k=64,n=64,counts=x", ["counts 'x' must give 1 non-negative row counts"]),
    ("rope", "tokens=8,layout=x", ["layout must be one of interleaved, half"]),  # was named field 'layout'
    ("gemm", "m=64,n=64,k=64,heads=2", ["has no shape key 'heads'"]),
])
@pytest.mark.parametrize("command", ["show", "sim"])
def test_kernel_shape_option_values(command, kernel, shape, needles):
    """Every key of --shape, not only the dimensions: a bad type, zero, a negative, a huge value or NaN is one
    sentence naming --shape, the key and what it takes."""
    assert_refused(run("kernel", command, kernel, "--hw", "910b2", "--shape", shape), "--shape:", *needles)


@pytest.mark.parametrize("shape, needle", [
    ("rows=8,cols=64", "the rowwise check has no key cols; it reads dim, rows"),  # was silently dim=1024
    ("rows=0,dim=64", "every size must be at least 1"),  # was a ZeroDivisionError
    ("rows=100000,dim=100000", "too large to verify"),  # would allocate 80 GB
])
def test_kernel_verify_shape(shape, needle):
    assert_refused(run("kernel", "verify", "rowwise", "--shape", shape), "--shape:", needle)


def test_profile_shape_names_the_option():
    """`profile --shape` (an OpBasicInfo op's shape) refuses as `kernel` does, naming --shape (was field 'shape')."""
    from pathlib import Path
    op = Path(__file__).parent / "data" / "msprof" / "cy-lightning-indexer" / "BSND_BSND"
    assert_refused(run("profile", op, "--hw", "910b3", "--shape", "tokens=1,keys=64,heads=0"), "--shape:",
                   "'heads=0' must be at least 1")
