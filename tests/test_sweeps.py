"""Sweeps: same rows serial, in processes and on a Dask LocalCluster; resumable cache; files, figures, clear errors."""

import os

import pandas as pd
import pytest

import npusim
from npusim.spec import units
from npusim.sweeps import SweepSpec, save
from npusim.sweeps import run as sweep_run

BASE = {"hw": "cloudmatrix384", "model": "deepseek-v3.2-exp", "plan": "v32-a3-pd-a17", "input": 2048, "output": 128}
GRID = {"batch": [64, 128, 256], "hbm.bandwidth": ["1.6TB/s", "3.2TB/s"]}


def _sweep(**kw):
    return npusim.sweep(base=BASE, grid=GRID, name="t", progress=False, **kw)


@pytest.fixture(scope="module")
def serial():
    return _sweep(workers=1, cache="off")


def test_rows_follow_the_grid_and_hbm_helps(serial):
    assert len(serial) == 6 and (serial["error"] == "").all()
    assert list(serial["batch"]) == [64, 64, 128, 128, 256, 256]
    fast, slow = serial[serial["hbm.bandwidth"] == "3.2TB/s"], serial[serial["hbm.bandwidth"] == "1.6TB/s"]
    assert (fast["tpot_s"].values <= slow["tpot_s"].values).all()
    assert {"decode_usd_per_mtok", "decode_system_joules_per_token", "chips"} <= set(serial.columns)


def test_roofline_ceilings_are_a_ranks_own(serial):
    """A rank is a die and the chip's figures are per die: the roofline figure's ceilings are the die's peaks (they
    were halved on the two-die 910C), and no phase's achieved FLOP/s is above its rank's peak."""
    chip = npusim.api.load_system("cloudmatrix384").chip_spec
    assert chip.dies == 2
    assert (serial["peak_flops_per_rank"] == chip.peak_cube_flops("bf16")).all()
    assert (serial["hbm_bandwidth_per_rank"] == serial["hbm.bandwidth"].map(lambda v: units.parse(v, "bandwidth"))).all()
    peak = chip.peak_cube_flops("bf16") + chip.peak_vector_flops("fp32")
    for phase in ("prefill", "decode"):
        achieved = serial[f"{phase}_flops_per_rank"] / serial[f"{phase}_step_s"]
        assert (achieved <= peak).all() and (achieved > 0).all()


def test_parallel_equals_serial(serial):
    pd.testing.assert_frame_equal(_sweep(workers=2, cache="off"), serial)


def test_runs_are_whole_blocks_of_the_trailing_axes():
    # the 10,000-point benchmark: 312 points per task would cut most (batch, bandwidth) blocks of 100 between workers
    assert sweep_run.chunksize(10_000, 2, (10, 10, 10, 10)) == 300
    assert sweep_run.chunksize(64, 2, (2, 2, 4, 4)) == 2 and sweep_run.chunksize(5, 2) == 1
    assert sweep_run.runs([0, 1, 2, 5, 6, 9, 10], 3) == [[0, 1, 2], [5], [6], [9, 10]]  # a resumed sweep stays aligned


def test_cache_resumes_an_interrupted_sweep(serial, tmp_path, monkeypatch):
    spec = SweepSpec("t", BASE, GRID)
    first = spec.expand()[:3]
    store = sweep_run.DiskCache(tmp_path)
    for p in first:  # as if interrupted after three points
        store.put(sweep_run.point_key(p), sweep_run.evaluate(p))
    calls = []
    real = sweep_run.evaluate
    monkeypatch.setattr(sweep_run, "evaluate", lambda p: calls.append(p) or real(p))
    again = sweep_run.run_sweep(spec, workers=1, cache=store, progress=False)
    assert len(calls) == 3 and calls == spec.expand()[3:]
    pd.testing.assert_frame_equal(again, serial)
    calls.clear()
    sweep_run.run_sweep(spec, workers=1, cache=store, progress=False)
    assert calls == []


@pytest.mark.slow  # starts a Dask LocalCluster
def test_dask_local_cluster_equals_serial(serial):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        with distributed.Client(c) as client:
            on_dask = _sweep(scheduler=client, cache="off")
        by_address = _sweep(scheduler=c.scheduler_address, cache="off")
    pd.testing.assert_frame_equal(on_dask, serial)
    pd.testing.assert_frame_equal(by_address, serial)


def test_refused_points_are_rows_not_crashes():
    df = npusim.sweep(base={**BASE, "batch": 64}, grid={"plan.decode.moe.ep": [128, 3]}, workers=1, cache="off",
                      progress=False)
    assert df["error"].iloc[0] == "" and "decode.moe" in df["error"].iloc[1]


def test_save_writes_csv_and_figures(serial, tmp_path):
    files = save(serial, SweepSpec("t", BASE, GRID), tmp_path)
    names = {f.name for f in files}
    assert {"t.csv", "t-tpot_vs_batch.png", "t-roofline.png"} <= names
    assert "t.parquet" in names  # pyarrow is a dependency: Parquet always beside the CSV
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "t.parquet"), serial)
    assert len(pd.read_csv(tmp_path / "t.csv")) == 6


def test_cli_sweep_file(cli, tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nbase: {hw: cloudmatrix384, plan: v32-a3-pd-a17, input: 2048, output: 128}\n"
                 "grid: {batch: [64, 128]}\n")
    env_cache = tmp_path / "cache"
    r = cli("sweep", f, "--out", tmp_path / "out", "--cache", env_cache, "--workers", "1", "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert "point" not in r.stderr and (tmp_path / "out" / "s.csv").exists()  # no progress bar off a terminal
    assert len(os.listdir(env_cache)) >= 1


@pytest.mark.parametrize("body, needle", [
    ("name: s\ngrid: {batch: 64}\n", "field 'grid'"),
    ("name: s\ngrid: {batch: [x]}\n", "field 'grid.batch'"),
    ("name: s\nsweep: {}\n", "unknown key 'sweep'"),
    ("name: s\nlist: [1, 2]\n", "field 'list'"),
])
def test_cli_sweep_bad_file_is_one_sentence(cli, tmp_path, body, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(body)
    r = cli("sweep", f, "--cache", "off")
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # waits for the Dask client to give up connecting
def test_cli_sweep_unreachable_scheduler(cli, tmp_path):
    pytest.importorskip("distributed")
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nbase: {input: 2048, output: 128}\ngrid: {batch: [64]}\n")
    r = cli("sweep", f, "--cache", "off", "--scheduler", "tcp://127.0.0.1:1")
    assert r.returncode == 2 and "--scheduler" in r.stderr and "Traceback" not in r.stderr, r.stderr
