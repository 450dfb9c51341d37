"""`npusim hw` through the real CLI, and every bad-input case: one sentence, exit 2, no traceback."""

import json

import pytest


def test_version(cli):
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("npusim ")


def test_hw_list_shows_families_and_systems(cli):
    r = cli("hw", "list", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert {row["family"] for row in rows if row["kind"] == "chip"} == {"910b", "910c", "950"}
    assert {"atlas-800-a2", "atlas-800-a3", "cloudmatrix384", "atlas-950-superpod"} <= {
        row["name"] for row in rows if row["kind"] == "system"}
    b2 = next(row for row in rows if row["name"] == "910b2")
    assert b2["BF16 TFLOPS"] == pytest.approx(353.9, abs=0.1)


def test_hw_show_sources(cli):
    r = cli("hw", "show", "950dt", "--sources", "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert "hbm.bandwidth,4 TB/s,hardware.md §3.4" in r.stdout
    assert "derived: TFLOPS per die" in r.stdout


def test_hw_show_with_override_and_diff(cli):
    r = cli("hw", "show", "910c-die", "--set", "hbm.bandwidth=3.2TB/s", "--format", "json")
    rows = {row["field"]: row["value"] for row in json.loads(r.stdout)["rows"]}
    assert rows["hbm.bandwidth"] == "3.2 TB/s"
    r = cli("hw", "diff", "950pr", "950dt", "--format", "json")
    fields = {row["field"] for row in json.loads(r.stdout)["rows"]}
    assert {"hbm.bandwidth", "hbm.capacity"} <= fields and "aic.count" not in fields


def assert_one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize("body,needles", [
    ("inherits: 910b2\nhbm:\n  bandwidht: {value: 2 TB/s, source: x}\n", ["hbm.bandwidht", "did you mean 'bandwidth'"]),
    ("inherits: 910b2\nhbm:\n  bandwidth: {value: 2 TB, source: x}\n", ["hbm.bandwidth", "'TB'", "bandwidth"]),
    ("inherits: 910b2\nclock: {value: 0 GHz, source: x}\n", ["'clock'", "must be > 0"]),
    ("inherits: 910b2\naic:\n  count: {value: -4, source: x}\n", ["aic.count", ">= 1"]),
    ("inherits: 910b2\nhbm:\n  bandwidth: 2 TB/s\n", ["hbm.bandwidth", "has no source"]),
    ("inherits: 910b2\naic:\n  buffers:\n    l0c: {value: 1 MiB, source: x}\n", ["aic.buffers.l0c", "larger than L1"]),
    ("inherits: 910b2\naic:\n  buffers:\n    l0a: {value: 256 B, source: x}\n", ["aic.cube.fractal", "L0A"]),
    ("inherits: 910b2\nclock: [1.8 GHz\n", ["not valid YAML", "line"]),
    ("inherits: nosuchchip\n", ["inherits", "unknown chip 'nosuchchip'"]),
    ("inherits: 910b2\nefficiency:\n  cube: {value: 1.5, source: x}\n", ["efficiency.cube", "(0, 1]"]),
])
def test_bad_chip_files(cli, bad_chip, body, needles):
    path = bad_chip(body)
    assert_one_line_error(cli("hw", "show", path), "bad.yaml", *needles)


def test_unknown_names_and_bad_overrides(cli):
    assert_one_line_error(cli("hw", "show", "910x"), "unknown chip or system '910x'")
    assert_one_line_error(cli("hw", "show", "910b2", "--set", "hbm.bandwith=1TB/s"), "hbm.bandwith", "did you mean")
    assert_one_line_error(cli("hw", "show", "910b2", "--set", "hbm.bandwidth=fast"), "hbm.bandwidth", "'fast'")
    assert_one_line_error(cli("hw", "show", "910b2", "--set", "nonsense"), "FIELD=VALUE")
    assert_one_line_error(cli("hw", "diff", "910b2", "cloudmatrix384"), "cannot compare")
