"""``launchhelm gc``: orphaned and incomplete uploads go, published checkpoints stay
(unless a retention policy says otherwise, and never the ones in use).

If these fail, stores grow without bound with payloads no checkpoint points
to and S3 multipart uploads billed forever, or gc deletes a checkpoint
someone chose for resume or is evaluating, or leaves a run listing a
checkpoint whose payload is gone.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from gcs_finalize_proxy import GcsFinalizeProxy
from lhtest import BUCKET, helper_pids, make_store_url, proc_io, spawn

import launchhelm as lh
from launchhelm import _gc
from launchhelm._cli import main as cli
from launchhelm._gc import collect_garbage, parse_duration
from launchhelm._runlog._events import CHECKPOINT_DELETED, EventLog
from launchhelm.storage import ObjectStore, Store, open_store

DAY = 24 * 3600.0


@pytest.fixture(params=["local", "s3", "gcs", "azure"])
def gc_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return make_store_url(request.param, tmp_path, request)


def _file(tmp_path: Path, name: str, size: int = 1000) -> Path:
    path = tmp_path / name
    path.write_bytes(os.urandom(size))
    return path


def _artifacts(store: Store, run_id: str) -> set[str]:
    return {key.split("/", 1)[0] for key in store.list(f"runs/{run_id}/artifacts")}


def _multipart_uploads(store: Store) -> list[Any]:
    import boto3

    assert isinstance(store, ObjectStore)
    prefix = store.root.split("/", 1)[1]
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    return list(client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix + "/").get("Uploads", []))


@pytest.mark.slow
def test_orphaned_uploads_go_once_older_than_the_window(gc_store_url: str, tmp_path: Path) -> None:
    run = lh.init("gc", store=gc_store_url)
    published = run.checkpoint(_file(tmp_path, "weights.bin"), step=1)
    store = run.store
    # a save that uploaded its payload and died before publishing it
    store.upload(f"runs/{run.id}/artifacts/ckpt-00000002-deadbeef/weights.bin", _file(tmp_path, "w2.bin", 5000))
    run.finish()

    report = collect_garbage(gc_store_url)
    assert report.actions == [] and len(report.too_young) == 1  # may still be a save in progress
    assert _artifacts(store, run.id) == {published, "ckpt-00000002-deadbeef"}

    later = time.time() + 2 * DAY
    dry = collect_garbage(gc_store_url, now=later, dry_run=True)
    assert [(a.kind, a.size) for a in dry.actions] == [("orphan", 5000)]
    assert _artifacts(store, run.id) == {published, "ckpt-00000002-deadbeef"}  # a dry run changes nothing

    report = collect_garbage(gc_store_url, now=later)
    assert [a.keys for a in report.actions] == [[f"runs/{run.id}/artifacts/ckpt-00000002-deadbeef/weights.bin"]]
    assert _artifacts(store, run.id) == {published}
    assert [c.id for c in lh.Api(gc_store_url).run(run.id).checkpoints()] == [published]


@pytest.mark.slow
def test_keep_last_spares_the_latest_the_resume_choice_and_queued_evaluations(
    gc_store_url: str, tmp_path: Path
) -> None:
    run = lh.init("gc", store=gc_store_url)
    ids = [run.checkpoint(_file(tmp_path, f"c{step}.bin", 100 * step), step=step) for step in range(1, 7)]
    run.finish(close_run=False)
    handle = lh.Api(gc_store_url).run(run.id)
    handle.choose_for_resume(ids[1])  # step 2
    handle.evaluate(ids[2])  # step 3: queued

    dry = collect_garbage(gc_store_url, keep_last=2, dry_run=True)
    assert sorted(a.checkpoint for a in dry.actions if a.checkpoint) == sorted([ids[0], ids[3]])
    assert len(lh.Api(gc_store_url).run(run.id).checkpoints()) == 6

    report = collect_garbage(gc_store_url, keep_last=2)
    assert sorted(a.checkpoint for a in report.actions if a.checkpoint) == sorted([ids[0], ids[3]])
    assert {(c, why) for _, c, why in report.kept} >= {
        (ids[1], "chosen for resume"),
        (ids[2], "its evaluation is queued or running"),
    }
    handle = lh.Api(gc_store_url).run(run.id)
    assert [c.id for c in handle.checkpoints()] == [ids[1], ids[2], ids[4], ids[5]]
    assert _artifacts(run.store, run.id) == {ids[1], ids[2], ids[4], ids[5]}
    events = EventLog(run.store, run.id).read()
    assert [e["checkpoint"] for e in events if e["type"] == CHECKPOINT_DELETED] == [ids[0], ids[3]]
    assert handle.resume_checkpoint().id == ids[1]  # type: ignore[union-attr]
    with pytest.raises(lh.CheckpointError, match="has no checkpoint"):
        handle.choose_for_resume(ids[0])
    # a second gc finds nothing more to do
    assert collect_garbage(gc_store_url, keep_last=2).actions == []


@pytest.mark.slow
def test_a_resume_choice_made_while_gc_decides_is_respected(
    gc_store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = lh.init("gc", store=gc_store_url)
    ids = [run.checkpoint(_file(tmp_path, f"c{step}.bin"), step=step) for step in range(1, 4)]
    run.finish(close_run=False)
    real = _gc._evaluations_of
    calls = []

    def meanwhile(store: Store, project: str, run_id: str) -> dict[str, str]:
        if not calls:  # gc has read the log and is about to append its deletion
            lh.Api(gc_store_url).run(run_id).choose_for_resume(ids[0])
        calls.append(run_id)
        return real(store, project, run_id)

    monkeypatch.setattr(_gc, "_evaluations_of", meanwhile)
    report = collect_garbage(gc_store_url, keep_last=1)
    assert [a.checkpoint for a in report.actions] == [ids[1]]  # step 1 was chosen meanwhile: spared
    assert [c.id for c in lh.Api(gc_store_url).run(run.id).checkpoints()] == [ids[0], ids[2]]
    assert len(calls) >= 2  # it decided again after losing its conditional append


def test_incomplete_uploads_are_aborted(gc_store_url: str, tmp_path: Path) -> None:
    store = open_store(gc_store_url)
    store.create("runs/x/run.json", b"{}")
    if isinstance(store, ObjectStore):
        upload = store._part_upload("runs/x/artifacts/ckpt-1/model.pt")
        upload.begin()
        upload.put_part(1, 0, os.urandom(8 * 2**20))
        if gc_store_url.startswith("gs://"):
            # a GCS resumable session is neither listed nor billed, and never an object
            assert store.incomplete_uploads() == []
            assert collect_garbage(store).actions == []
            assert not store.exists("runs/x/artifacts/ckpt-1/model.pt")
            upload.abort()
            return
        assert [u.key for u in store.incomplete_uploads()] == ["runs/x/artifacts/ckpt-1/model.pt"]
        if gc_store_url.startswith("s3://"):
            assert len(_multipart_uploads(store)) == 1
        else:  # moto dates every multipart upload 2010-11-10, so only Azure shows the window
            young = collect_garbage(store)
            assert young.actions == [] and young.too_young == ["incomplete upload of runs/x/artifacts/ckpt-1/model.pt"]
        report = collect_garbage(store, now=time.time() + 2 * DAY)
    else:
        staging = tmp_path / "store" / ".staging"
        (staging / "1-old.tmp").write_bytes(b"half")
        (staging / "2-new.tmp").write_bytes(b"half")
        os.utime(staging / "1-old.tmp", (time.time() - 2 * DAY, time.time() - 2 * DAY))
        report = collect_garbage(store)
    assert [a.kind for a in report.actions] == ["incomplete upload"]
    if isinstance(store, ObjectStore):
        assert store.incomplete_uploads() == []
        if gc_store_url.startswith("s3://"):
            assert _multipart_uploads(store) == []
        store.create("runs/x/artifacts/ckpt-1/model.pt", b"the key is free again")
    else:
        assert [u.upload_id for u in store.incomplete_uploads()] == ["2-new.tmp"]  # still in the window


@pytest.mark.slow
def test_the_gc_command(gc_store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = lh.init("gc", store=gc_store_url)
    ids = [run.checkpoint(_file(tmp_path, f"c{step}.bin"), step=step) for step in range(1, 4)]
    run.finish()
    assert cli(["--store", gc_store_url, "gc", "--keep-last", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would delete retention: checkpoint {ids[0]} of run {run.id}" in out and "dry run" in out
    assert cli(["--store", gc_store_url, "gc", "--keep-last", "1", "--older-than", "0"]) == 0
    out = capsys.readouterr().out
    assert f"deleted retention: checkpoint {ids[1]}" in out
    assert [c.id for c in lh.Api(gc_store_url).run(run.id).checkpoints()] == [ids[2]]
    assert cli(["--store", gc_store_url, "gc", "--older-than", "soon"]) == 2
    assert "invalid duration" in capsys.readouterr().err


def test_durations_parse() -> None:
    assert parse_duration("24h") == DAY and parse_duration("30m") == 1800 and parse_duration("7d") == 7 * DAY
    assert parse_duration("90") == 90 and parse_duration("1.5s") == 1.5
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration("-1h")


# -- a save killed mid-upload ----------------------------------------------------------
UPLOADER = """
import sys, launchhelm as lh
run = lh.init("kill-upload", store=sys.argv[1])
print(run.id, flush=True)
print("uploading", flush=True)
run.checkpoint(sys.argv[2], step=7)
print("published", flush=True)
"""


def _read_so_far(pid: int) -> int:
    """Bytes the process has read from files so far (/proc/PID/task/*/io rchar).

    The uploader reads its payload twice: once to hash it, then part by part
    as it uploads, a few parts ahead of what has been sent (sockets are not
    counted), so this tells how far the upload has gone on every backend.
    """
    return proc_io(pid, "rchar")


@pytest.mark.slow
def test_a_save_killed_mid_upload_leaves_no_checkpoint_and_gc_leaves_nothing(
    shared_store_url: str, tmp_path: Path
) -> None:
    size = 160 * 2**20
    payload = _file(tmp_path, "big.bin", size)
    gcs = shared_store_url.startswith("gs://")
    env: dict[str, str] = {}
    proxy = None
    if gcs:  # fake-gcs-server shows a resumable upload early; GCS does not: see gcs_finalize_proxy.py
        proxy = GcsFinalizeProxy(int(os.environ["STORAGE_EMULATOR_HOST"].rsplit(":", 1)[1]))
        env["STORAGE_EMULATOR_HOST"] = proxy.endpoint
    try:
        _kill_mid_upload(shared_store_url, payload, size, env, proxy)
    finally:
        if proxy is not None:
            proxy.close()


@pytest.mark.slow
def test_a_node_lost_mid_upload_through_its_helper_leaves_no_checkpoint_and_gc_leaves_nothing(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # LAUNCHHELM_HELPER_STORE=1: the session's helper uploads, so the training process's death alone never
    # cuts an upload; a node's loss kills both mid-upload
    payload = _file(tmp_path, "big.bin", 160 * 2**20)
    url = make_store_url("s3", tmp_path, request)
    _kill_mid_upload(url, payload, 160 * 2**20, {"LAUNCHHELM_HELPER_STORE": "1"}, None, whole_node=True)


def _kill_mid_upload(
    shared_store_url: str,
    payload: Path,
    size: int,
    env: dict[str, str],
    proxy: GcsFinalizeProxy | None,
    whole_node: bool = False,
) -> None:
    for _ in range(5):
        proc = spawn(UPLOADER, shared_store_url, str(payload), **env)
        assert proc.stdout is not None
        run_id = proc.stdout.readline().strip()
        assert proc.stdout.readline().strip() == "uploading", proc.stderr.read() if proc.stderr else ""
        helpers = helper_pids(proc.pid) if whole_node else []
        assert helpers or not whole_node, "no helper serves the store"
        pids = [proc.pid, *helpers]  # the node's reads: the hash and the upload, whichever process makes them
        try:
            base = sum(_read_so_far(pid) for pid in pids)
            deadline = time.monotonic() + 60
            # hashed (size), then 64 MB read for upload: at least 24 MB sent, 96 MB to go
            while (
                time.monotonic() < deadline
                and proc.poll() is None
                and sum(_read_so_far(pid) for pid in pids) - base < size + 64 * 2**20
            ):
                time.sleep(0.001)
        finally:
            for helper in helpers:  # the uploader first: the training process must not take the upload over
                os.kill(helper, signal.SIGKILL)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        if "published" in proc.stdout.read():
            continue  # the upload won the race with the kill: try again
        store = open_store(shared_store_url)
        handle = lh.Api(store).run(run_id)
        assert handle.checkpoints() == []  # no visible partial checkpoint
        assert _artifacts(store, run_id) == set()  # nor any object of it
        left = store.incomplete_uploads()
        if proxy is None:
            assert left, "the kill did not land mid-upload"
        else:  # GCS sessions cannot be listed (nor are they billed): one expires a week after it started
            assert left == []
            assert [name.rsplit("/artifacts/", 1)[0] for name in proxy.open_sessions()] == [
                f"{store.root.split('/', 1)[1]}/runs/{run_id}"
            ], "the kill did not land mid-upload"
        report = collect_garbage(store, older_than=0)
        assert report.actions or proxy is not None
        assert _artifacts(store, run_id) == set()
        assert store.incomplete_uploads() == []
        if shared_store_url.startswith("s3://"):
            assert _multipart_uploads(store) == []
        return
    pytest.fail("never managed to kill the uploader mid-upload in 5 tries")


def test_keep_last_keeps_evaluated_checkpoints_unless_include_evaluated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a done evaluation's scores chart beside its checkpoint, a failed one may be tried again:
    # retention keeps both unless told otherwise; a queued one is kept whatever it is told
    store_url = str(tmp_path / "store")
    run = lh.init("gc", store=store_url)
    ids = [run.checkpoint(_file(tmp_path, f"c{step}.bin"), step=step) for step in range(1, 6)]
    run.finish(close_run=False)
    handle = lh.Api(store_url).run(run.id)
    handle.evaluate(ids[0])
    handle.evaluate(ids[1])

    def score(ctx: lh.EvaluationContext) -> dict[str, float]:
        if ctx.step == 2:
            raise RuntimeError("no GPU")
        return {"accuracy": 0.9}

    assert lh.evaluate(project="gc", store=store_url, poll_interval=0.05)(score).serve(stop_when_idle=True) == 2
    handle.evaluate(ids[2])  # queued, no worker
    assert {e.checkpoint: e.state for e in handle.evaluations()} == {ids[0]: "done", ids[1]: "failed", ids[2]: "queued"}

    report = collect_garbage(store_url, keep_last=1)
    assert [a.checkpoint for a in report.actions] == [ids[3]]  # step 4: never evaluated
    assert {(c, why) for _, c, why in report.kept} >= {
        (ids[0], "it has a done evaluation (--include-evaluated deletes it)"),
        (ids[1], "it has a failed evaluation (--include-evaluated deletes it)"),
        (ids[2], "its evaluation is queued or running"),
    }
    assert [c.id for c in handle.checkpoints()] == [*ids[:3], ids[4]]

    assert cli(["--store", store_url, "gc", "--keep-last", "1", "--include-evaluated"]) == 0
    assert ids[0] in capsys.readouterr().out
    assert [c.id for c in handle.checkpoints()] == [ids[2], ids[4]]
    assert _artifacts(run.store, run.id) == {ids[2], ids[4]}
    assert handle.history(keys="eval/accuracy")["eval/accuracy"].tolist() == [0.9]  # the scores stay
    with pytest.raises(lh.InvalidTypeError, match="include_evaluated='yes'"):
        collect_garbage(store_url, keep_last=1, include_evaluated="yes")  # type: ignore[arg-type]
