"""Helpers for the evaluation tests: runs with small checkpoints, store listings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import launchhelm as lh
from launchhelm._runlog._checkpoints import artifact_prefix, new_artifact_id, upload_path
from launchhelm.storage import open_store


def checkpointed_run(
    store: str, tmp_path: Path, steps: list[int], project: str = "evals", finish: bool = True
) -> tuple[lh.Run, list[str]]:
    """A run that logs ``loss`` at each step and saves a checkpoint holding the step as text."""
    run = lh.init(project, store=store)
    ids = []
    for step in steps:
        run.global_step = step
        run.log({"loss": 1.0 / step})
        payload = tmp_path / f"weights-{step}.txt"
        payload.write_text(str(step))
        ids.append(run.checkpoint(payload))
    if finish:
        run.finish()
    return run, ids


def objects(store: str, prefix: str) -> dict[str, dict[str, Any]]:
    """Every JSON object under ``prefix``, by key relative to it."""
    st = open_store(store)
    return {name: json.loads(st.read(f"{prefix}/{name}")) for name in st.list(prefix) if name.endswith(".json")}


def results_by_evaluation(store: str, project: str) -> dict[str, list[dict[str, Any]]]:
    """Each evaluation's real results (not fences), over all attempts and epochs."""
    found: dict[str, list[dict[str, Any]]] = {}
    for name, body in objects(store, f"projects/{project}/evaluations").items():
        if name.endswith("-result.json"):
            run_id, checkpoint = name.split("/")[:2]
            bucket = found.setdefault(f"{run_id}-{checkpoint}", [])
            if body["kind"] == "result":
                bucket.append(body)
    return found


def raw_points(store: str, run_id: str) -> list[dict[str, Any]]:
    """Every stored metric point of the run, duplicates included (what history() folds)."""
    from launchhelm._metrics._read import read_points

    table = read_points(open_store(store), run_id)
    return [dict(row) for row in table.to_pylist()]


def publish_without_queueing(run: lh.Run, path: Path, step: int) -> str:
    """What a training process that died right after publishing leaves: the event, no evaluation."""
    artifact = new_artifact_id(step)
    fmt, files, checksums, size = upload_path(run.store, artifact_prefix(run.id, artifact), path)
    run._events.append(
        "checkpoint",
        {
            "session": run.session_id,
            "checkpoint": artifact,
            "prefix": artifact_prefix(run.id, artifact),
            "step": step,
            "format": fmt,
            "files": files,
            "checksums": checksums,
            "size": size,
            "world_size": 1,
            "control_seq": 0,
        },
    )
    return artifact
