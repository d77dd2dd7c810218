"""``launchhelm policy evaluation`` for every cloud: the key it prints lets a worker do its job and nothing else.

What a user would notice if this failed: a worker with the printed key
failing with "access denied" on a GCS or Azure store, or a "Checkpoint
evaluation" key that could rewrite a run's events, checkpoints or metrics.

As for S3 (``test_evaluation_cli.py``), a real worker scores real checkpoints
on a local store while every store call it makes is recorded; the policy is
then checked against those calls, read back from the policy itself: each
read, listing, creation and deletion the worker made is allowed, and no
write or delete of a key training writes is.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from evaluation_helpers import checkpointed_run, publish_without_queueing
from lhtest import ROOT, child_env

import launchhelm as lh
from launchhelm._evaluation._policies import AZURE_BLOCK_SEPARATOR, worker_policy
from launchhelm.storage import LocalStore, open_store

ROOT_PREFIX = "team/lh"  # the store's folder inside the bucket or container


@dataclass
class Footprint:
    reads: set[str] = field(default_factory=set)
    lists: set[str] = field(default_factory=set)
    creates: set[str] = field(default_factory=set)
    deletes: set[str] = field(default_factory=set)
    training_keys: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def footprint(tmp_path_factory: pytest.TempPathFactory) -> Footprint:
    """What a worker did to the store while it scored, failed, renewed and queued (every store call)."""
    tmp_path = tmp_path_factory.mktemp("policies")
    store_url = str(tmp_path / "store")
    store = open_store(store_url)
    lh.Api(store_url).project("evals").evaluate_every_checkpoint(True)
    run, ids = checkpointed_run(store_url, tmp_path, [10, 20, 30], finish=False)
    orphan_path = tmp_path / "orphan.txt"
    orphan_path.write_text("40")
    publish_without_queueing(run, orphan_path, 40)  # the worker queues this one itself
    run.finish()
    seen = Footprint()
    calls = {
        "read": seen.reads,
        "exists": seen.reads,
        "download": seen.reads,
        "list": seen.lists,
        "list_info": seen.lists,
        "create": seen.creates,
        "put": seen.creates,
        "upload": seen.creates,
        "writer": seen.creates,
        "delete": seen.deletes,
    }
    patch = pytest.MonkeyPatch()
    for name, into in calls.items():
        original = getattr(LocalStore, name)

        def recorded(self: Any, key: str, *args: Any, _original: Any = original, _into: set[str] = into) -> Any:
            _into.add(key)
            return _original(self, key, *args)

        patch.setattr(LocalStore, name, recorded)

    @lh.evaluate(project="evals", store=store_url, lease_seconds=0.2)
    def score(ctx: lh.EvaluationContext) -> dict[str, float]:
        if ctx.step == 20:
            raise ValueError("fails")
        time.sleep(0.4)  # long enough for lease renewals
        return {"value": float(ctx.download_to().read_text())}

    try:
        assert score.serve(stop_when_idle=True) == 4
    finally:
        patch.undo()
    assert any("-renew-" in k for k in seen.creates) and any("-renew-" in k for k in seen.deletes), seen
    assert any(k.endswith(".arrow") for k in seen.creates) and any("result.json" in k for k in seen.creates)
    assert any(f"artifacts/{ids[0]}" in k for k in seen.reads | seen.lists), "the worker read no checkpoint"
    seen.training_keys = [
        f"runs/{run.id}/events/00000000000000000001.json",
        f"runs/{run.id}/run.json",
        f"runs/{run.id}/artifacts/{ids[0]}/weights-10.txt",
        f"runs/{run.id}/metrics/0193abc/00000000-1-1.arrow",
        "projects/evals/rules/evaluate_every_checkpoint/00000000000000000009.json",
        "projects/evals/project.json",
        "projects/other/evaluations/x/request.json",
    ]
    assert not [k for k in seen.creates if k in store.list("") and k in seen.training_keys]
    return seen


def _prefix(key: str) -> str:
    """A listed prefix as the cloud sees it: under the root, ending with '/'."""
    return f"{ROOT_PREFIX}/{key.rstrip('/')}/" if key else f"{ROOT_PREFIX}/"


# -- GCS: evaluate the IAM Conditions the policy holds -------------------------------------
def _cel_allows(expression: str, name: str, list_prefix: str | None) -> bool:
    """The subset of CEL the policy uses: ``||`` of ``&&`` of startsWith and extract tests.

    extract's placeholder is read as "any characters, '/' included", the permissive reading.
    """
    for clause in expression.split(" || "):
        clause = clause.strip()
        if clause.startswith("(") and clause.endswith(")"):
            clause = clause[1:-1]
        terms = clause.split(" && ")
        ok = True
        for term in terms:
            if m := re.fullmatch(r"resource\.name\.startsWith\('([^']*)'\)", term):
                ok = list_prefix is None and name.startswith(m[1])
            elif m := re.fullmatch(r"resource\.name\.extract\('([^']*)'\) != ''", term):
                before, after = m[1].split("{x}")
                ok = list_prefix is None and re.search(re.escape(before) + ".+" + re.escape(after), name) is not None
            elif m := re.fullmatch(
                r"api\.getAttribute\('storage\.googleapis\.com/objectListPrefix', ''\)\.startsWith\('([^']*)'\)", term
            ):
                ok = list_prefix is not None and list_prefix.startswith(m[1])
            else:
                raise AssertionError(f"a CEL term this test cannot read: {term!r}")
            if not ok:
                break
        if ok:
            return True
    return False


GCS_ROLES = {  # the permissions of the predefined roles the policy binds, as far as a worker needs them
    "roles/storage.objectViewer": {"get", "list"},
    "roles/storage.objectCreator": {"create"},
    "roles/storage.objectUser": {"get", "list", "create", "delete", "update"},
}


def _gcs_allows(policy: dict[str, Any], permission: str, key: str, *, listing: bool = False) -> bool:
    name = f"projects/_/buckets/bkt/objects/{ROOT_PREFIX}/{key}"
    prefix = _prefix(key) if listing else None
    return any(
        permission in GCS_ROLES[b["role"]] and _cel_allows(b["condition"]["expression"], name, prefix)
        for b in policy["bindings"]
    )


def test_the_gcs_policy_allows_what_a_worker_did_and_nothing_of_training(footprint: Footprint) -> None:
    policy = worker_policy(f"gs://bkt/{ROOT_PREFIX}", project="evals")
    assert policy["version"] == 3 and {b["role"] for b in policy["bindings"]} <= set(GCS_ROLES)
    for key in footprint.reads:
        assert _gcs_allows(policy, "get", key), f"read {key}"
    for key in footprint.lists:
        assert _gcs_allows(policy, "list", key, listing=True), f"list {key}"
    for key in footprint.creates:
        assert _gcs_allows(policy, "create", key), f"create {key}"
    for key in footprint.deletes:
        assert _gcs_allows(policy, "delete", key), f"delete {key}"
    for key in footprint.training_keys:
        for permission in ("create", "delete", "update"):
            assert not _gcs_allows(policy, permission, key), f"{permission} {key}"
    # outside the store's folder, nothing at all
    assert not _gcs_allows(policy, "get", "../elsewhere/x")
    assert not _gcs_allows(policy, "list", "", listing=True)  # the root listing: not needed, not granted


# -- Azure: evaluate the ABAC conditions ----------------------------------------------------
CONTRIBUTOR = {"read", "write", "delete", "add/action", "move/action"}


def _abac_allows(condition: str, action: str, path: str, *, listing: bool = False) -> bool:
    """Whether every block of the condition that covers ``action`` lets it through."""
    for block in condition.split(AZURE_BLOCK_SEPARATOR):
        actions = re.findall(r"ActionMatches\{'[^']*/blobs/([^']+)'\}", block)
        if action not in actions:
            continue
        if action == "read":
            is_list_block = "AND SubOperationMatches{'Blob.List'}" in block
            if is_list_block != listing:
                continue
        tests = re.findall(
            r"@(Resource|Request)\[[^\]]*:(path|prefix)\] (StringStartsWith|StringLike) '([^']*)'", block
        )
        assert tests, f"an ABAC block this test cannot read: {block!r}"
        ok = False
        for _, attribute, op, value in tests:
            if attribute != ("prefix" if listing else "path"):
                continue
            ok = ok or (path.startswith(value) if op == "StringStartsWith" else fnmatch.fnmatchcase(path, value))
        if not ok:
            return False
    return True


def _azure_allows(policy: dict[str, Any], action: str, key: str, *, listing: bool = False) -> bool:
    path = _prefix(key) if listing else f"{ROOT_PREFIX}/{key}"
    return any(
        a["role"] == "Storage Blob Data Contributor"
        and action in CONTRIBUTOR
        and _abac_allows(a["condition"], action, path, listing=listing)
        for a in policy["assignments"]
    )


def test_the_azure_role_assignment_allows_what_a_worker_did_and_nothing_of_training(footprint: Footprint) -> None:
    policy = worker_policy(f"az://ctr/{ROOT_PREFIX}", project="evals")
    assert policy["scope"].endswith("/blobServices/default/containers/ctr")
    assert all(a["conditionVersion"] == "2.0" for a in policy["assignments"])
    for key in footprint.reads:
        assert _azure_allows(policy, "read", key), f"read {key}"
    for key in footprint.lists:
        assert _azure_allows(policy, "read", key, listing=True), f"list {key}"
    for key in footprint.creates:
        assert _azure_allows(policy, "write", key), f"create {key}"
    for key in footprint.deletes:
        assert _azure_allows(policy, "delete", key), f"delete {key}"
    for key in footprint.training_keys:
        for action in ("write", "add/action", "move/action", "delete"):
            assert not _azure_allows(policy, action, key), f"{action} {key}"
    assert not _azure_allows(policy, "read", "../elsewhere/x")
    assert not _azure_allows(policy, "read", "", listing=True)
    # what it cannot narrow is said, not hidden
    assert any("SAS" in line for line in policy["cannot_narrow"])
    assert any("overwrite" in line for line in policy["cannot_narrow"])


@pytest.mark.slow
def test_the_policy_command_prints_each_cloud_and_refuses_other_stores(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "launchhelm._cli", "policy", "evaluation", *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=60)

    gcs = cli("--store", "gs://bkt/x", "--principal", "serviceAccount:w@p.iam.gserviceaccount.com")
    assert gcs.returncode == 0, gcs.stderr
    assert json.loads(gcs.stdout)["bindings"][0]["members"] == ["serviceAccount:w@p.iam.gserviceaccount.com"]
    azure = cli("--store", "az://ctr", "--project", "evals")
    assert azure.returncode == 0, azure.stderr
    assert "'projects/evals/evaluations/'" in json.loads(azure.stdout)["assignments"][0]["condition"]
    for store in (str(tmp_path), "memory://x", "gs://", "az://"):
        bad = cli("--store", store)
        assert bad.returncode == 2 and bad.stderr.startswith("launchhelm: error: store "), (store, bad.stderr)
        assert repr(store) in bad.stderr
