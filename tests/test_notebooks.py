"""Every notebook in notebooks/ executes headless, top to bottom, without errors (their last cells assert)."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # seconds each (a Jupyter kernel, a sweep or several predictions): the slow tier

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("NPUSIM_SWEEP_CACHE", str(tmp_path))
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                            ).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
