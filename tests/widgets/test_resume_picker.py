"""The "Resume…" picker says how the run stopped, lists its checkpoints with
their size (sharded ones with their shards and ranks) and what each leaves to
redo, and choosing one (as the browser's "Choose" does) makes it the
checkpoint ``load_checkpoint("resume")`` restores. It never says two things
that contradict each other: a choice a resume used, or a later choice
replaced, or on a run since closed, is history, not a green confirmation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from lhtest import child_env, run_python
from widget_runs import RESUMED_FROM, STOPPED_CRASH_AT, StoppedRun, WidgetRuns

import launchhelm as lh
from launchhelm.widgets import ResumePicker

CLOSED = 'This run is closed, so no load_checkpoint("resume") will restore any of its checkpoints.'


def _click(widget: ResumePicker, name: str, **args: object) -> None:
    """A button press as the front end sends it, through ipywidgets' dispatch."""
    content = {"type": "action", "name": name, "args": args}
    widget._handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": []})


def test_the_picker_says_the_run_stopped_and_lists_its_checkpoints(stopped_run: StoppedRun) -> None:
    picker = ResumePicker(stopped_run.id, store=stopped_run.store)
    state = picker.state
    assert state["status"] == "stopped"
    assert state["sentence"].startswith("stopped without ending its session, last heartbeat 20")
    # then how its last attempt ended, when its helper process could tell (it ends a killed session as crashed)
    head, _, detail = state["sentence"].partition("; ")
    assert head.endswith(", furthest step 30"), state["sentence"]
    assert detail == "" or detail.startswith("its last attempt ended crashed (the training process"), detail
    rows = state["checkpoints"]
    assert [(r["step"], r["steps_to_redo"]) for r in rows] == [(20, 10), (10, 20)]  # newest first
    assert [r["latest"] for r in rows] == [True, False]
    # lr changed after the step-10 save: restoring that one brings lr back to 0.1
    assert [r["before_last_control_change"] for r in rows] == [False, True]
    assert not any(r["chosen"] for r in rows)
    assert "restores step 20 (the latest" in state["restores"]
    # run.checkpoint() of a 1,024-byte file: not sharded
    assert [(r["size"], r["shards"], r["layout"]) for r in rows] == [("1.0 kB", 0, "")] * 2
    assert state["confirmation"] == state["earlier"] == ""
    picker.close()


@pytest.mark.slow
def test_choose_makes_that_checkpoint_the_one_resume_restores(stopped_run: StoppedRun) -> None:
    picker = ResumePicker(stopped_run.id, store=stopped_run.store)
    older = picker.state["checkpoints"][1]
    _click(picker, "choose", checkpoint_id=older["id"])
    assert picker.error == ""
    handle = lh.Api(stopped_run.store).run(stopped_run.id)
    chosen = handle.resume_checkpoint()
    assert chosen is not None and chosen.id == older["id"] and chosen.step == 10
    assert picker.state["confirmation"] == (
        f'Chosen: the next load_checkpoint("resume") restores step 10 (checkpoint {older["id"]}).'
    )
    assert [r["chosen"] for r in picker.state["checkpoints"]] == [False, True]
    assert picker.state["earlier"] == ""
    picker.close()


@pytest.mark.slow
def test_a_choice_replaced_elsewhere_is_history_not_a_confirmation(stopped_run: StoppedRun) -> None:
    picker = ResumePicker(stopped_run.id, store=stopped_run.store)
    newer, older = picker.state["checkpoints"]
    picker.choose(older["id"])
    assert picker.state["confirmation"].startswith("Chosen: ")
    lh.Api(stopped_run.store).run(stopped_run.id).choose_for_resume(newer["id"])  # someone else, another notebook
    picker.refresh()
    state = picker.state
    assert state["confirmation"] == ""
    assert state["earlier"] == (
        f"Chosen earlier: step 10 (replaced by a later choice, step 20; checkpoint {older['id']})."
    )
    assert state["restores"] == (
        f'The next load_checkpoint("resume") restores step 20 (chosen, checkpoint {newer["id"]}).'
    )
    assert [r["chosen"] for r in state["checkpoints"]] == [True, False]
    picker.close()


@pytest.mark.slow
def test_on_a_run_closed_after_the_choice_nothing_says_a_resume_will_restore(stopped_run: StoppedRun) -> None:
    picker = ResumePicker(stopped_run.id, store=stopped_run.store)
    older = picker.state["checkpoints"][1]
    picker.choose(older["id"])
    lh.init("plain", resume=stopped_run.id, store=stopped_run.store).finish()  # closes it; no load consumed the choice
    picker.refresh()
    state = picker.state
    assert state["status"] == "closed" and not state["can_choose"]
    assert state["restores"] == CLOSED
    assert state["confirmation"] == ""
    assert state["earlier"] == f"Chosen earlier: step 10 (not used: the run was closed; checkpoint {older['id']})."
    assert not any(r["chosen"] for r in state["checkpoints"])
    assert "step 10" in picker.static_mimebundle()["text/html"]  # the saved notebook's copy says the same
    assert "Chosen:" not in picker.static_mimebundle()["text/html"]
    picker.close()


@pytest.mark.slow
def test_choosing_an_unknown_checkpoint_shows_why_and_changes_nothing(stopped_run: StoppedRun) -> None:
    picker = ResumePicker(stopped_run.id, store=stopped_run.store)
    _click(picker, "choose", checkpoint_id="ckpt-nope")
    assert "has no checkpoint 'ckpt-nope'" in picker.error
    assert lh.Api(stopped_run.store).run(stopped_run.id).resume_checkpoint().step == 20  # type: ignore[union-attr]
    picker.close()


@pytest.mark.slow
def test_a_resumed_pytorch_process_restores_the_step_chosen_in_the_picker(widget_runs: WidgetRuns) -> None:
    picker = ResumePicker(widget_runs.stopped, store=widget_runs.store)
    assert f"furthest step {STOPPED_CRASH_AT}" in picker.state["sentence"]
    target = next(r for r in picker.state["checkpoints"] if r["step"] == RESUMED_FROM)
    _click(picker, "choose", checkpoint_id=target["id"])
    done = run_python(
        """
        import sys, torch
        import launchhelm.torch as lht
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        tr = lht.init("widgets", resume=sys.argv[2], store=sys.argv[1])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        tr.watch(model, optimizer)
        tr.load_checkpoint("resume")
        print("restored", tr.global_step, dict(tr.tunables)["lr"])
        for _ in range(3):  # three more steps, then a checkpoint at RESUMED_FROM + 3
            optimizer.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            optimizer.step()
        tr.save_checkpoint()
        tr.finish()
        """,
        widget_runs.store,
        widget_runs.stopped,
    )
    assert done.returncode == 0, done.stderr
    # step 64 was saved before lr changed to 0.01: its tunables come back too
    assert done.stdout.split() == ["restored", str(RESUMED_FROM), "0.05"]
    # the picker left open: the choice was consumed and the run closed; one story, not two
    picker.refresh()
    state = picker.state
    assert state["status"] == "closed"
    assert state["checkpoints"][0]["step"] == RESUMED_FROM + 3 and state["checkpoints"][0]["latest"]
    assert state["restores"] == CLOSED
    assert state["confirmation"] == ""
    assert state["earlier"] == (
        f"Chosen earlier: step {RESUMED_FROM} (already used by a resume; checkpoint {target['id']})."
    )
    assert not any(r["chosen"] for r in state["checkpoints"])
    picker.close()


FSDP2_RUN = """
import sys, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
import launchhelm.torch as lht
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
for layer in model:
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
tr = lht.init("picker", store=sys.argv[1], system_metrics=False)
tr.watch(model, optimizer)
for _ in range(2):
    optimizer.zero_grad()
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    tr.save_checkpoint()
if tr.rank == 0:
    print("run", tr.id, flush=True)
tr.finish(close_run=False)
dist.barrier()
dist.destroy_process_group()
# torch 2.13's gloo threads outlive destroy_process_group and now and then abort a rank at
# interpreter teardown (see tests/torch/ddp_worker.py): run the exit hooks, then leave without it
import atexit, os
atexit._run_exitfuncs()
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.slow
def test_a_sharded_checkpoint_shows_its_size_shards_and_ranks(tmp_path: Path) -> None:
    """FSDP2 on two gloo ranks under torchrun saves /3 checkpoints; the picker counts their shard objects."""
    script = tmp_path / "fsdp2_run.py"
    script.write_text(FSDP2_RUN)
    store = str(tmp_path / "store")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run([*torchrun, str(script), store], capture_output=True, text=True, env=child_env(), timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    run_id = done.stdout.split("run ", 1)[1].split()[0]
    checkpoints = lh.Api(store).run(run_id).checkpoints()
    assert [(c.format, c.world_size) for c in checkpoints] == [("launchhelm.torch.checkpoint/3", 2)] * 2
    picker = ResumePicker(run_id, store=store)
    rows = picker.state["checkpoints"]
    for row, ckpt in zip(rows, reversed(checkpoints), strict=True):
        objects = [name for name in ckpt.files if name != "manifest.json"]
        assert len(objects) >= 2  # each rank wrote the shards it holds
        assert row["shards"] == len(objects)
        assert row["layout"] == f"{len(objects)} shards, saved on 2 ranks"
        assert row["size"].endswith(" kB") and ckpt.size == sum(ckpt.files.values())
    assert "shards, saved on 2 ranks" in picker.static_mimebundle()["text/html"]
    picker.close()
