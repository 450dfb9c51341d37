"""The project's own fuzz suite (issue 15 item 5): hypothesis generates malformed values for every field of every file
type and every CLI option, and random valid configurations for the invariants.

Refusals: a value that is wrong for its field's kind (NaN, infinity, no unit, a fraction for a count, a list for a
number, text that is not YAML, ...) is written where users write values — a `--set` override, a field of a shipped
chip, system, model, plan, scenario, sweep or baseline file, a command-line option — and the CLI must exit 2 with one
sentence naming the file and the field, never a traceback. Invariants: a kernel's simulated time never beats its
roofline, the same inputs give bit-identical results, and a deployment that does not fit in HBM is refused.

Sized for CI (`.ci/run`): EXAMPLES cases per property. `python benchmarks/fuzz.py --examples 2000` (or
`NPUSIM_FUZZ_EXAMPLES=2000 pytest tests/test_fuzz.py`) is the longer run, random instead of derandomised.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import tempfile

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npusim.cli.main import build_parser
from npusim.errors import NpusimError
from npusim.spec.catalog import data_root
from npusim.spec.chip import load_chip
from npusim.spec.model import load_model
from npusim.spec.plan import load_plan
from npusim.spec.scenario import load_scenario
from npusim.spec.schema import leaves
from npusim.spec.system import load_system
from refusal import assert_refused, run

EXAMPLES = int(os.environ.get("NPUSIM_FUZZ_EXAMPLES", "150"))
# CI draws the same cases every run (a failure reproduces); a longer run set by the variable explores new ones
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="NPUSIM_FUZZ_EXAMPLES" not in os.environ,
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
# Every property below is marked slow (150 cases each, seconds to a minute): the slow tier, which .ci/run runs
ROOT = data_root()
CHEAP = ("--input", "512", "--output", "8", "--batch", "8")  # a prediction refused before any engine work

# ------------------------------------------------------------------------------------ malformed values per kind

NOT_YAML = st.sampled_from(["'", "[1", "{", "a: b: c", "\"", "- [", "!!python/object:os.system ls", "&a [*a]"])
NOT_SCALAR = st.sampled_from(["[1, 2]", "{a: 1}", "[]", "{}"])
NOT_FINITE = st.sampled_from([".nan", ".inf", "-.inf", ".NaN", "1e400"])
WORDS = st.text(alphabet="abcxyz_é", min_size=1, max_size=8).map(lambda w: "zz" + w)  # never a unit, name or bool


def _quantity(meta):
    unit = {"bytes": "KiB", "bandwidth": "GB/s", "frequency": "GHz", "time": "us", "power": "W", "energy": "pJ",
            "money": "USD", "number": ""}[meta["dim"]]
    low = meta.get("min", 0.0)
    below = st.sampled_from([f"{low - 1:g} {unit}".strip(), f"{low - 0.5:g} {unit}".strip()])
    if meta.get("strict", True):
        below = st.one_of(below, st.just(f"{low:g} {unit}".strip()))
    bad = [NOT_YAML, NOT_SCALAR, NOT_FINITE, below, WORDS, st.sampled_from(["3 parsecs", "true", "12 furlongs/s"])]
    if meta["dim"] != "number":
        bad.append(st.integers(1, 10**6).map(str))  # a bare number where a unit is required
    return st.one_of(bad)


def malformed(meta: dict, in_file: bool = False):
    """Values that field kind `meta` must refuse (`in_file`: written into a YAML file, where text that is not YAML
    becomes a string, which a free-text field takes)."""
    kind = meta.get("kind", "text")
    if kind == "quantity":
        return _quantity(meta)
    if kind == "count":
        low = meta.get("min", 1)
        return st.one_of(NOT_YAML, NOT_SCALAR, NOT_FINITE, WORDS, st.just(str(low - 1)),
                         st.floats(0.1, 1e6).filter(lambda x: not x.is_integer()).map(repr),
                         st.sampled_from(["true", "-5", "1.5"]))
    if kind == "counts":
        return st.one_of(NOT_YAML, WORDS, st.sampled_from(["[1.5]", "[-1]", "[a]", "{a: 1}", "[.nan]", "[true]"]))
    if kind == "ratio":
        return st.one_of(NOT_YAML, NOT_SCALAR, NOT_FINITE, WORDS, st.sampled_from(["0", "-0.5", "1.5", "2", "true"]))
    if kind == "flag":
        return st.one_of(NOT_YAML, NOT_SCALAR, NOT_FINITE, WORDS, st.sampled_from(["3", "0.5", "[true]"]))
    if kind == "shape":
        return st.one_of(NOT_YAML, NOT_FINITE, WORDS, st.sampled_from(["16x16", "0x16x16", "16x16x-1", "axbxc"]))
    if meta.get("choices"):
        return st.one_of(NOT_YAML, NOT_SCALAR, WORDS)
    return NOT_SCALAR if in_file else st.one_of(NOT_YAML, NOT_SCALAR)


def _fields(spec, prefix: str = "") -> list[tuple[str, dict]]:
    return [(prefix + path, meta) for path, _, meta in leaves(spec)
            if path not in ("name", "description", "label") and meta.get("kind")]


# every leaf of the shipped specs, as `--set` names it
OVERRIDABLE = sorted(dict(
    _fields(load_chip("910c-die")) + _fields(load_chip("950dt")) + _fields(load_system("cloudmatrix384"))
    + _fields(load_plan("v32-a3-pd-a17"), "plan.") + _fields(load_plan("v32-a3-decode-w8a8c8-mtp3"), "plan.")
    + _fields(load_model("deepseek-v3.2-exp"), "model.") + _fields(load_model("deepseek-v4-flash"), "model.")).items())


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzz_override_of_every_field(data):
    path, meta = data.draw(st.sampled_from(OVERRIDABLE), label="field")
    value = data.draw(malformed(meta), label="value")
    assert_refused(run("predict", *CHEAP, "--set", f"{path}={value}"), f"--set {path}")


# ------------------------------------------------------------------------------------ every field of every file


def _leaf_paths(tree, prefix=()):
    """The key paths of a YAML tree's leaves (a {value, source} mapping is one leaf)."""
    for key, node in tree.items():
        if key in ("source", "inherits", "name", "description", "label"):
            continue
        path = prefix + (key,)
        if isinstance(node, dict) and not ("value" in node and set(node) <= {"value", "source"}):
            yield from _leaf_paths(node, path)
        else:
            yield path


def _set(tree, keys: tuple, value):
    node = tree
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value


def _meta(spec, path: str) -> dict:
    return next((m for p, _, m in leaves(spec) if p == path), {})


SPEC_FILES = [("chip", "hardware/chips/910c-die.yaml", load_chip), ("chip", "hardware/chips/950dt.yaml", load_chip),
              ("system", "hardware/systems/cloudmatrix384.yaml", load_system),
              ("plan", "workloads/plans/v32-a3-pd-a17.yaml", load_plan),
              ("plan", "workloads/plans/v4flash-a3-decode.yaml", load_plan),
              ("model", "workloads/models/deepseek-v3.2-exp.yaml", load_model),
              ("model", "workloads/models/deepseek-v4-flash.yaml", load_model),
              ("scenario", "workloads/scenarios/v32-128k-a3-base.yaml", load_scenario)]
FILE_FIELDS = []
for _kind, _file, _load in SPEC_FILES:
    _spec = _load(str(ROOT / _file))
    _tree = yaml.safe_load((ROOT / _file).read_text())
    FILE_FIELDS += [(_kind, _file, keys, _meta(_spec, ".".join(keys))) for keys in _leaf_paths(_tree)
                    if _meta(_spec, ".".join(keys)).get("kind")]


def _invocation(kind: str, path: str) -> tuple:
    return {"chip": ("hw", "show", path), "system": ("hw", "show", path), "model": ("model", "show", path),
            "plan": ("predict", *CHEAP, "--plan", path), "scenario": ("compare", path, path)}[kind]


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzz_every_field_of_every_spec_file(data, tmp_path_factory):
    kind, file, keys, meta = data.draw(st.sampled_from(FILE_FIELDS), label="field")
    value = data.draw(malformed(meta, in_file=True), label="value")
    tree = yaml.safe_load((ROOT / file).read_text())
    _set(tree, keys, yaml.safe_load(value) if _yaml_ok(value) else value)
    path = ".".join(keys)
    folder = tmp_path_factory.mktemp("fuzz") / ("chips" if kind == "chip" else "systems" if kind == "system" else kind)
    folder.mkdir()
    target = folder / os.path.basename(file)
    if tree.get("inherits"):  # a parent is looked up in the catalog; the child keeps its own file name
        target = folder / f"fuzz-{os.path.basename(file)}"
    target.write_text(yaml.safe_dump(tree, sort_keys=False, allow_unicode=True))
    assert_refused(run(*_invocation(kind, str(target))), str(target), f"field '{path}'")


def _yaml_ok(text: str) -> bool:
    try:
        yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return True


SCENARIO_ARGS = {"hw": "name", "model": "name", "plan": "name", "quant": "name", "input": "count", "output": "count",
                 "batch": "count", "prefill_batch": "count", "context": "count0"}
BAD_ARG = {"name": st.one_of(st.integers(-5, 500), st.just([1]), st.just({"a": 1}), st.just(True)),
           "count": st.one_of(st.just(0), st.just(-3), st.floats(0.5, 1e5).filter(lambda x: not x.is_integer()),
                              WORDS, st.just([1]), st.just(True)),
           "count0": st.one_of(st.just(-3), st.floats(0.5, 1e5).filter(lambda x: not x.is_integer()), WORDS)}
BAD_METRIC = st.one_of(WORDS, st.just(float("nan")), st.just(float("inf")), st.just([1.0]), st.just(True))


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzz_sweep_and_baseline_files(data, tmp_path_factory):
    key = data.draw(st.sampled_from(sorted(SCENARIO_ARGS)), label="key")
    bad = data.draw(BAD_ARG[SCENARIO_ARGS[key]], label="value")
    where = data.draw(st.sampled_from(["sweep.base", "sweep.grid", "sweep.list", "baseline.run", "baseline.expect",
                                       "baseline.set", "baseline.tolerance"]), label="where")
    folder = tmp_path_factory.mktemp("files")
    f = folder / "fuzz.yaml"
    run_args = {"hw": "cloudmatrix384", "input": 512, "output": 8, "batch": 8}
    if where.startswith("sweep"):
        section = where.split(".")[1]
        body = {"name": "fuzz", "base": dict(run_args)}
        if section == "base":
            body["base"][key] = bad
        elif section == "grid":
            body["grid"] = {key: [bad]}
        else:
            body["list"] = [{}, {key: bad}]
        field = {"base": f"base.{key}", "grid": f"grid.{key}", "list": f"list[1].{key}"}[section]
        argv = ("sweep", f, "--cache", "off", "--workers", "1", "--no-figures", "--out", folder / "out")
    else:
        section = where.split(".")[1]
        scenario = {"run": dict(run_args), "expect": {"ttft_s": 1.0}}
        if section == "run":
            scenario["run"][key] = bad
            field = f"scenarios.a.run.{key}"
        elif section == "expect":
            metric = data.draw(st.sampled_from(["ttft_s", "tpot_s", "tokens_per_s_per_chip"]), label="metric")
            scenario["expect"][metric] = data.draw(BAD_METRIC, label="recorded")
            field = f"scenarios.a.expect.{metric}"
        elif section == "set":
            path, meta = data.draw(st.sampled_from(OVERRIDABLE), label="field")
            scenario["set"] = {path: data.draw(malformed(meta), label="override")}
            field = f"scenarios.a.set.{path}"
        else:
            scenario["tolerance"] = {"ttft_s": data.draw(st.one_of(BAD_METRIC, st.just(-0.1)), label="tolerance")}
            field = "scenarios.a.tolerance.ttft_s"
        body = {"scenarios": {"a": scenario}}
        argv = ("check", f)
    f.write_text(yaml.safe_dump(body, sort_keys=False, allow_unicode=True))
    r = run(*argv)
    assert_refused(r, str(f))
    assert re.search(rf"field '{re.escape(field)}(\.[\w.]+)?'", r.stderr), (field, r.stderr)


# ------------------------------------------------------------------------------------ every CLI option

CHEAP_BASE = {  # a cheap command line per command, the fuzzed option appended after it
    "hw": ("hw", "show", "910b2"), "model": ("model", "show", "deepseek-v3.1", "--phase", "decode", "--context", "128",
                                              "--batch", "1"),
    "kernel": ("kernel", "show", "gemm", "--hw", "910b2", "--shape", "m=128,n=128,k=128"),
    "predict": ("predict", *CHEAP),
    "plan": ("plan", "--max-chips", "1"), "check": ("check", "tests/data/nosuch.yaml"),
    "compare": ("compare", "nosuch.yaml", "nosuch.yaml"), "sweep": ("sweep", "nosuch.yaml"),
    "serve": ("serve", "--rate", "1", "--requests", "2", "--input", "128", "--output", "4"),
    "profile": ("profile", "nosuch.csv"), "report": ("report", "nosuch.yaml"),
}
BAD_OPTION = st.one_of(NOT_YAML, NOT_FINITE, WORDS, st.sampled_from(["-1", "0", "", "1.5", "1e400", "-inf", "nan",
                                                                    "ttft=2", "a=b=c", ",", "=", "0x10", " "]))


def _sub_base(path):
    """The cheap base of a sub-command other than CHEAP_BASE's (hw list, kernel sim, model list, ...)."""
    bases = {("hw", "list"): ("hw", "list"), ("hw", "diff"): ("hw", "diff", "910b2", "910b3"),
             ("kernel", "sim"): ("kernel", "sim", "gemm", "--hw", "910b2", "--shape", "m=128,n=128,k=128"),
             ("kernel", "verify"): ("kernel", "verify", "rowwise", "--shape", "rows=8,dim=64"),
             ("kernel", "list"): ("kernel", "list"), ("model", "list"): ("model", "list")}
    if tuple(path[:2]) in bases:
        return bases[tuple(path[:2])]
    cheap = CHEAP_BASE.get(path[0])
    return cheap if cheap and cheap[1] == path[1] else path


def _options():
    """(command path, option, base) of every option that takes a value, from the parser itself; the base is the
    command's cheap line above, else the command with a file that does not exist for each positional argument (a
    command added later is fuzzed without anyone listing it)."""
    out = []

    def walk(parser, path):
        positionals = [a for a in parser._actions if not a.option_strings and not isinstance(a.choices, dict)]
        for action in parser._actions:
            if action.choices and isinstance(action.choices, dict):  # sub-commands
                for name, sub in action.choices.items():
                    walk(sub, path + (name,))
            elif action.option_strings and action.nargs != 0 and action.dest not in ("help", "version"):
                base = _sub_base(path) if len(path) > 1 else CHEAP_BASE.get(path[0])
                if base is None or (len(path) > 1 and base == path):
                    base = path + ("nosuch.yaml",) * sum(a.nargs in (None, 1) for a in positionals)
                out.append((path, action.option_strings[-1], base))

    walk(build_parser(), ())
    return sorted(set(out))


OPTIONS = _options()
WORKDIR = tempfile.mkdtemp(prefix="npusim-fuzz-")


def test_the_parser_is_walked():
    assert len(OPTIONS) > 100 and {"predict", "serve", "sweep", "check"} <= {path[0] for path, _, _ in OPTIONS}


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzz_every_cli_option(data):
    path, opt, base = data.draw(st.sampled_from(OPTIONS), label="option")
    value = data.draw(BAD_OPTION, label="value")
    with contextlib.chdir(WORKDIR):  # whatever an option writes lands here
        r = run(*base, opt, value)
    assert r.returncode in (0, 1, 2) and "Traceback" not in r.stderr
    if r.returncode == 2:
        assert_refused(r)


def _kernel_dims():
    from npusim.kernels import catalog
    from npusim.kernels.base import KERNELS
    catalog.names()  # registers every kernel
    return {name: [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING and f.type == "int"]
            for name, cls in sorted(KERNELS.items())}


KERNEL_DIMS = _kernel_dims()
SIZES = st.one_of(st.sampled_from([0, 1, 2, 3, 7, 15, 16, 17, 127, 128, 129, 1000, 4096]), st.integers(-3, 5000))


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzz_kernel_shapes(data):
    """Every kernel's required dimensions at edge and random sizes (zero and negative included), shown or simulated
    on three chips: a tiling and time, or a refusal in one sentence (--shape, or the buffer a shape overflows)."""
    name = data.draw(st.sampled_from(sorted(KERNEL_DIMS)), label="kernel")
    shape = ",".join(f"{k}={data.draw(SIZES, label=k)}" for k in KERNEL_DIMS[name])
    command = data.draw(st.sampled_from(["show", "sim"]), label="command")
    hw = data.draw(st.sampled_from(["910b2", "910c-die", "950dt"]), label="hw")
    r = run("kernel", command, name, "--hw", hw, "--shape", shape)
    assert r.returncode in (0, 2), r.stderr
    if r.returncode == 2:
        assert_refused(r)


def _kernel_options():
    from npusim.kernels.base import KERNELS
    return {name: [f.name for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING]
            for name, cls in sorted(KERNELS.items())}


KERNEL_OPTIONS = _kernel_options()
SMALL_DIMS = {"m": 64, "n": 128, "k": 128, "rows": 16, "elements": 128, "tokens": 16, "keys": 512, "dim": 128,
              "cols": 128, "width": 256}
BAD_SHAPE_VALUE = st.one_of(WORDS, st.sampled_from(["0", "-1", "-7", "1.5", "nan", "inf", "-inf", "1e400", "",
                                                    "100000000000000000000", "2147483648", "bf16", "[1]"]))


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzz_kernel_shape_options(data):
    """Every key of every kernel's --shape besides its dimensions (dtypes, counts, flags, tile options, reals) — and
    a key it does not have — at a wrong type, zero, negative, huge or NaN: a tiling and time where the value is
    allowed (0 is the tiler's own choice for a tile option), else one sentence naming --shape and the key."""
    name = data.draw(st.sampled_from(sorted(KERNEL_OPTIONS)), label="kernel")
    key = data.draw(st.sampled_from(KERNEL_OPTIONS[name] + ["zz_" + name]), label="key")
    value = data.draw(BAD_SHAPE_VALUE, label="value")
    dims = ",".join(f"{d}={SMALL_DIMS[d]}" for d in KERNEL_DIMS[name])
    command = data.draw(st.sampled_from(["show", "sim"]), label="command")
    r = run("kernel", command, name, "--hw", "910b2", "--shape", f"{dims},{key}={value}")
    assert r.returncode in (0, 2), r.stderr
    if r.returncode == 2:
        assert_refused(r, "--shape")


# ------------------------------------------------------------------------------------ invariants, valid inputs

GEMM = st.tuples(st.integers(1, 3000), st.integers(16, 3000), st.integers(16, 3000),
                 st.sampled_from(["fp16", "bf16", "int8"]), st.sampled_from(["910b2", "910c-die", "950dt"]))


@pytest.mark.slow
@settings(FUZZ, max_examples=max(10, EXAMPLES // 5))
@given(case=GEMM)
def test_fuzz_kernels_never_beat_their_roofline_and_repeat_exactly(case):
    from npusim.engine.result import simulate
    from npusim.kernels.catalog import kernel
    from npusim.parallel.optime import kernel_trace
    m, n, k, dtype, chip_name = case
    chip = load_chip(chip_name)
    kern = kernel("gemm", {"m": m, "n": n, "k": k}, dtype=dtype)
    first, again = (simulate(kernel_trace(kern, chip, 0), chip) for _ in range(2))
    assert first.time >= first.roofline * (1 - 1e-9) and first.roofline > 0
    assert (first.time, first.roofline, first.bound) == (again.time, again.roofline, again.bound)


DEPLOYMENTS = [("cloudmatrix384", "deepseek-v3.2-exp", "v32-a3-pd-a17"),
               ("cloudmatrix384", "deepseek-v3.1", "r1-a3-decode-a16"),
               ("atlas-950-superpod", "deepseek-v4-flash", "v4flash-950dt-a23"),
               ("cloudmatrix384", "deepseek-v4-flash", "v4flash-a3-decode")]
PREDICT = st.tuples(st.sampled_from(DEPLOYMENTS), st.integers(64, 8192), st.integers(1, 128), st.integers(2, 256))


@pytest.mark.slow
@settings(FUZZ, max_examples=max(4, EXAMPLES // 30))
@given(case=PREDICT)
def test_fuzz_predictions_repeat_exactly_and_never_beat_the_roofline(case):
    from npusim import api
    (hw, model, plan), inp, batch, out = case
    args = dict(hw=hw, model=model, plan=plan, input=inp, output=out, batch=batch)
    try:
        a = api.predict(**args)
    except NpusimError as exc:  # the one refusal a valid configuration may meet: too big for HBM
        assert "does not fit in HBM" in str(exc), exc
        return
    b = api.predict(**args)
    assert (a.ttft, a.tpot, a.memory["decode"].total) == (b.ttft, b.tpot, b.memory["decode"].total)
    for step in (a.prefill, a.decode):
        for layer in step.layers if step is not None else ():
            for op in layer.ops:
                assert op.time >= op.roofline * (1 - 1e-9), (op.op, op.time, op.roofline)


@pytest.mark.parametrize("batch", [1 << 20])
def test_a_deployment_that_does_not_fit_is_refused(batch):
    assert_refused(run("predict", "--input", "131072", "--batch", batch), "does not fit")


