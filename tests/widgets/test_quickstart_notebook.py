"""notebooks/quickstart.ipynb runs top to bottom in a real kernel: a PyTorch
run killed by SIGKILL from the notebook, a checkpoint chosen in the picker,
``tr.load_checkpoint("resume")`` in a cell restoring it, its rewind charted, its checkpoints evaluated."""

from __future__ import annotations

from pathlib import Path

import pytest
from lhtest import ROOT

import launchhelm as lh

WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.mark.slow
def test_the_quickstart_notebook_runs_and_shows_its_widgets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    store = tmp_path / "store"
    monkeypatch.setenv("LAUNCHHELM_STORE", str(store))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    notebook = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
    ).execute()

    outputs = [cell.get("outputs", []) for cell in notebook.cells if cell.cell_type == "code"]
    text = "\n".join(o.get("text", "") for cell in outputs for o in cell if o.get("output_type") == "stream")
    assert "holding at step 110" in text and "killed at step 110 | exit code -9" in text
    assert 'Chosen: the next load_checkpoint("resume") restores step 40' in text
    assert "restored step 40" in text and "finished at step 160" in text
    assert "['Resumed from step 40 after reaching 110']" in text
    widgets = [o for cell in outputs for o in cell if WIDGET in o.get("data", {})]
    assert len(widgets) == 6  # the runs table, the panel, the picker, two charts, the evaluation table
    assert any("stopped" in o.get("data", {}).get("text/html", "") for cell in outputs for o in cell)  # runs table

    api = lh.Api(str(store))
    (run_id,) = api.run_ids("quickstart")
    run = api.run(run_id)
    assert run.status == "closed" and [r.describe() for r in run.rewinds()] == [
        "Resumed from step 40 after reaching 110"
    ]
    assert {e.state for e in run.evaluations()} == {"done"} and len(run.evaluations()) == len(run.checkpoints()) == 5
    assert run.history(keys=["eval/accuracy"])["eval/accuracy"].notna().sum() == 5
    assert run.tunables["lr"] == 0.1  # the change made in the notebook, applied after the restore
