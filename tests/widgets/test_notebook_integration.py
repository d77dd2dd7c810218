"""Notebook integration without a browser: ``import launchhelm`` stays light,
a run left as a cell's last expression displays as its panel inside a
Jupyter kernel (and as plain text elsewhere), ``%load_ext launchhelm`` and
its ``%launchhelm`` magic work.

Each check runs in a fresh interpreter: IPython's shell is a process-wide
singleton. The kernel is ipykernel's in-process kernel, a real one.
"""

from __future__ import annotations

import json

from lhtest import run_python
from widget_runs import StoppedRun


def test_import_launchhelm_loads_no_notebook_dependency() -> None:
    done = run_python(
        """
        import sys
        import launchhelm as lh, launchhelm.widgets
        lh.load_ipython_extension        # %load_ext's hook exists...
        repr(lh.Api)                     # ...and nothing heavy came with it
        heavy = ("IPython", "anywidget", "ipywidgets", "traitlets", "altair", "pandas", "comm")
        print(",".join(m for m in heavy if m in sys.modules) or "none")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none"


DISPLAY = """
import json, sys
from ipykernel.inprocess.manager import InProcessKernelManager
import launchhelm as lh

store, run_id = sys.argv[1], sys.argv[2]
handle = lh.Api(store).run(run_id)
outside = handle._repr_mimebundle_()          # no kernel yet: plain text only

manager = InProcessKernelManager()
manager.start_kernel()
shell = manager.kernel.shell
shell.user_ns.update(handle=handle, lh=lh, store=store, run_id=run_id)
first, _ = shell.display_formatter.format(handle)            # how a cell's last expression shows
again, _ = shell.display_formatter.format(lh.Api(store).run(run_id))   # the cell run again
import launchhelm.widgets._panel as panel_module
from launchhelm.widgets import RunPanel
panel = RunPanel(run_id, store=store)
live = lh.init("plain", store=store)
of_run, _ = shell.display_formatter.format(live)
print(json.dumps({
    "outside": sorted(outside),
    "first": sorted(first),
    "text": first["text/plain"],
    "model": first["application/vnd.jupyter.widget-view+json"]["model_id"],
    "again": again["application/vnd.jupyter.widget-view+json"]["model_id"],
    "panel": panel.model_id,
    "tabs": list(panel.tabs.titles),
    "chart_keys": [p["title"] for p in panel.chart.spec["vconcat"]],
    "picker": panel.picker.state["sentence"],
    "run_text": of_run["text/plain"],
    "run_has_panel": "application/vnd.jupyter.widget-view+json" in of_run,
}))
live.finish()
panel.close()
manager.shutdown_kernel()
"""


def test_a_run_left_as_a_cells_last_expression_displays_as_its_panel(stopped_run: StoppedRun) -> None:
    done = run_python(DISPLAY, stopped_run.store, stopped_run.id, PYDEVD_DISABLE_FILE_VALIDATION="1")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert shown["outside"] == ["text/plain"]
    assert shown["first"] == ["application/vnd.jupyter.widget-view+json", "text/plain"]
    assert shown["text"].startswith(f"<launchhelm.RunHandle plain/{stopped_run.id} 'plain-stopped'>")
    assert shown["model"] == shown["again"] == shown["panel"]  # re-running reattaches
    assert shown["tabs"] == ["Charts", "Checkpoints", "Evaluations", "Details"]
    assert shown["chart_keys"] == ["loss"]
    assert shown["picker"].startswith("stopped without ending its session")
    assert shown["run_text"].startswith("<launchhelm.Run plain/") and shown["run_has_panel"]


MAGICS = """
import json, sys
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

store, run_id = sys.argv[1], sys.argv[2]
shell = InteractiveShell.instance()
shell.user_ns["STORE"] = store
shell.run_line_magic("load_ext", "launchhelm")
runs = shell.run_line_magic("launchhelm", "runs plain --store $STORE")
panel = shell.run_line_magic("launchhelm", f"show {run_id} --store {store}")
picker = shell.run_line_magic("launchhelm", f"resume --store {store} {run_id}")
chart = shell.run_line_magic("launchhelm", f"chart {run_id} loss --store {store}")
table = shell.run_line_magic("launchhelm", f"evaluations plain --store {store}")
errors = []
for line in ("", "show", "bogus x", f"show nosuchrun --store {store}", "runs 'unclosed"):
    try:
        shell.run_line_magic("launchhelm", line)
    except UsageError as exc:
        errors.append(str(exc).splitlines()[0])
print(json.dumps({
    "runs": runs[["id", "name", "status", "step"]].values.tolist(),
    "panel": type(panel).__name__, "panel_run": panel.run.id,
    "picker": type(picker).__name__, "picker_run": picker.run.id,
    "chart": [p["title"] for p in chart.spec["vconcat"]],
    "table": table.state["scope"],
    "errors": errors,
}))
for widget in (panel, picker, chart, table):
    widget.close()
"""


def test_load_ext_and_the_launchhelm_magic(stopped_run: StoppedRun) -> None:
    done = run_python(MAGICS, stopped_run.store, stopped_run.id)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["runs"] == [[stopped_run.id, "plain-stopped", "stopped", 30]]
    assert (out["panel"], out["panel_run"]) == ("RunPanel", stopped_run.id)
    assert (out["picker"], out["picker_run"]) == ("ResumePicker", stopped_run.id)
    assert out["chart"] == ["loss"] and out["table"] == "project"
    assert "%launchhelm runs PROJECT" in done.stdout  # the bare magic prints its usage
    assert out["errors"][0] == "the following arguments are required: run"
    assert out["errors"][1].startswith("argument command: invalid choice: 'bogus'")
    assert out["errors"][2].startswith("%launchhelm show: ") and "nosuchrun" in out["errors"][2]
    assert out["errors"][3] == "No closing quotation"
