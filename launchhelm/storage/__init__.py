"""LaunchHelm's storage layer: put-if-absent and friends over fsspec.

The whole surface is :class:`Store` (``create``, ``put``, ``read``, ``list``,
``list_info``, ``exists``, ``delete``, ``upload``, ``download``, ``writer``,
``incomplete_uploads``) and :func:`open_store`. Local directories, ``memory://``,
S3 (``s3://``), Google Cloud Storage (``gs://``) and Azure Blob Storage
(``az://``) give the same guarantees; see ``ARCHITECTURE.md``.
"""

from launchhelm._exceptions import (
    AlreadyExistsError,
    BucketNotFoundError,
    CoordinationUnsupportedError,
    ObjectNotFoundError,
    StorageError,
    StoreAccessDeniedError,
    StoreUnreachableError,
)
from launchhelm.storage._backends import IncompleteUpload
from launchhelm.storage._local import LocalStore
from launchhelm.storage._object import MemoryStore, ObjectStore
from launchhelm.storage._open import default_store_url, open_store
from launchhelm.storage._store import ObjectInfo, Store

__all__ = [
    "AlreadyExistsError",
    "BucketNotFoundError",
    "CoordinationUnsupportedError",
    "IncompleteUpload",
    "LocalStore",
    "MemoryStore",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectStore",
    "StorageError",
    "Store",
    "StoreAccessDeniedError",
    "StoreUnreachableError",
    "default_store_url",
    "open_store",
]
