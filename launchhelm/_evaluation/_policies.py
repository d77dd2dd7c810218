"""Least-privilege credentials for evaluation workers on GCS and Azure (S3: ``_queue.worker_policy``).

The worker's "Checkpoint evaluation" key, in a store without a server, is a
cloud credential. Whatever the cloud, it needs the same few things (see
:func:`worker_scopes`): read and list the runs and the project's keys,
create queue, lease and result objects under ``projects/<p>/evaluations/``
and its score chunks under ``runs/<id>/metrics/eval-*``, and delete its own
lease renewals. Nothing else: not a run's events, checkpoints or metrics,
nor the project's rule.

- **GCS**: a bucket IAM policy (version 3) whose bindings carry IAM
  Conditions on the object name (``resource.name``) and, for listings, on the
  listed prefix (the ``storage.googleapis.com/objectListPrefix`` API
  attribute). Writes go through ``roles/storage.objectCreator``, which
  cannot overwrite or delete: an existing object stays as it is.
- **Azure**: a role assignment on the container with ABAC conditions (version
  2.0) on the blob path and the listed prefix. A SAS cannot be narrowed to
  prefixes on a flat namespace, so the role assignment is the narrowest form;
  the output says what neither can narrow.
"""

from __future__ import annotations

import itertools

from launchhelm._exceptions import InvalidArgumentError
from launchhelm._runlog._events import validate_project
from launchhelm._types import JSONValue
from launchhelm.storage._keys import policy_patterns

__all__ = ["azure_worker_policy", "gcs_worker_policy", "worker_policy", "worker_scopes"]


def worker_scopes(project: str | None) -> dict[str, list[str]]:
    """What a worker touches, as key patterns under the store root (``*``: any characters).

    ``list`` and ``read``: prefixes it lists and reads under; ``create``: the
    objects it creates; ``delete``: the only ones it deletes.
    """
    # a listed prefix is tested by prefix only: with every project, all of projects/
    return policy_patterns(None if project is None else validate_project(project))


def _split(store_url: str, schemes: tuple[str, ...], what: str, example: str) -> tuple[str, str]:
    scheme, sep, rest = store_url.partition("://")
    if not sep or scheme not in schemes or not rest.strip("/"):
        raise InvalidArgumentError(f"store {store_url!r}: the worker {what}; give --store {example}")
    bucket, _, root = rest.strip("/").partition("/")
    return bucket, root.strip("/")


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# -- GCS ----------------------------------------------------------------------------
def _gcs_name_test(object_prefix: str, pattern: str) -> str:
    """A CEL test that ``resource.name`` matches ``pattern`` (``*``: any characters) under the root."""
    parts = (object_prefix + pattern.rstrip("*")).split("*")
    anchored = f"resource.name.startsWith({_quote(parts[0])})"
    if len(parts) == 1:
        return anchored
    # IAM Conditions have no glob: extract() is non-empty only if the text between two fixed parts exists
    found = [f"resource.name.extract({_quote(a + '{x}' + b)}) != ''" for a, b in itertools.pairwise(parts)]
    return "(" + " && ".join([anchored, *found]) + ")"


def gcs_worker_policy(store_url: str, project: str | None = None, principal: str | None = None) -> dict[str, JSONValue]:
    """A bucket IAM policy (with IAM Conditions) for evaluation workers of a ``gs://`` store.

    Apply it with ``gcloud storage buckets set-iam-policy gs://BUCKET policy.json`` after
    merging it with the bucket's existing bindings.
    """
    bucket, root = _split(store_url, ("gs", "gcs"), "IAM policy is for a GCS bucket", "gs://bucket/prefix")
    scopes = worker_scopes(project)
    key_root = f"{root}/" if root else ""
    objects = f"projects/_/buckets/{bucket}/objects/{key_root}"  # GCS resource names, not store keys
    member = principal or "serviceAccount:launchhelm-evaluation-worker@PROJECT_ID.iam.gserviceaccount.com"
    listed = "api.getAttribute('storage.googleapis.com/objectListPrefix', '')"
    # a listing is authorised on the bucket, not on objects: its prefix is the thing to test
    read = [_gcs_name_test(objects, p + "*") for p in scopes["read"]]
    read += [f"{listed}.startsWith({_quote(key_root + p)})" for p in scopes["list"]]

    def binding(role: str, title: str, description: str, tests: list[str]) -> dict[str, JSONValue]:
        condition: dict[str, JSONValue] = {"title": title, "description": description, "expression": " || ".join(tests)}
        return {"role": role, "members": [member], "condition": condition}

    return {
        "version": 3,
        "bindings": [
            binding(
                "roles/storage.objectViewer", "launchhelm-evaluation-read", "list and read runs and the queue", read
            ),
            binding(
                "roles/storage.objectCreator",
                "launchhelm-evaluation-create",
                "create (never overwrite) queue, lease and result objects and score chunks",
                [_gcs_name_test(objects, p) for p in scopes["create"]],
            ),
            binding(
                "roles/storage.objectUser",
                "launchhelm-evaluation-collect-renewals",
                "delete its own lease renewals once a result is in",
                [_gcs_name_test(objects, p) for p in scopes["delete"]],
            ),
        ],
        "notes": [
            "IAM Conditions have no glob: an extract() placeholder may span '/', so a worker may also create "
            "objects deeper under those prefixes; it can never overwrite or delete one (objectCreator cannot).",
            "Conditions need uniform bucket-level access (they do not apply to object ACLs).",
        ],
    }


# -- Azure --------------------------------------------------------------------------
_BLOBS = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
_PATH = f"@Resource[{_BLOBS}:path]"
_LIST_PREFIX = f"@Request[{_BLOBS}:prefix]"
#: Between the blocks of an ABAC condition; each block limits some actions.
AZURE_BLOCK_SEPARATOR = "\nAND\n"


def _azure_path_test(pattern: str) -> str:
    if "*" not in pattern.rstrip("*"):
        return f"{_PATH} StringStartsWith {_quote(pattern.rstrip('*'))}"
    return f"{_PATH} StringLike {_quote(pattern)}"


def _azure_block(actions: list[str], tests: list[str], listing: bool = False) -> str:
    """ABAC: a request for one of ``actions`` is allowed only when one of ``tests`` holds."""
    matches = " OR ".join(f"ActionMatches{{'{_BLOBS}/{a}'}}" for a in actions)
    sub = "SubOperationMatches{'Blob.List'}"
    if "read" in actions:  # reading a blob and listing blobs are both blobs/read
        matches = f"({matches}) AND {sub}" if listing else f"({matches}) AND NOT {sub}"
    return f"((!({matches})) OR ({' OR '.join(tests)}))"


def azure_worker_policy(
    store_url: str, project: str | None = None, principal: str | None = None
) -> dict[str, JSONValue]:
    """A role assignment (with ABAC conditions) for evaluation workers of an ``az://`` store.

    Create it with ``az role assignment create --assignee PRINCIPAL --role ROLE --scope SCOPE
    --condition CONDITION --condition-version 2.0``.
    """
    container, root = _split(
        store_url, ("az", "abfs", "abfss"), "role assignment is for an Azure container", "az://container/prefix"
    )
    scopes = worker_scopes(project)
    key_root = f"{root}/" if root else ""
    read = [
        _azure_block(["read"], [_azure_path_test(key_root + p + "*") for p in scopes["read"]]),
        _azure_block(
            ["read"], [f"{_LIST_PREFIX} StringStartsWith {_quote(key_root + p)}" for p in scopes["list"]], listing=True
        ),
    ]
    write = [
        _azure_block(
            ["write", "add/action", "move/action"], [_azure_path_test(key_root + p) for p in scopes["create"]]
        ),
        _azure_block(["delete"], [_azure_path_test(key_root + p) for p in scopes["delete"]]),
    ]
    scope = (
        "/subscriptions/SUBSCRIPTION_ID/resourceGroups/RESOURCE_GROUP/providers/Microsoft.Storage/"
        f"storageAccounts/STORAGE_ACCOUNT/blobServices/default/containers/{container}"
    )
    return {
        "scope": scope,
        "principal": principal or "OBJECT_ID_OF_THE_WORKER_IDENTITY",
        # one assignment: a second one (a Reader) would add its reads to the Contributor's, not narrow them
        "assignments": [
            {
                "role": "Storage Blob Data Contributor",
                "conditionVersion": "2.0",
                "condition": AZURE_BLOCK_SEPARATOR.join(read + write),
            },
        ],
        "cannot_narrow": [
            "Overwrites: Azure RBAC has no create-only data action for Put Blob, so a worker may overwrite "
            "objects where it may create them (the queue's prefix and eval- score chunks only; LaunchHelm "
            "itself always creates with If-None-Match: *).",
            "A SAS cannot be limited to key prefixes on a flat-namespace account (only a directory SAS on a "
            "hierarchical-namespace account can): the narrowest container SAS a worker could use, sp=rlcwd, "
            "reaches every key in the container. Prefer this role assignment.",
            "Blob versions and snapshots: if the account keeps them, the built-in role's version actions are "
            "not limited here; a custom role with only blobs/read, blobs/write and blobs/delete is narrower.",
        ],
    }


def worker_policy(store_url: str, project: str | None = None, principal: str | None = None) -> dict[str, JSONValue]:
    """A least-privilege S3 bucket policy for evaluation workers of ``store_url``.

    For ``gs://`` and ``az://`` stores: the GCS IAM policy or Azure role
    assignments of :mod:`launchhelm._evaluation._policies`, which cover the same keys.

    Workers may list and read runs and the project's keys, create only
    queue, lease and result objects under ``projects/<p>/evaluations/`` and
    their score chunks under ``runs/*/metrics/eval-*``, and delete only
    lease renewals. They cannot change a run's events, checkpoints or
    metrics, nor the project's rule.
    """
    scheme, sep, rest = store_url.partition("://")
    if scheme in ("gs", "gcs", "az", "abfs", "abfss") and sep:
        other = gcs_worker_policy if scheme in ("gs", "gcs") else azure_worker_policy
        return other(store_url, project=project, principal=principal)
    if not sep or scheme not in ("s3", "s3a") or not rest.strip("/"):
        raise InvalidArgumentError(
            f"store {store_url!r}: the worker policy is for S3, GCS or Azure; give --store s3://bucket/prefix, "
            "gs://bucket/prefix or az://container/prefix"
        )
    bucket, _, root = rest.strip("/").partition("/")
    root = root.strip("/")
    scopes = policy_patterns(None if project is None else validate_project(project))

    def key(pattern: str) -> str:
        return f"{root}/{pattern}" if root else pattern

    def arn(pattern: str) -> str:
        return f"arn:aws:s3:::{bucket}/{key(pattern)}"

    who = principal or "arn:aws:iam::ACCOUNT_ID:role/launchhelm-evaluation-worker"
    allow: dict[str, JSONValue] = {"Effect": "Allow", "Principal": {"AWS": who}}
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ListRunsAndQueue",
                **allow,
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{bucket}",
                "Condition": {"StringLike": {"s3:prefix": [key(p + "*") for p in scopes["read"]]}},
            },
            {
                "Sid": "ReadRunsCheckpointsAndQueue",
                **allow,
                "Action": "s3:GetObject",
                "Resource": [arn(p + "*") for p in scopes["read"]],
            },
            {
                "Sid": "WriteQueueLeasesAndResults",
                **allow,
                "Action": "s3:PutObject",
                "Resource": arn(scopes["create"][0]),
            },
            {
                "Sid": "WriteScoreChunks",
                **allow,
                "Action": "s3:PutObject",
                "Resource": arn(scopes["create"][1]),
            },
            {
                "Sid": "CollectLeaseRenewals",
                **allow,
                "Action": "s3:DeleteObject",
                "Resource": arn(scopes["delete"][0]),
            },
        ],
    }
