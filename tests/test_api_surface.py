"""The public surface: dir(npusim) shows the API, the result objects document every field and read well in a
terminal and a notebook, machine formats carry numbers with their unit in the key, listings describe each file, and
progress bars show only on a terminal."""

import dataclasses
import io
import json

import pytest

import npusim
from npusim.progress import progress


@pytest.fixture(scope="module")
def pred():
    return npusim.predict(input=4096, batch=64)


def test_dir_shows_the_public_api():
    names = dir(npusim)
    assert names == npusim.__all__
    for name in ("predict", "compare", "sweep", "plan", "cost", "check", "launch", "Prediction", "Comparison",
                 "functional"):
        assert name in names and getattr(npusim, name).__doc__, name


@pytest.mark.parametrize("cls", ["Prediction", "Comparison"])
def test_result_objects_document_every_field(cls):
    kind = getattr(npusim, cls)
    doc = kind.__doc__
    for f in dataclasses.fields(kind):
        assert f.name in doc, f"{cls}.{f.name} is not in the docstring"


def test_prediction_repr_and_notebook_view(pred):
    text = repr(pred)
    assert text.startswith("Prediction(deepseek-v3.2-exp on cloudmatrix384") and f"{pred.tpot * 1e3:.2f} ms" in text
    assert len(text) < 300  # one line, not the dataclass dump of every layer
    page = pred._repr_html_()
    assert "<table" in page and f"{pred.ttft * 1e3:.1f} ms" in page
    assert pred.breakdown().equals(pred.breakdown("decode"))
    assert pred.breakdown()["share_pct"].sum() == pytest.approx(100)


def test_comparison_repr(tmp_path):
    (tmp_path / "a.yaml").write_text("input: 2048\noutput: 128\nbatch: 32\n")
    (tmp_path / "b.yaml").write_text("input: 2048\noutput: 128\nbatch: 64\nlabel: bigger\n")
    cmp = npusim.compare(tmp_path / "a.yaml", tmp_path / "b.yaml")
    assert repr(cmp).startswith("Comparison(2 scenarios: a: TTFT") and "bigger: TTFT" in repr(cmp)
    assert "<table" in cmp._repr_html_() and "d_TPOT_ms_pct" in cmp.table()


def _numbers_only(tree, path=""):
    """Every leaf of a JSON document that is a string must not be a number with a unit ('88.8 %', '3 ms')."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            _numbers_only(v, f"{path}.{k}")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            _numbers_only(v, f"{path}[{i}]")
    elif isinstance(tree, str):
        assert not any(tree.rstrip().endswith(u) and tree[:1].isdigit() for u in ("%", " ms", " s", " us", "GiB")), \
            f"{path} = {tree!r}"


def test_predict_machine_formats_carry_the_headline(cli, pred):
    out = json.loads(cli("predict", "--input", "4096", "--batch", "64", "--format", "json").stdout)
    assert out["summary"]["ttft_s"] == pytest.approx(pred.ttft) and out["summary"]["tpot_s"] == pytest.approx(pred.tpot)
    assert out["cost"]["decode_usd_per_mtok"] > 0
    _numbers_only(out)
    csv = cli("predict", "--input", "4096", "--batch", "64", "--format", "csv").stdout.splitlines()
    assert csv[0].startswith("section,name,value,phase")
    rows = dict(line.split(",")[1:3] for line in csv if line.startswith("summary,"))
    assert float(rows["ttft_s"]) == pytest.approx(pred.ttft) and float(rows["tpot_s"]) == pytest.approx(pred.tpot)
    assert any(line.startswith("cost,decode_usd_per_mtok,") for line in csv)
    assert sum(line.startswith("breakdown,") for line in csv) > 10


def test_kernel_sim_json_numbers(cli):
    r = cli("kernel", "sim", "gemm", "--hw", "910c-die", "--shape", "512,512,512,dtype=fp16", "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    _numbers_only(out)
    assert all(0 <= row["busy_pct"] <= 100 for row in out["rows"])


def test_kernel_show_json_leaves_a_missing_number_null(cli):
    r = cli("kernel", "show", "gemm", "--hw", "910b2", "--shape", "m=64,n=7168,k=2048", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    pipes = [row for row in rows if row["section"] == "pipe"]
    assert pipes and all(isinstance(row["bytes"], (int, float)) for row in pipes)
    assert all(row["bytes"] is None and row["flops"] is None for row in rows if row["section"] == "buffer")


def test_listings_describe_every_file(cli):
    plans = json.loads(cli("plan", "list", "--format", "json").stdout)["rows"]
    assert plans == json.loads(cli("list", "plans", "--format", "json").stdout)["rows"]
    names = {r["name"] for r in plans}
    assert {"v32-a3-pd-a17", "r1-a3-sglang-pd-tp2"} <= names and all(r["description"] for r in plans)
    scenarios = json.loads(cli("scenario", "list", "--format", "json").stdout)["rows"]
    assert "v32-128k-a3-base" in {r["name"] for r in scenarios} and all(r["description"] for r in scenarios)
    assert "sglang" in cli("list", "frameworks").stdout


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_only_on_a_terminal():
    for out, shown in ((_Terminal(), True), (io.StringIO(), False)):
        with progress(3, "plan", "task", file=out) as bar:
            for _ in range(3):
                bar.update()
        assert ("plan:" in out.getvalue() and "/3" in out.getvalue()) == shown
    quiet = _Terminal()
    with progress(3, "plan", "task", enabled=False, file=quiet) as bar:
        bar.update()
    assert quiet.getvalue() == ""


def test_compare_writes_a_figure_only_when_asked(cli, tmp_path):
    (tmp_path / "a.yaml").write_text("input: 2048\noutput: 128\nbatch: 32\n")
    (tmp_path / "b.yaml").write_text("input: 2048\noutput: 128\nbatch: 64\n")
    r = cli("compare", "a.yaml", "b.yaml", "--format", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob("*.png")) and "waterfall" not in json.loads(r.stdout)
