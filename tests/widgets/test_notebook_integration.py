"""Notebook integration without a browser: ``import launchhelm`` stays light,
a run left as a cell's last expression displays as its panel inside a
Jupyter kernel (and as plain text elsewhere), ``%load_ext launchhelm`` and
its ``%launchhelm`` magic work.

Each check runs in a fresh interpreter: IPython's shell is a process-wide
singleton. The kernel is ipykernel's in-process kernel, a real one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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


@pytest.mark.slow
def test_a_run_left_as_a_cells_last_expression_displays_as_its_panel(stopped_run: StoppedRun) -> None:
    done = run_python(DISPLAY, stopped_run.store, stopped_run.id, PYDEVD_DISABLE_FILE_VALIDATION="1")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert shown["outside"] == ["text/plain"]
    # the live view and its text (the static picture a saved notebook shows is an output of its own:
    # tests/widgets/test_saved_notebook.py)
    assert shown["first"] == ["application/vnd.jupyter.widget-view+json", "text/plain"]
    assert shown["text"].startswith(f"<launchhelm.RunHandle plain/{stopped_run.id} 'plain-stopped'>")
    assert shown["model"] == shown["again"] == shown["panel"]  # re-running reattaches
    assert shown["tabs"] == ["Charts", "Checkpoints", "Evaluations", "Details", "Logs", "Media"]
    assert shown["chart_keys"] == ["loss"]
    assert shown["picker"].startswith("stopped without ending its session")
    assert shown["run_text"].startswith("<launchhelm.Run plain/") and shown["run_has_panel"]


MAGICS = """
import json, os, sys
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

store, run_id, other = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ.pop("LAUNCHHELM_STORE", None)
shell = InteractiveShell.instance()
shell.user_ns["STORE"] = store
shell.run_line_magic("load_ext", "launchhelm")
runs = shell.run_line_magic("launchhelm", "runs plain --store $STORE")
shell.run_line_magic("launchhelm", "store")                    # prints the default
shell.run_line_magic("launchhelm", f"store {store}")           # the store from now on
shell.run_line_magic("launchhelm", "store")                    # prints it
import launchhelm as lh
default_api = lh.Api().store.url
panel = shell.run_line_magic("launchhelm", f"show {run_id}")
picker = shell.run_line_magic("launchhelm", f"resume {run_id}")
media = shell.run_line_magic("launchhelm", f"media {run_id}")
chart = shell.run_line_magic("launchhelm", f"chart {run_id} loss")
table = shell.run_line_magic("launchhelm", "evals plain")
run_table = shell.run_line_magic("launchhelm", f"evaluations {run_id}")
elsewhere = shell.run_line_magic("launchhelm", f"runs plain --store {other}")   # --store: that command only
print("@@help")
shell.run_line_magic("launchhelm", "help")
print("@@pinfo")
shell.run_cell("%launchhelm?")
print("@@end")
errors = []
for line in ("show", "bogus x", "show nosuchrun", "runs 'unclosed", "runs nosuchproject",
             "store foo://nowhere", "chart", "show a b", "store /proc/1/x/store --store y", "show x --colour red",
             f"show {run_id} --store foo://nowhere"):
    try:
        shell.run_line_magic("launchhelm", line)
        errors.append(None)
    except UsageError as exc:
        errors.append(str(exc))
still = os.environ["LAUNCHHELM_STORE"]
print(json.dumps({
    "runs": runs[["id", "name", "status", "step"]].values.tolist(),
    "default_api": default_api,
    "panel": type(panel).__name__, "panel_run": panel.run.id,
    "picker": type(picker).__name__, "picker_run": picker.run.id,
    "media": type(media).__name__, "media_run": media.run.id,
    "chart": [p["title"] for p in chart.spec["vconcat"]],
    "table": table.state["scope"], "run_table": run_table.state["scope"],
    "elsewhere": len(elsewhere),
    "errors": errors, "still": still,
}))
for widget in (panel, picker, media, chart, table, run_table):
    widget.close()
"""


@pytest.mark.slow
def test_load_ext_and_the_launchhelm_magic(stopped_run: StoppedRun, tmp_path: Path) -> None:
    import launchhelm as lh

    other = tmp_path / "other-store"
    lh.init("plain", store=str(other)).finish()
    done = run_python(MAGICS, stopped_run.store, stopped_run.id, str(other))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["runs"] == [[stopped_run.id, "plain-stopped", "stopped", 30]]
    printed = done.stdout
    assert "store: " + str(Path("~/.launchhelm").expanduser()) + " (the default)" in printed
    assert f"store: {stopped_run.store} (1 project); used by %launchhelm" in printed
    assert f"store: {stopped_run.store} (set by %launchhelm store)" in printed
    assert out["default_api"] == stopped_run.store  # lh.Api() follows %launchhelm store
    assert (out["panel"], out["panel_run"]) == ("RunPanel", stopped_run.id)
    assert (out["picker"], out["picker_run"]) == ("ResumePicker", stopped_run.id)
    assert (out["media"], out["media_run"]) == ("MediaPanel", stopped_run.id)
    assert out["chart"] == ["loss"] and out["table"] == "project" and out["run_table"] == "run"
    assert out["elsewhere"] == 1 and out["still"] == stopped_run.store
    # help and %launchhelm? list every subcommand, one line each
    help_text = printed.split("@@help\n")[1].split("@@pinfo")[0]
    pinfo = printed.split("@@pinfo\n")[1].split("@@end")[0]
    commands = ("store [URL]", "runs PROJECT", "show RUN", "resume RUN", "media RUN", "chart RUN", "evals PROJECT|RUN")
    for command in (*commands, "help"):
        assert sum(line.startswith(f"%launchhelm {command}") for line in help_text.splitlines()) == 1
        assert f"%launchhelm {command}" in pinfo
    assert "alias: evaluations" in help_text
    errors = out["errors"]
    assert all(e is not None and "\n" not in e for e in errors), errors  # one line each
    assert errors[0] == "%launchhelm show: give a RUN (%launchhelm show RUN)"
    assert errors[1].startswith("%launchhelm: unknown command 'bogus'")
    assert errors[2].startswith("%launchhelm show: ") and "nosuchrun" in errors[2]
    assert errors[3] == '%launchhelm: No closing quotation in "runs \'unclosed"'
    assert errors[4].startswith("%launchhelm runs: no project 'nosuchproject' in the store") and "plain" in errors[4]
    assert errors[5].startswith("%launchhelm store: cannot open store foo://nowhere")
    assert errors[6] == "%launchhelm chart: give a RUN (%launchhelm chart RUN)"
    assert errors[7] == "%launchhelm show: one RUN only, got a b"
    assert errors[8] == "%launchhelm store: give the URL alone: %launchhelm store URL"
    assert errors[9] == "%launchhelm show: unknown option '--colour'; see %launchhelm help"
    assert errors[10].startswith("%launchhelm show: cannot open store foo://nowhere")


ERROR_CELLS = [
    "%load_ext launchhelm",
    "%launchhelm show nosuchrun",
    "%launchhelm store foo://nowhere",
    "%launchhelm runs",
    "%launchhelm store s3://launchhelm-no-such-bucket/x",
]


@pytest.mark.slow
def test_magic_errors_in_a_real_kernel_are_one_line_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in ERROR_CELLS])
    env_store = tmp_path / "store"
    client = NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    monkeypatch.setenv("LAUNCHHELM_STORE", str(env_store))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "nothing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there: unreachable
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    client.execute()
    for cell in notebook.cells[1:]:
        outputs = cell["outputs"]
        assert [o["output_type"] for o in outputs] == ["stream"], (cell.source, outputs)
        (text,) = (o["text"] for o in outputs)
        lines = text.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("UsageError: %launchhelm"), (cell.source, text)
        assert "Traceback" not in text
