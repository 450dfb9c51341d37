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
