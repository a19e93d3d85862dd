"""What every notebook starts with, and the live view it watches a job through.

`setup()` finds the repository (JupyterLab opens a notebook from `notebooks/`), the store (`ENVACE_RUNS`, else
`runs/`) and the model the notebook plays (`ENVACE_NOTEBOOK_MODEL`: `tiny`, a random-init model built in
seconds, is what CI runs; `default`, SmolLM2-135M, takes minutes and is the one that issues tool calls).
`watch(handle, wb, draw)` redraws one figure in place while a launched job writes, until it ends.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workbench.core import Workbench
from workbench.launch import RunHandle


@dataclass
class Notebook:
    repo: Path
    root: Path
    model: str
    wb: Workbench


def setup() -> Notebook:
    repo = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
    root = Path(os.environ.get("ENVACE_RUNS", repo / "runs"))
    model = os.environ.get("ENVACE_NOTEBOOK_MODEL", "tiny")
    wb = Workbench(root)
    print(f"store {root}: {len(wb.runs())} run(s); model {model}")
    return Notebook(repo, root, model, wb)


def watch(handle: RunHandle, wb: Workbench, draw: Callable[[], object], every_s: float = 2.0,
          timeout_s: float = 1800.0, until: Callable[[], bool] | None = None) -> str:
    """Show `draw()`'s figure and redraw it in place every `every_s` seconds while `handle`'s job runs (or until
    `until()` holds); returns the job's status then."""
    from IPython.display import display

    shown = display(draw(), display_id=True)
    deadline = time.time() + timeout_s
    while handle.status() == "running" and time.time() < deadline and not (until and until()):
        time.sleep(every_s)
        wb.refresh()
        shown.update(draw())
    wb.refresh()
    shown.update(draw())
    return handle.status()


def export_html(notebook: str | Path, root: str | Path, out: str | Path, model: str = "tiny") -> Path:
    """Run `notebook` top to bottom against the store `root` and write it, outputs included, as HTML to `out`.
    Plots load plotly.js from its CDN, which keeps the file small (`make notebooks-html` writes `docs/notebooks/`)."""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    notebook, out = Path(notebook), Path(out)
    book = nbformat.read(notebook, as_version=4)
    env = {**os.environ, "ENVACE_RUNS": str(Path(root).resolve()), "ENVACE_NOTEBOOK_MODEL": model,
           "PLOTLY_RENDERER": "notebook_connected"}  # the kernel's, not this process's
    NotebookClient(book, timeout=1800, kernel_name="python3",
                   resources={"metadata": {"path": str(notebook.parent)}}).execute(env=env)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(HTMLExporter().from_notebook_node(book)[0])
    return out
