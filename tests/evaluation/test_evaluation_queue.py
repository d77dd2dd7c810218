"""The evaluation queue a user sees: the project rule queues each new checkpoint
exactly once, "Evaluate this checkpoint" and "Try again" refuse what they
cannot do, a checkpoint whose training process died before queueing it is
still evaluated, and a broken queue never costs a checkpoint."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from evaluation_helpers import checkpointed_run, objects, publish_without_queueing
from lhtest import spawn

import launchhelm as lh
from launchhelm._evaluation._queue import EvaluationQueue
from launchhelm.storage import open_store


@pytest.mark.slow
def test_rule_queues_each_checkpoint_saved_while_it_is_on(store_url: str, tmp_path: Path) -> None:
    api = lh.Api(store_url)
    project = api.project("evals")
    assert project.evaluate_every_checkpoint() is False  # off until someone turns it on
    run = lh.init("evals", store=store_url)
    payload = tmp_path / "w.txt"
    payload.write_text("x")
    run.global_step = 10
    before = run.checkpoint(payload)
    assert project.evaluate_every_checkpoint(True) is True
    assert lh.Api(store_url).project("evals").evaluate_every_checkpoint() is True  # another reader sees it
    covered = []
    for step in (20, 30):
        run.global_step = step
        covered.append(run.checkpoint(payload))
    assert project.evaluate_every_checkpoint(False) is False
    run.global_step = 40
    after = run.checkpoint(payload)
    run.finish()

    listed = api.run(run.id).evaluations()
    assert [(e.checkpoint, e.step, e.state, e.reason) for e in listed] == [
        (covered[0], 20, "queued", "rule"),
        (covered[1], 30, "queued", "rule"),
    ]
    assert before not in {e.checkpoint for e in listed} and after not in {e.checkpoint for e in listed}
    assert [e.id for e in project.evaluations()] == [f"{run.id}-{c}" for c in covered]
    assert project.evaluations(state="done") == []
    # setting what is already set writes nothing new
    project.evaluate_every_checkpoint(False)
    assert len(open_store(store_url).list("projects/evals/rules")) == 2


@pytest.mark.slow
def test_racing_threads_queue_one_evaluation(store_url: str, tmp_path: Path) -> None:
    run, (checkpoint,) = checkpointed_run(store_url, tmp_path, [5])
    event = lh.Api(store_url).run(run.id)._state().checkpoint(checkpoint)
    assert event is not None
    created: list[bool] = []
    records: list[lh.Evaluation] = []
    barrier = threading.Barrier(8)

    def racer(i: int) -> None:
        store = open_store(store_url)  # each its own client and caches, as separate processes would have
        barrier.wait()
        if i % 2:
            created.append(EvaluationQueue(store, "evals").queue(run.id, event, "rule"))
        else:
            records.append(lh.Api(store).run(run.id).evaluate(checkpoint))

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    requests = [k for k in objects(store_url, "projects/evals/evaluations") if k.endswith("request.json")]
    assert len(requests) == 1
    assert created.count(True) <= 1 and len(created) == 4
    assert {r.id for r in records} == {f"{run.id}-{checkpoint}"}
    assert len(lh.Api(store_url).run(run.id).evaluations()) == 1


@pytest.mark.slow
def test_racing_processes_queue_one_evaluation(shared_store_url: str, tmp_path: Path) -> None:
    run, (checkpoint,) = checkpointed_run(shared_store_url, tmp_path, [5])
    go = tmp_path / "go"
    code = """
        import os, sys, time
        import launchhelm as lh
        from launchhelm._evaluation._queue import EvaluationQueue
        store, run_id, checkpoint, go = sys.argv[1:]
        api = lh.Api(store)
        event = api.run(run_id)._state().checkpoint(checkpoint)
        print("ready", flush=True)
        while not os.path.exists(go):
            time.sleep(0.001)
        print(EvaluationQueue(api.store, "evals").queue(run_id, event, "rule"), flush=True)
    """
    racers = [spawn(code, shared_store_url, run.id, checkpoint, str(go)) for _ in range(4)]
    for proc in racers:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    go.touch()
    answers = []
    for proc in racers:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        answers.append(out.strip())
    assert sorted(answers) == ["False", "False", "False", "True"]
    assert len(lh.Api(shared_store_url).run(run.id).evaluations()) == 1


def test_evaluate_queues_an_old_checkpoint_once_and_refuses_unknown_ones(store_url: str, tmp_path: Path) -> None:
    run, ids = checkpointed_run(store_url, tmp_path, [10, 20])  # the rule is off
    handle = lh.Api(store_url).run(run.id)
    assert handle.evaluations() == []
    first = handle.evaluate(ids[0])
    assert (first.checkpoint, first.step, first.state, first.reason, first.attempts) == (
        ids[0],
        10,
        "queued",
        "manual",
        0,
    )
    again = handle.evaluate(ids[0])  # pressing the button twice queues nothing more
    assert again.id == first.id and again.queued_at == first.queued_at
    assert [e.checkpoint for e in handle.evaluations()] == [ids[0]]
    with pytest.raises(lh.CheckpointError, match=f"run {run.id} has no checkpoint 'ckpt-nope'.*{ids[-1]}"):
        handle.evaluate("ckpt-nope")
    assert len(handle.evaluations()) == 1


def test_retry_and_lookup_errors_are_clear(store_url: str, tmp_path: Path) -> None:
    run, ids = checkpointed_run(store_url, tmp_path, [10])
    api = lh.Api(store_url)
    queued = api.run(run.id).evaluate(ids[0])
    with pytest.raises(
        lh.EvaluationStateError, match="only a failed evaluation can be tried again, and it is still queued"
    ):
        api.evaluation(queued.id).retry()
    with pytest.raises(ValueError, match="invalid evaluation id 'nonsense'"):
        api.evaluation("nonsense")
    with pytest.raises(lh.EvaluationNotFoundError, match=f"no evaluation '{run.id}-ckpt-00000099-aaaaaaaa' is queued"):
        api.evaluation(f"{run.id}-ckpt-00000099-aaaaaaaa")
    with pytest.raises(lh.RunNotFoundError):
        api.evaluation("zzzzzzzz-ckpt-00000010-aaaaaaaa")
    assert api.evaluation(queued.id).state == "queued"
    with pytest.raises(TypeError, match="pass True, False"):
        api.project("evals").evaluate_every_checkpoint("yes")  # type: ignore[arg-type]


def test_worker_queues_covered_checkpoints_nobody_queued(store_url: str, tmp_path: Path) -> None:
    run = lh.init("evals", store=store_url)
    payload = tmp_path / "w.txt"
    payload.write_text("3")
    run.global_step = 5
    old = run.checkpoint(payload)  # before the rule: not to be evaluated
    time.sleep(0.01)
    lh.Api(store_url).project("evals").evaluate_every_checkpoint(True)
    orphan = publish_without_queueing(run, payload, 7)
    handle = lh.Api(store_url).run(run.id)
    assert handle.evaluations() == []

    @lh.evaluate(project="evals", store=store_url)
    def score(ctx: lh.EvaluationContext) -> dict[str, float]:
        return {"value": float(ctx.download_to(tmp_path / "dl").read_text())}

    assert score.serve(stop_when_idle=True) == 1
    (done,) = handle.evaluations()
    assert (done.checkpoint, done.state, done.scores) == (orphan, "done", {"value": 3.0})
    assert old not in {e.checkpoint for e in handle.evaluations()}
    run.finish()


def test_a_broken_queue_never_fails_the_save(store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(store_url)
    store.create("projects/evals/rules/evaluate_every_checkpoint/00000000000000000001.json", b"{broken")
    run = lh.init("evals", store=store_url)
    payload = tmp_path / "w.txt"
    payload.write_text("1")
    with caplog.at_level(logging.WARNING, logger="launchhelm"):
        saved = run.checkpoint(payload)
    run.finish()
    assert [c.id for c in lh.Api(store_url).run(run.id).checkpoints()] == [saved]
    assert f"checkpoint {saved} of run {run.id} is saved, but queueing its evaluation failed" in caplog.text
