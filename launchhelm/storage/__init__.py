"""LaunchHelm's storage layer: put-if-absent and friends over fsspec.

The whole surface is :class:`Store` (``create``, ``put``, ``read``, ``list``,
``exists``, ``delete``, ``upload``, ``download``) and :func:`open_store`.
"""

from launchhelm._exceptions import (
    AlreadyExistsError,
    CoordinationUnsupportedError,
    ObjectNotFoundError,
    StorageError,
)
from launchhelm.storage._store import (
    LocalStore,
    MemoryStore,
    ObjectStore,
    Store,
    default_store_url,
    open_store,
)

__all__ = [
    "AlreadyExistsError",
    "CoordinationUnsupportedError",
    "LocalStore",
    "MemoryStore",
    "ObjectNotFoundError",
    "ObjectStore",
    "StorageError",
    "Store",
    "default_store_url",
    "open_store",
]
