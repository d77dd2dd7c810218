"""Opening a store from a URL: backend defaults, timeouts, a reachability probe."""

from __future__ import annotations

import os
import socket
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from launchhelm._exceptions import (
    InvalidArgumentError,
    InvalidTypeError,
    StorageError,
)
from launchhelm.storage._local import LocalStore
from launchhelm.storage._object import MemoryStore, ObjectStore
from launchhelm.storage._store import Store

__all__ = ["default_store_url", "open_store"]


def default_store_url() -> str:
    """``$LAUNCHHELM_STORE`` if set, else ``~/.launchhelm``."""
    return os.environ.get("LAUNCHHELM_STORE") or str(Path("~/.launchhelm").expanduser())


def _connect_timeout() -> float:
    from launchhelm.storage._backends import connect_timeout

    return connect_timeout()


def _with_defaults(kind: str | None, options: dict[str, object]) -> dict[str, object]:
    """Bounded timeouts and retries for each cloud, unless the caller chose their own."""
    from launchhelm.storage._backends import client_options

    return client_options(kind, options)


_reachable: set[tuple[str, int]] = set()
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _probe(store: ObjectStore) -> None:
    """Refuse at once a store whose endpoint takes no TCP connection.

    Client libraries retry a refused connection for a long time (gcsfs about
    35 s, azure-core about 85 s, measured), which looks like a hang. One TCP
    connect with a short timeout (no request, nothing billed) tells the
    truth in milliseconds; it is skipped behind an HTTP proxy, and done once
    per endpoint and process.
    """
    from launchhelm.storage._backends import endpoint_of

    if store._kind is None or any(os.environ.get(v) for v in _PROXY_VARIABLES):
        return
    endpoint = endpoint_of(store.fs, store.protocol)
    if not endpoint:
        return
    parts = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    host = parts.hostname
    if not host:
        return
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return
    if (host, port) in _reachable:
        return
    try:
        socket.create_connection((host, port), timeout=_connect_timeout()).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if isinstance(exc, socket.timeout):
            reason = f"no answer within {_connect_timeout():g}s"
        raise store._unreachable(f"{host}:{port}: {reason}") from exc
    _reachable.add((host, port))


def open_store(
    url: str | os.PathLike[str] | Store | None = None,
    storage_options: Mapping[str, object] | None = None,
    *,
    progress: bool | None = None,
) -> Store:
    """Open the store at ``url`` (see :func:`default_store_url` for ``None``).

    Parameters
    ----------
    url:
        A local path, ``file://``, ``memory://``, ``s3://bucket/prefix``,
        ``gs://bucket/prefix``, ``az://container/prefix`` or any fsspec URL;
        or a :class:`Store`, returned as is.
    storage_options:
        Passed to the fsspec file system (credentials, ``endpoint_url``...).
        Without them each cloud's usual environment variables apply:
        ``AWS_*``; ``GOOGLE_APPLICATION_CREDENTIALS`` (and
        ``STORAGE_EMULATOR_HOST``); ``AZURE_STORAGE_CONNECTION_STRING`` or
        ``AZURE_STORAGE_ACCOUNT_NAME`` + ``AZURE_STORAGE_ACCOUNT_KEY``.
    progress:
        Progress bars for large uploads and downloads: None (default) past
        256 MB unless ``LAUNCHHELM_PROGRESS=0``; True always; False never.

    Raises
    ------
    StoreUnreachableError
        The endpoint takes no connection (checked once, in milliseconds).
    InvalidTypeError, InvalidArgumentError
        ``url`` is not a path or URL, or is empty.

    Examples
    --------
    >>> store = open_store("memory://demo")
    >>> store.create("hello.txt", b"hi")
    >>> store.read("hello.txt")
    b'hi'
    """
    if isinstance(url, Store):
        return url
    if url is not None and not isinstance(url, (str, os.PathLike)):
        raise InvalidTypeError(
            f"store={url!r} is a {type(url).__name__}: give a path or URL such as ~/.launchhelm or s3://bucket/prefix"
        )
    text = os.fspath(url) if url is not None else default_store_url()
    if not text:
        raise InvalidArgumentError("empty store URL: pass a path or URL such as ~/.launchhelm or s3://bucket/prefix")
    if "://" not in text or text.startswith("file://") or text.startswith("local://"):
        local = text.split("://", 1)[1] if "://" in text else text
        return LocalStore(local, url=text, progress=progress)
    import sys

    from launchhelm.storage._backends import kind_of

    protocol = text.split("://", 1)[0]
    kind = kind_of(protocol)
    options = dict(storage_options or {})
    if (
        kind == "gcs"
        and "gcsfs" not in sys.modules
        and (os.environ.get("STORAGE_EMULATOR_HOST") or options.get("endpoint_url"))
    ):
        # gcsfs's zonal-bucket extension asks a control API that emulators lack
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import fsspec

    try:
        options = _with_defaults(kind, options)
        fs, root = fsspec.core.url_to_fs(text, **options)
    except ImportError as exc:
        extra = {"s3": "s3", "gcs": "gcs", "azure": "azure"}.get(kind or "", "")
        how = f" (pip install 'launchhelm[{extra}]')" if extra else ""
        raise StorageError(
            f"cannot open store {text}: {exc}. Install the fsspec backend for {protocol}://{how}.",
            url=text,
        ) from exc
    except ValueError as exc:
        raise StorageError(f"cannot open store {text}: {exc}", url=text) from exc
    if protocol == "memory":
        return MemoryStore(fs, root, text, progress)
    if kind == "azure":
        _shorten_azure_backoff(fs)
        _quiet_azure_request_log()
    store = ObjectStore(fs, root, text, protocol, progress)
    _probe(store)
    return store


#: azure-core logs every HTTP request and response at INFO: with heartbeats, metrics and
#: control polling, a script that turns on INFO logging would print a dozen lines a second.
_AZURE_REQUEST_LOGGER = "azure.core.pipeline.policies.http_logging_policy"


def _quiet_azure_request_log() -> None:
    """Raise azure-core's per-request logger to WARNING, unless the user set its level already."""
    import logging

    logger = logging.getLogger(_AZURE_REQUEST_LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


def _shorten_azure_backoff(fs: object) -> None:
    """azure-storage-blob waits 15 s, 18 s, 24 s between its 3 retries (85 s for a dead endpoint,
    measured); adlfs cannot pass a retry policy, so shorten the one its client holds: 0.5, 2.5, 4.5 s."""
    policy = getattr(getattr(getattr(fs, "service_client", None), "_config", None), "retry_policy", None)
    if policy is not None and hasattr(policy, "initial_backoff") and hasattr(policy, "increment_base"):
        policy.initial_backoff = 0.5
        policy.increment_base = 2
