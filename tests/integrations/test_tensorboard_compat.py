"""A script written for TensorBoard's ``SummaryWriter`` runs on LaunchHelm with one changed import line.

What a user would notice if these failed: a loss curve that differs from the
one their script logged, or lands in an unexpected project or run; hparams
missing from the config; an ``add_histogram`` lost or an ``add_graph`` that breaks
the script; a restarted script (``purge_step``) that starts a second run.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest
from lhtest import make_store_url, run_python

import launchhelm as lh
from launchhelm.tensorboard import SummaryWriter, stored_texts

#: The PyTorch TensorBoard tutorial's use of the writer, on a tiny model.
TUTORIAL = """
import json, math, sys
import torch
from torch.utils.tensorboard import SummaryWriter

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 4)
y = x.sum(dim=1, keepdim=True)
writer = SummaryWriter("runs/fashion_mnist_experiment_1")
writer.add_graph(model, x)
losses = []
for step in range(12):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    writer.add_scalar("Loss/train", loss, step)          # a tensor, as the tutorial passes it
    losses.append(loss.item())
    if step % 4 == 0:
        writer.add_scalars("run_14h", {"xsinx": step * math.sin(step), "xcosx": step * math.cos(step)}, step)
        writer.add_histogram("fc.weight", model.weight, step)
writer.add_text("notes", "lr=0.1, tiny linear model", 0)
writer.add_hparams({"lr": 0.1, "bsize": 32, "optimizer": "SGD"}, {"hparam/loss": losses[-1]})
writer.close()
print("RESULT", json.dumps({"losses": losses, "dir": writer.log_dir}))
"""


def swap_import(script: str) -> str:
    """The user's one change: torch's writer becomes LaunchHelm's."""
    line = "from torch.utils.tensorboard import SummaryWriter\n"
    assert script.count(line) == 1
    return script.replace(line, "from launchhelm.tensorboard import SummaryWriter\n")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_the_tutorial_script_stores_exactly_what_it_logged(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store_url(backend, tmp_path, request)
    work = tmp_path / "work"
    work.mkdir()
    script = "import os; os.chdir(sys.argv[1])\n".join(["import sys\n", swap_import(TUTORIAL)])
    done = run_python(script, str(work), LAUNCHHELM_STORE=store, LAUNCHHELM_SYSTEM_METRICS="false")
    assert done.returncode == 0, done.stderr
    result = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT ")).split(" ", 1)[1])
    losses = result["losses"]
    assert (work / "runs" / "fashion_mnist_experiment_1").is_dir()  # made, as torch makes it
    # one warning per method skipped, naming it
    assert "add_histogram" not in done.stderr  # stored now (test_tensorboard_media.py checks its buckets)
    assert done.stderr.count("add_graph is accepted but not stored") == 1

    api = lh.Api(store)
    assert api.projects() == ["runs"]  # log_dir's parent folder
    table = api.runs("runs").set_index("name")
    assert sorted(table.index) == ["fashion_mnist_experiment_1", *[n for n in table.index if "/" in n]]
    handle = api.run(str(table.loc["fashion_mnist_experiment_1", "id"]))
    assert handle.status == "closed"
    frame = handle.history()
    loss = frame.dropna(subset=["Loss/train"])
    assert loss["step"].tolist() == list(range(12))
    assert loss["Loss/train"].tolist() == losses  # float64: exactly what .item() gave
    scalars = frame.dropna(subset=["run_14h/xsinx"])
    assert scalars["step"].tolist() == [0, 4, 8]
    assert scalars["run_14h/xsinx"].tolist() == [s * math.sin(s) for s in (0, 4, 8)]
    assert scalars["run_14h/xcosx"].tolist() == [s * math.cos(s) for s in (0, 4, 8)]
    assert not any("weight" in c for c in frame.columns)
    assert [(i.key, i.step, i.kind) for i in handle.media()] == [("fc.weight", s, "histogram") for s in (0, 4, 8)]
    assert stored_texts(handle.id, store=store) == [
        {"tag": "notes", "step": 0, "time": pytest.approx(handle.created, abs=600), "text": "lr=0.1, tiny linear model"}
    ]

    # add_hparams: a run of its own, as torch writes a sub-folder: hparams as config, the metric at step 0
    [hp_name] = [n for n in table.index if "/" in n]
    assert hp_name.startswith("fashion_mnist_experiment_1/")
    hp = api.run(str(table.loc[hp_name, "id"]))
    assert dict(hp.config) == {"lr": 0.1, "bsize": 32, "optimizer": "SGD"}
    assert hp.history()[["step", "hparam/loss"]].to_dict("records") == [{"step": 0, "hparam/loss": losses[-1]}]
    assert hp.status == "closed"


def test_steps_default_to_zero_and_project_and_name_follow_log_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = str(tmp_path / "store")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LAUNCHHELM_PROJECT", raising=False)
    with SummaryWriter(comment="_lr0.1", store=store, capture_console=False, system_metrics=False) as writer:
        assert writer.log_dir.startswith("runs/") and writer.log_dir.endswith("_lr0.1")
        writer.add_scalar("a", 1.5)  # no step: 0, as torch's event step
        writer.add_scalar("a", 2.5)
        writer.add_scalar("b", 7, global_step=3.0)  # torch takes int(global_step)
        run_id = writer.run_id
    handle = lh.Api(store).run(run_id)
    assert (handle.project, handle.name) == ("runs", Path(writer.log_dir).name)
    # both points are at step 0, as in torch's event file; history() shows one value per step: the last
    points = handle.history().dropna(subset=["a"])
    assert points[["step", "a"]].to_dict("records") == [{"step": 0, "a": 2.5}]
    assert handle.history().dropna(subset=["b"])[["step", "b"]].to_dict("records") == [{"step": 3, "b": 7.0}]
    with pytest.raises(lh.RunFinishedError, match="closed"):
        writer.add_scalar("a", 1.0, 4)

    monkeypatch.setenv("LAUNCHHELM_PROJECT", "from-env")
    with SummaryWriter("exp", store=store, capture_console=False, system_metrics=False) as other:
        other.add_scalar("x", 1.0, 0)
    assert lh.Api(store).run(other.run_id).project == "from-env"
    with SummaryWriter("exp", project="given", store=store, capture_console=False, system_metrics=False) as third:
        pass
    assert third.project == "given"


def test_purge_step_resumes_the_same_run_and_rewinds(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    log_dir = str(tmp_path / "runs" / "resumable")
    options = {"store": store, "capture_console": False, "system_metrics": False}
    with pytest.raises(RuntimeError, match="preempted"), SummaryWriter(log_dir, **options) as writer:
        for step in range(10):
            writer.add_scalar("loss", float(step), step)
        writer.add_text("t", "before", 8)
        raise RuntimeError("preempted")
    assert lh.Api(store).run(writer.run_id).status == "resumable"

    with SummaryWriter(log_dir, purge_step=6, **options) as again:
        assert again.run_id == writer.run_id
        for step in range(6, 8):
            again.add_scalar("loss", -float(step), step)
    handle = lh.Api(store).run(writer.run_id)
    [rewind] = handle.rewinds()
    assert (rewind.to_step, rewind.reached) == (5, 9)
    last = handle.history(duplicates="last").set_index("step")["loss"]
    assert last.loc[6:7].tolist() == [-6.0, -7.0]
    assert last.loc[0:5].tolist() == [float(s) for s in range(6)]
    assert stored_texts(writer.run_id, store=store) == []  # purged with the steps it was logged at


def test_bad_input_is_refused_clearly(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    with SummaryWriter(str(tmp_path / "runs" / "bad"), store=store, capture_console=False) as writer:
        with pytest.raises(lh.InvalidTypeError, match="hparam_dict"):
            writer.add_hparams([("lr", 0.1)], {})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="loss"):
            writer.add_scalar("loss", "high", 0)
        with pytest.raises(TypeError, match="global_step"):
            writer.add_scalar("loss", 1.0, "one")  # type: ignore[arg-type]
        writer.add_scalar("loss", 1.0, 1)
    assert lh.Api(store).run(writer.run_id).history()["loss"].tolist() == [1.0]


@pytest.mark.slow
def test_same_script_runs_under_torch_writer_unchanged(tmp_path: Path) -> None:
    # the tutorial is a real torch.utils.tensorboard script: it runs as written with torch's own writer
    done = run_python(textwrap.dedent("import os, sys; os.chdir(sys.argv[1])\n") + TUTORIAL, str(tmp_path))
    assert done.returncode == 0, done.stderr
