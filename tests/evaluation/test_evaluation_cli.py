"""Evaluation from the shell: ``launchhelm evaluate MODULE:FUNCTION`` serves a
worker (Ctrl-C hands its evaluation on at once), ``launchhelm show`` lists
evaluations, ``launchhelm policy evaluation`` prints an S3 policy that allows
exactly what a worker writes, and the product page's example worker scores
the demo's checkpoints."""

from __future__ import annotations

import fnmatch
import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from evaluation_helpers import checkpointed_run, publish_without_queueing
from lhtest import ROOT, child_env, wait_for_helpers

import launchhelm as lh
from launchhelm.storage import open_store

WORKER_MODULE = """
    import time
    import launchhelm as lh

    @lh.evaluate(project="evals", poll_interval=0.1)
    def score(ctx):
        return {"value": float(ctx.download_to().read_text())}

    def plain(ctx):
        return {"plain": 1.0}

    @lh.evaluate(project="evals", poll_interval=0.1)
    def hang(ctx):
        print("scoring", flush=True)
        time.sleep(600)
"""


def _cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    exe = shutil.which("launchhelm") or str(Path(sys.executable).with_name("launchhelm"))
    return subprocess.Popen(
        [exe, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=child_env()
    )


def _run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = _cli(*args, cwd=cwd)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def worker_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "workers"
    folder.mkdir()
    (folder / "scoring.py").write_text(textwrap.dedent(WORKER_MODULE))
    return folder


@pytest.mark.slow
def test_evaluate_command_serves_until_idle_and_explains_bad_targets(tmp_path: Path, worker_dir: Path) -> None:
    store = str(tmp_path / "store")
    lh.Api(store).project("evals").evaluate_every_checkpoint(True)
    run, _ = checkpointed_run(store, tmp_path, [10, 20])
    done = _run_cli("--store", store, "evaluate", "scoring:score", "--stop-when-idle", cwd=worker_dir)
    assert done.returncode == 0, done.stderr
    assert "evaluated 2 checkpoints of project evals" in done.stdout
    assert "evaluating ckpt-00000010" in done.stderr  # the worker says what it does
    assert lh.Api(store).run(run.id).history()["eval/value"].dropna().tolist() == [10.0, 20.0]

    other, _ = checkpointed_run(store, tmp_path, [30])
    plain = _run_cli(
        "evaluate", str(worker_dir / "scoring.py") + ":plain", "--project", "evals", "--store", store,
        "--max-evaluations", "1", cwd=tmp_path,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert "evaluated 1 checkpoint of project evals" in plain.stdout
    assert [e.scores for e in lh.Api(store).run(other.id).evaluations()] == [{"plain": 1.0}]

    shown = _run_cli("--store", store, "show", run.id, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "evaluations:" in shown.stdout and "step 20      done: value=20" in shown.stdout

    for target, message in [
        ("scoring:nothing", "scoring has no score function 'nothing'"),
        ("scoring:plain", "scoring:plain is a plain function: pass --project"),
        ("scoring", "'scoring': write MODULE:FUNCTION"),
    ]:
        bad = _run_cli("--store", store, "evaluate", target, cwd=worker_dir)
        assert bad.returncode == 2 and f"launchhelm: error: {message}" in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr


@pytest.mark.slow
def test_ctrl_c_stops_the_command_and_hands_its_evaluation_on_at_once(tmp_path: Path, worker_dir: Path) -> None:
    store = str(tmp_path / "store")
    lh.Api(store).project("evals").evaluate_every_checkpoint(True)
    run, _ = checkpointed_run(store, tmp_path, [10])
    worker = _cli("--store", store, "evaluate", "scoring:hang", "--lease-seconds", "600", cwd=worker_dir)
    assert worker.stdout is not None and worker.stdout.readline().strip() == "scoring"
    assert [e.state for e in lh.Api(store).run(run.id).evaluations()] == ["running"]
    worker.send_signal(signal.SIGINT)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert "evaluated 0 checkpoints" in out and "released the lease" in err
    assert [e.state for e in lh.Api(store).run(run.id).evaluations()] == ["queued"]

    started = time.monotonic()
    done = _run_cli("--store", store, "evaluate", "scoring:score", "--stop-when-idle", cwd=worker_dir)
    assert done.returncode == 0 and time.monotonic() - started < 60  # not the 600 s lease
    (record,) = lh.Api(store).run(run.id).evaluations()
    assert (record.state, record.attempts, record.scores) == ("done", 2, {"value": 10.0})


def _policy_keys(policy: dict[str, object], action: str, root: str) -> list[str]:
    patterns = []
    for statement in policy["Statement"]:  # type: ignore[attr-defined]
        if statement["Action"] == action:
            resources = statement["Resource"]
            for arn in [resources] if isinstance(resources, str) else resources:
                patterns.append(arn.removeprefix(f"arn:aws:s3:::bkt/{root}/"))
    return patterns


@pytest.mark.slow
def test_policy_command_prints_a_bucket_policy(tmp_path: Path) -> None:
    done = _run_cli("policy", "evaluation", "--store", "s3://bkt/team/lh", "--project", "evals", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    policy = json.loads(done.stdout)
    assert policy["Version"] == "2012-10-17"
    actions = sorted(s["Action"] for s in policy["Statement"])
    assert actions == ["s3:DeleteObject", "s3:GetObject", "s3:ListBucket", "s3:PutObject", "s3:PutObject"]
    listing = next(s for s in policy["Statement"] if s["Action"] == "s3:ListBucket")
    assert listing["Resource"] == "arn:aws:s3:::bkt"
    assert listing["Condition"]["StringLike"]["s3:prefix"] == ["team/lh/runs/*", "team/lh/projects/evals/*"]
    bad = _run_cli("policy", "evaluation", "--store", str(tmp_path), cwd=tmp_path)
    assert bad.returncode == 2 and "the worker policy is for S3, GCS or Azure" in bad.stderr


def test_policy_allows_every_write_a_worker_makes_and_nothing_of_the_runs(tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    store = open_store(store_url)
    api = lh.Api(store_url)
    api.project("evals").evaluate_every_checkpoint(True)
    run, ids = checkpointed_run(store_url, tmp_path, [10, 20, 30], finish=False)
    # a checkpoint whose process died before queueing it: the worker queues it itself
    orphan_path = tmp_path / "orphan.txt"
    orphan_path.write_text("40")
    orphan = publish_without_queueing(run, orphan_path, 40)
    run.finish()
    wait_for_helpers()  # the run's helper adds it to the project's runs index and history: training's writes
    before = set(store.list(""))
    renewals: list[str] = []

    @lh.evaluate(project="evals", store=store_url, lease_seconds=0.2)
    def score(ctx: lh.EvaluationContext) -> dict[str, float]:
        if ctx.step == 20:
            raise ValueError("fails")
        time.sleep(0.4)  # long enough for renewals
        renewals.extend(k for k in store.list("projects/evals/evaluations") if "-renew-" in k)
        return {"value": float(ctx.download_to().read_text())}

    assert score.serve(stop_when_idle=True) == 4
    assert f"projects/evals/evaluations/{run.id}/{orphan}/request.json" not in before
    after = set(store.list(""))
    assert before <= after  # nothing a worker may not delete was deleted
    written = after - before
    from launchhelm._evaluation._policies import worker_policy

    policy = worker_policy("s3://bkt/root", project="evals")
    puts = _policy_keys(policy, "s3:PutObject", "root")
    deletes = _policy_keys(policy, "s3:DeleteObject", "root")
    assert puts == ["projects/evals/evaluations/*", "runs/*/metrics/eval-*"]
    assert all(any(fnmatch.fnmatchcase(key, p) for p in puts) for key in written), written
    kinds = {key.rsplit("/", 1)[-1].split("-")[-1] for key in written}
    assert {"result.json", "logged.json", "e000001.json"} <= kinds and any(k.endswith(".arrow") for k in written)
    assert renewals and all(
        any(fnmatch.fnmatchcase(f"projects/evals/evaluations/{k}", d) for d in deletes) for k in renewals
    )
    assert not [k for k in after if "-renew-" in k]  # collected once the results were in
    # and a worker key cannot touch what training writes
    training_keys = [
        f"runs/{run.id}/events/00000000000000000001.json",
        f"runs/{run.id}/run.json",
        f"runs/{run.id}/artifacts/{ids[0]}/weights-10.txt",
        f"runs/{run.id}/metrics/0193abc/00000000-1-1.arrow",
        "projects/evals/rules/evaluate_every_checkpoint/00000000000000000009.json",
    ]
    for key in training_keys:
        assert not any(fnmatch.fnmatchcase(key, p) for p in puts + deletes), key


@pytest.mark.slow
def test_evaluate_checkpoints_example_scores_the_demo_run(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    lh.Api(store).project("demo").evaluate_every_checkpoint(True)
    trainer = ["-m", "launchhelm.torch._demo_train", store, "--steps", "40", "--save-every", "20", "--step-sleep", "0"]
    train = subprocess.run(
        [sys.executable, *trainer],
        capture_output=True, text=True, timeout=180, env=child_env(OMP_NUM_THREADS="1"), cwd=ROOT,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr
    run_id = train.stdout.split()[1]
    example = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "evaluate_checkpoints.py"), "--stop-when-idle"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env=child_env(LAUNCHHELM_STORE=store, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert example.returncode == 0, example.stderr
    assert example.stdout.count(f"of run {run_id} at step") == 2
    handle = lh.Api(store).run(run_id)
    assert [(e.step, e.state) for e in handle.evaluations()] == [(20, "done"), (40, "done")]
    scores = handle.history().set_index("step")
    assert set(scores["eval/loss"].dropna().index) == {20, 40}
    assert scores.loc[40, "eval/accuracy"] > 0.9 and scores.loc[40, "eval/loss"] < scores.loc[20, "eval/loss"] * 2
