"""Every notebook runs top to bottom with nbclient on the tiny model, against a copy of a real store."""

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_four_notebooks_exist_and_are_stored_without_outputs():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04"]
    for path in NOTEBOOKS:
        cells = nbformat.read(path, as_version=4).cells
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in cells if c.cell_type == "code")


# What each notebook's own output must say (the notebooks assert nothing themselves: they are for reading).
EXPECTED = {"01_quickstart": "finished", "02_launch_training": "resume: finished",
            "03_fidelity_analysis": "error_agreement", "04_rehearsal_budget": "finished"}


def _text(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        out.append(o.get("text", ""))
        out += [v for k, v in o.get("data", {}).items() if k.startswith("text/") and isinstance(v, str)]
    return "".join(out)


@pytest.mark.heavy
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, store, tmp_path, monkeypatch):
    root = tmp_path / "runs"
    shutil.copytree(store, root)
    monkeypatch.setenv("ENVACE_RUNS", str(root))
    monkeypatch.setenv("ENVACE_NOTEBOOK_MODEL", "tiny")
    book = nbformat.read(path, as_version=4)
    where = {"metadata": {"path": str(path.parent)}}  # run from notebooks/, as JupyterLab does
    client = NotebookClient(book, timeout=900, kernel_name="python3", resources=where)
    client.execute()
    errors = [o for c in book.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert EXPECTED[path.stem] in "".join(_text(c) for c in book.cells if c.cell_type == "code")
    assert all(" assert " not in f" {c.source}" for c in book.cells if c.cell_type == "code")
