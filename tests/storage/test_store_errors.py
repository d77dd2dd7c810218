"""A misconfigured store fails fast with one clear error, never a hang.

If these fail, a typo in an endpoint freezes ``launchhelm.init`` for minutes,
or a missing bucket or a wrong key surfaces as a confusing "object not found"
or as a raw botocore / azure traceback.
"""

from __future__ import annotations

import socket
import time

import pytest
from emulators import azurite_connection_string
from lhtest import BUCKET, run_python

import launchhelm as lh
from launchhelm.storage import (
    BucketNotFoundError,
    StorageError,
    StoreAccessDeniedError,
    StoreUnreachableError,
    open_store,
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


def _unreachable(backend: str, port: int) -> tuple[str, dict[str, object]]:
    endpoint = f"http://127.0.0.1:{port}"
    if backend == "s3":
        return f"s3://{BUCKET}/x", {"client_kwargs": {"endpoint_url": endpoint}, "key": "k", "secret": "s"}
    if backend == "gcs":
        return f"gs://{BUCKET}/x", {"endpoint_url": endpoint, "token": "anon"}
    return f"az://{BUCKET}/x", {"connection_string": azurite_connection_string(endpoint)}


@pytest.mark.parametrize("backend", ["s3", "gcs", "azure"])
def test_an_unreachable_endpoint_fails_within_seconds(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    port = _closed_port()
    url, options = _unreachable(backend, port)
    start = time.monotonic()
    with pytest.raises(StoreUnreachableError) as info:
        lh.init("unreachable", store=url, storage_options=options)
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert url in message and f"127.0.0.1:{port}" in message and "Check the endpoint" in message
    assert isinstance(info.value, ConnectionError) and isinstance(info.value, StorageError)


@pytest.mark.parametrize("backend", ["s3", "gcs", "azure"])
def test_a_store_that_goes_away_after_opening_gives_the_same_error(backend: str) -> None:
    # The endpoint took the connection check when the store was opened, then went away.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = int(listener.getsockname()[1])
    url, options = _unreachable(backend, port)
    store = open_store(url, options)
    listener.close()
    start = time.monotonic()
    with pytest.raises(StoreUnreachableError, match=f"cannot reach the store {url} at .*127.0.0.1:{port}"):
        store.create("b", b"2")
    # bounded by the client libraries' own retries (gcsfs and azure-core back off for longest)
    assert time.monotonic() - start < 120


def test_a_missing_bucket_is_named(moto_endpoint: str) -> None:
    url = "s3://launchhelm-no-such-bucket/prefix"
    with pytest.raises(BucketNotFoundError, match=r"bucket 'launchhelm-no-such-bucket' of store s3://") as info:
        lh.init("nobucket", store=url)
    assert "create it first" in str(info.value)
    store = open_store(url)
    with pytest.raises(BucketNotFoundError):
        store.read("runs/x/run.json")  # not "object not found"
    with pytest.raises(BucketNotFoundError):
        lh.Api(url).projects()


def test_a_missing_gcs_bucket_and_azure_container_are_named(gcs_endpoint: str, azurite_endpoint: str) -> None:
    with pytest.raises(BucketNotFoundError, match="bucket 'no-such-bucket'"):
        open_store("gs://no-such-bucket/p").create("k", b"v")
    with pytest.raises(BucketNotFoundError, match="container 'no-such-container'"):
        open_store("az://no-such-container/p").create("k", b"v")


def test_wrong_azure_credentials_are_refused_clearly(azurite_endpoint: str) -> None:
    wrong = azurite_connection_string(azurite_endpoint, key="d3Jvbmcga2V5IGZvciB0aGUgdGVzdA==")
    start = time.monotonic()
    with pytest.raises(StoreAccessDeniedError) as info:
        lh.init("denied", store=f"az://{BUCKET}/denied", storage_options={"connection_string": wrong})
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert f"az://{BUCKET}/denied" in message and "AZURE_STORAGE_CONNECTION_STRING" in message
    assert isinstance(info.value, PermissionError)


def test_credentials_come_from_the_usual_environment_variables(
    moto_endpoint: str, gcs_endpoint: str, azurite_endpoint: str
) -> None:
    # a fresh process given only the environment: AWS_*, STORAGE_EMULATOR_HOST,
    # AZURE_STORAGE_CONNECTION_STRING (AZURE_STORAGE_ACCOUNT_NAME + _KEY reach
    # the real *.blob.core.windows.net, so they are not exercised offline)
    code = """
    import sys, launchhelm as lh
    for url in sys.argv[1:]:
        run = lh.init("env", store=url)
        run.log({"x": 1.0})
        run.finish()
        print(url, lh.Api(url).run(run.id).history()["x"].tolist())
    """
    done = run_python(code, f"s3://{BUCKET}/env", f"gs://{BUCKET}/env", f"abfs://{BUCKET}/env", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("[1.0]") == 3, done.stdout


def test_info_logging_is_not_flooded_by_azure_request_lines(azurite_endpoint: str) -> None:
    # azure-core logs each request at INFO; a user's own level on that logger wins
    code = """
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
        if sys.argv[2] == "user-chose-info":
            logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.INFO)
        import launchhelm as lh
        run = lh.init("quiet", store=sys.argv[1], heartbeat_interval=0.2)
        for step in range(20):
            run.log({"loss": 1.0 / (step + 1)}, step=step)
        run.finish()
        print("finished")
    """
    url = f"az://{BUCKET}/quiet-{time.time_ns()}"
    quiet = run_python(code, url, "default")
    assert quiet.returncode == 0 and "finished" in quiet.stdout, quiet.stderr[-2000:]
    assert "Request URL" not in quiet.stdout + quiet.stderr
    chosen = run_python(code, url + "-info", "user-chose-info")
    assert chosen.returncode == 0, chosen.stderr[-2000:]
    assert chosen.stdout.count("Request URL") >= 5  # the user asked for them: still printed
