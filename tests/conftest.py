"""Shared helpers: run the real CLI in a subprocess, as a user would."""

import os
import subprocess
import sys
import tempfile

import pytest

# Tests never read or write the user's kernel cache; subprocess CLI runs inherit this.
os.environ["NPUSIM_CACHE"] = tempfile.mkdtemp(prefix="npusim-test-cache-")


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "npusim.cli.main", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.fixture
def cli():
    return run_cli


# The slow tier (issue 30). `pytest` (the README's command; pyproject's addopts say -m "not slow") runs the fast tier,
# <= 5 minutes on the 2-core machine; `pytest -m slow` runs the slow one, and .ci/run runs both. Test files of the
# tool's own speed work mark their slow tests where they are defined (@pytest.mark.slow: notebooks, golden traces,
# fuzz and monotonicity properties, Dask, the browser, the long report runs); the slow tests of the other files are
# listed here by node id, a test function's id marking all its cases, an id with [case] that case only. Picked from
# a full `pytest --durations=0` run of 277ee87 on the shared 2-core machine at load ~3-5: the figures are that run's
# seconds (setup included, e.g. test_colocated's module-scoped search), whole plan searches, serving runs and
# predictions end to end in a subprocess. No test is dropped: .ci/run runs them all.
SLOW = {
    "tests/test_planner.py::test_cli_plan_writes_a_plan_predict_accepts": 91,
    "tests/test_planner.py::test_cli_plan_bad_input_is_one_sentence[args5---out]": 32,  # searches before --out
    "tests/test_launch.py::test_cli_predict_and_plan_emit": 31,
    "tests/test_serving_engine.py::test_serve_cli_runs_end_to_end": 20,
    "tests/test_serving_engine.py::test_serve_cli_rate_sweep_finds_the_knee": 15,
    "tests/test_checks.py::test_hardware_change_drifts_until_update": 17,
    "tests/test_checks.py::test_update_refuses_set_and_unrunnable_scenarios": 7.5,
    # the three tests of the module-scoped `planned` search (16 s), and two searches of their own
    "tests/test_colocated.py::test_colocated_beside_disaggregated_with_a_verdict": 16,
    "tests/test_colocated.py::test_served_ttft_is_bounded_by_the_prefill_alone_and_halving_follows_a_miss": 0.1,
    "tests/test_colocated.py::test_served_tpot_is_worse_than_the_same_decode_alone": 0.1,
    "tests/test_colocated.py::test_no_colocated_skips_the_serving_runs_and_the_verdict": 11,
    "tests/test_colocated.py::test_a_prompt_alone_above_the_ttft_limit_is_not_served": 7.5,
    "tests/test_af.py::test_plan_af_cli_writes_the_fastest_split_and_predict_confirms_it": 16,
    "tests/test_af.py::test_planner_sizes_the_two_sides": 11,
    "tests/test_planner_load.py::test_cli_plan_under_a_load_states_it_and_prints_the_serve_command": 7.2,
    "tests/test_optimisations.py::test_compare_cli_end_to_end": 11,
    "tests/test_phase_streams.py::test_compare_a_decode_only_ladder_draws_tpot": 7.8,
    "tests/test_profile.py::test_fit_then_kernel_sim_moves_towards_the_profile": 9.7,
    "tests/test_predict.py::test_hbm_bandwidth_monotone": 7.5,
    "tests/test_functional_attention.py::test_causal_ramp_units_compute_every_token": 14,
    "tests/test_functional_deepseek.py::test_v4_sparse_attn_with_the_reference_index_lists_and_sink[0-300-128]": 6,
    # a deeply nested YAML file of each kind, parsed by the CLI in a subprocess
    **{f"tests/test_refusals.py::test_unreadable_files[deep-{kind}]": 8
       for kind in ("baseline", "chip", "model", "scenario", "sweep", "system")},
}


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the marks
def pytest_collection_modifyitems(items):
    for item in items:
        if item.nodeid in SLOW or item.nodeid.split("[")[0] in SLOW:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def bad_chip(tmp_path):
    """Write a chip file that inherits a shipped one, with the given YAML body; returns its path."""

    def write(body: str, name: str = "bad") -> str:
        d = tmp_path / "chips"
        d.mkdir(exist_ok=True)
        p = d / f"{name}.yaml"
        p.write_text(body)
        return str(p)

    return write
