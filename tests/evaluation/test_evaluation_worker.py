"""What a worker does for a user: scores land in the run's history as
eval/<name> at the checkpoint's step, bad scores and exceptions mark the
evaluation failed (with why) and the worker goes on, "Try again" re-runs a
failed one, Ctrl-C hands the evaluation to the next worker at once, a live
lease is renewed, and a lapsed one is fenced so its late result is dropped."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from evaluation_helpers import checkpointed_run, raw_points, results_by_evaluation
from lhtest import spawn

import launchhelm as lh
from launchhelm._evaluation._queue import EvaluationQueue
from launchhelm.storage import open_store


def _rule_on(store: str, project: str = "evals") -> None:
    lh.Api(store).project(project).evaluate_every_checkpoint(True)


@pytest.mark.slow
def test_scores_are_logged_at_the_checkpoint_step_beside_training_metrics(store_url: str, tmp_path: Path) -> None:
    _rule_on(store_url)
    run = lh.init("evals", store=store_url)
    payload = tmp_path / "w.txt"
    ids = []
    for step in (10, 20):
        run.global_step = step
        run.log({"loss": 1.0 / step})
        payload.write_text(str(step))
        ids.append(run.checkpoint(payload))
    # a restore back to step 10 after reaching 20: step 20 is redone as attempt 1
    run._record_rewind(10, ids[0], "load_checkpoint", reached=20)
    run.global_step = 20
    run.log({"loss": 0.01})
    payload.write_text("21")
    ids.append(run.checkpoint(payload))
    run.finish()
    seen: list[tuple[Any, ...]] = []
    downloads = tmp_path / "downloads"

    @lh.evaluate(project="evals", store=store_url, poll_interval=0.05)
    def score(ctx: lh.EvaluationContext) -> dict[str, float]:
        path = ctx.download_to(downloads)
        seen.append((ctx.checkpoint.id, ctx.checkpoint_id, ctx.step, ctx.run.id, path.name, path.exists()))
        return {"value": float(path.read_text()), "twice": 2 * float(path.read_text())}

    assert score.serve(stop_when_idle=True) == 3
    assert seen == [(c, c, s, run.id, "w.txt", True) for c, s in zip(ids, (10, 20, 20), strict=True)]
    assert not any(downloads.iterdir())  # removed once scored: a long-lived worker does not fill its disk
    handle = lh.Api(store_url).run(run.id)
    frame = handle.history().set_index(["step", "attempt"])
    assert (
        frame.loc[(10, 0), "loss"] == 0.1
        and frame.loc[(10, 0), "eval/value"] == 10.0
        and frame.loc[(10, 0), "eval/twice"] == 20.0
    )
    assert frame.loc[(20, 0), "eval/value"] == 20.0  # saved before the rewind: the abandoned attempt
    assert frame.loc[(20, 1), "eval/value"] == 21.0 and frame.loc[(20, 1), "loss"] == 0.01
    last = handle.history(duplicates="last").set_index("step")
    assert last.loc[20, "eval/value"] == 21.0
    # each score stored once, at the checkpoint's time
    points = [p for p in raw_points(store_url, run.id) if p["key"] == "eval/value"]
    assert sorted((p["step"], p["attempt"], p["value"]) for p in points) == [
        (10, 0, 10.0),
        (20, 0, 20.0),
        (20, 1, 21.0),
    ]
    saved_at = {c.id: c.saved_at for c in handle.checkpoints()}
    assert sorted(p["time"] for p in points) == sorted(saved_at.values())
    records = handle.evaluations()
    assert [(e.state, e.attempts, e.worker) for e in records] == [("done", 1, score.name)] * 3
    assert all(e.queued_at <= e.started_at <= e.finished_at for e in records)  # type: ignore[operator]
    assert records[0].scores == {"value": 10.0, "twice": 20.0}


def test_a_folder_checkpoint_downloads_as_a_folder_and_damage_fails_it(store_url: str, tmp_path: Path) -> None:
    _rule_on(store_url)
    run = lh.init("evals", store=store_url)
    folder = tmp_path / "ckpt"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("alpha")
    (folder / "sub" / "b.txt").write_text("beta")
    good = run.checkpoint(folder, step=1)
    damaged = run.checkpoint(folder, step=2)
    run.finish()
    store = open_store(store_url)
    store.put(f"runs/{run.id}/artifacts/{damaged}/sub/b.txt", b"BETA")  # same size, other bytes

    @lh.evaluate(project="evals", store=store_url)
    def score(ctx: lh.EvaluationContext) -> dict[str, float]:
        path = ctx.download_to(tmp_path / "dl", keep=True)
        assert path.is_dir() and path.name == ctx.checkpoint_id
        return {"chars": len((path / "a.txt").read_text() + (path / "sub" / "b.txt").read_text())}

    assert score.serve(stop_when_idle=True) == 2
    by_id = {e.checkpoint: e for e in lh.Api(store_url).run(run.id).evaluations()}
    assert by_id[good].state == "done" and by_id[good].scores == {"chars": 9.0}
    assert by_id[damaged].state == "failed"
    assert "CheckpointError: file 'sub/b.txt'" in str(by_id[damaged].error) and "crc64nvme" in str(by_id[damaged].error)
    assert (tmp_path / "dl" / good / "sub" / "b.txt").read_text() == "beta"  # keep=True kept it


def test_a_score_that_is_not_a_number_fails_naming_the_key(store_url: str, tmp_path: Path) -> None:
    _rule_on(store_url)
    run, _ = checkpointed_run(store_url, tmp_path, [10, 20])
    returns: dict[int, Any] = {10: {"ok": 1.0, "accuracy": "high"}, 20: [0.5]}

    @lh.evaluate(project="evals", store=store_url)
    def score(ctx: lh.EvaluationContext) -> Any:
        return returns[ctx.step]

    assert score.serve(stop_when_idle=True) == 2
    first, second = lh.Api(store_url).run(run.id).evaluations()
    assert first.state == "failed" and "score 'accuracy'" in str(first.error) and "str" in str(first.error)
    assert second.state == "failed" and "returned a list" in str(second.error)
    assert not [p for p in raw_points(store_url, run.id) if p["key"].startswith("eval/")]  # nothing half-logged


@pytest.mark.slow
def test_an_exception_fails_that_evaluation_and_try_again_reruns_it(store_url: str, tmp_path: Path) -> None:
    _rule_on(store_url)
    run, _ = checkpointed_run(store_url, tmp_path, [10, 20, 30])
    broken = {20}

    def scorer(ctx: lh.EvaluationContext) -> dict[str, float]:
        if ctx.step in broken:
            raise ValueError(f"no good at step {ctx.step}")
        return {"value": float(ctx.step)}

    worker = lh.evaluate(project="evals", store=store_url)(scorer)
    assert worker.serve(stop_when_idle=True) == 3  # the worker went on after the failure
    api = lh.Api(store_url)
    states = {e.step: e for e in api.run(run.id).evaluations()}
    assert [states[s].state for s in (10, 20, 30)] == ["done", "failed", "done"]
    failed = states[20]
    assert failed.error == "ValueError: no good at step 20" and failed.scores == {}
    assert failed.traceback is not None and 'raise ValueError(f"no good at step {ctx.step}")' in failed.traceback
    assert failed.describe() == "failed: ValueError: no good at step 20"

    with pytest.raises(lh.EvaluationStateError, match="it is done"):
        api.evaluation(states[10].id).retry()
    again = api.evaluation(failed.id).retry()
    assert (again.state, again.retries, again.error) == ("queued", 1, None)
    with pytest.raises(lh.EvaluationStateError, match="still queued"):
        api.evaluation(failed.id).retry()
    broken.clear()
    assert worker.serve(stop_when_idle=True) == 1
    final = api.evaluation(failed.id).record()
    assert (final.state, final.scores, final.attempts, final.retries) == ("done", {"value": 20.0}, 2, 1)
    history = api.run(run.id).history()
    assert history["eval/value"].dropna().tolist() == [10.0, 20.0, 30.0]


def test_ctrl_c_releases_the_lease_for_the_next_worker_at_once(store_url: str, tmp_path: Path) -> None:
    _rule_on(store_url)
    run, _ = checkpointed_run(store_url, tmp_path, [10])

    @lh.evaluate(project="evals", store=store_url, lease_seconds=600)
    def interrupted(ctx: lh.EvaluationContext) -> dict[str, float]:
        raise KeyboardInterrupt  # what Ctrl-C raises in the worker's main thread

    assert interrupted.serve() == 0  # returns cleanly instead of serving forever
    (record,) = lh.Api(store_url).run(run.id).evaluations()
    assert (record.state, record.attempts, record.worker) == ("queued", 1, None)

    @lh.evaluate(project="evals", store=store_url, lease_seconds=600, name="next")
    def score(ctx: lh.EvaluationContext) -> dict[str, float]:
        return {"value": 1.0}

    started = time.monotonic()
    assert score.serve(max_evaluations=1, stop_when_idle=True) == 1
    assert time.monotonic() - started < 30  # not the 600 s lease
    (record,) = lh.Api(store_url).run(run.id).evaluations()
    assert (record.state, record.attempts, record.worker) == ("done", 2, "next")


@pytest.mark.slow
def test_a_live_lease_is_renewed_and_shown_as_running(store_url: str, tmp_path: Path) -> None:
    _rule_on(store_url)
    run, _ = checkpointed_run(store_url, tmp_path, [10])
    other = EvaluationQueue(open_store(store_url), "evals")  # another worker's view
    observed: list[tuple[str, bool]] = []

    @lh.evaluate(project="evals", store=store_url, lease_seconds=1.0, name="holder")
    def slow(ctx: lh.EvaluationContext) -> dict[str, float]:
        deadline = time.monotonic() + 3.5  # three and a half leases
        while time.monotonic() < deadline:
            (record,) = lh.Api(store_url).run(run.id).evaluations()
            assert record.lease_expires is not None and record.started_at is not None
            (listed,) = other.scan().values()
            taken = other.try_claim(listed, "thief", 60) is not None
            observed.append((record.state, taken))
            assert record.worker == "holder" and record.lease_expires > time.time() - 0.5
            time.sleep(0.2)
        return {"value": 1.0}

    assert slow.serve(max_evaluations=1) == 1
    assert observed and all(o == ("running", False) for o in observed)
    (record,) = lh.Api(store_url).run(run.id).evaluations()
    assert (record.state, record.attempts, record.worker) == ("done", 1, "holder")


def test_a_lapsed_lease_is_fenced_and_its_late_result_dropped(store_url: str, tmp_path: Path) -> None:
    _rule_on(store_url)
    run, ids = checkpointed_run(store_url, tmp_path, [10, 20])
    stale = EvaluationQueue(open_store(store_url), "evals")
    fresh = EvaluationQueue(open_store(store_url), "evals")
    first, second = (stale.scan()[f"{run.id}-{c}"] for c in ids)
    outcome = {"state": "done", "step": 10, "run_attempt": 0, "point_time": time.time()}

    # 1. the holder stalls past its lease: taken over, fenced, its late result refused (a lease of 2 s: the
    # next scan and claim must come while it is live, a few requests away on a busy emulator)
    old = stale.try_claim(first, "stalled", lease_seconds=2.0)
    assert old is not None
    assert fresh.try_claim(fresh.scan()[first.id], "new", 60) is None  # still live
    time.sleep(2.2)
    new = fresh.try_claim(fresh.scan()[first.id], "new", 60)
    assert new is not None and new.epoch == old.epoch + 1
    assert stale.is_fenced(old) and not fresh.is_fenced(new)
    assert stale.publish(old, {**outcome, "scores": {"value": -1.0}}) is False
    assert fresh.publish(new, {**outcome, "scores": {"value": 10.0}}) is True
    fresh.finish(new, {**outcome, "scores": {"value": 10.0}})

    # 2. the holder publishes just before a takeover: the takeover backs off
    old = stale.try_claim(second, "slow", lease_seconds=0.3)
    assert old is not None
    time.sleep(0.5)
    lapsed = fresh.scan()[second.id]  # seen lapsed, before the result lands
    done = {**outcome, "step": 20, "scores": {"value": 20.0}}
    assert stale.publish(old, done) is True
    stale.finish(old, done)
    assert fresh.try_claim(lapsed, "late", 60) is None

    results = results_by_evaluation(store_url, "evals")
    assert {k: [r["scores"] for r in v] for k, v in results.items()} == {
        first.id: [{"value": 10.0}],
        second.id: [{"value": 20.0}],
    }
    values = sorted((p["step"], p["value"]) for p in raw_points(store_url, run.id) if p["key"] == "eval/value")
    assert values == [(10, 10.0), (20, 20.0)]
    records = {e.id: e for e in lh.Api(store_url).project("evals").evaluations()}
    assert (records[first.id].worker, records[first.id].attempts) == ("new", 2)
    assert (records[second.id].worker, records[second.id].attempts) == ("slow", 1)


@pytest.mark.slow
def test_a_killed_worker_is_replaced_at_once_on_its_host(shared_store_url: str, tmp_path: Path) -> None:
    _rule_on(shared_store_url)
    run, _ = checkpointed_run(shared_store_url, tmp_path, [10])
    code = """
        import sys, time
        import launchhelm as lh

        @lh.evaluate(project="evals", store=sys.argv[1], lease_seconds=600, poll_interval=0.05)
        def hang(ctx):
            print("scoring", flush=True)
            time.sleep(600)

        hang.serve()
    """
    holder = spawn(code, shared_store_url)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "scoring"
    (record,) = lh.Api(shared_store_url).run(run.id).evaluations()
    assert record.state == "running"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    (record,) = lh.Api(shared_store_url).run(run.id).evaluations()
    assert record.state == "queued"  # its process is gone: nobody holds it

    @lh.evaluate(project="evals", store=shared_store_url, lease_seconds=600)
    def score(ctx: lh.EvaluationContext) -> dict[str, float]:
        return {"value": 1.0}

    started = time.monotonic()
    assert score.serve(max_evaluations=1, stop_when_idle=True) == 1
    assert time.monotonic() - started < 30  # not the 600 s lease
    (record,) = lh.Api(shared_store_url).run(run.id).evaluations()
    assert (record.state, record.attempts) == ("done", 2)


def test_worker_settings_are_checked_before_any_io(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"use @launchhelm.evaluate\(project="):
        lh.evaluate(lambda ctx: {})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid project name"):
        lh.evaluate(project="bad/name")
    with pytest.raises(ValueError, match="lease_seconds=0"):
        lh.evaluate(project="evals", lease_seconds=0)
    worker = lh.evaluate(project="evals", store=str(tmp_path / "s"))(lambda ctx: {"x": 1})
    with pytest.raises(ValueError, match="max_evaluations=0"):
        worker.serve(max_evaluations=0)
    with pytest.raises(lh.CoordinationUnsupportedError, match="evaluation workers needs a store with atomic"):
        lh.EvaluationWorker(lambda ctx: {}, project="evals", store=_no_create_store(tmp_path)).serve()


def _no_create_store(tmp_path: Path) -> Any:
    import fsspec

    from launchhelm.storage import ObjectStore

    return ObjectStore(fsspec.filesystem("file"), str(tmp_path / "plain"), f"file://{tmp_path / 'plain'}", "zip")
