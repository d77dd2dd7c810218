"""S3 answers 409 ConditionalRequestConflict and 503 SlowDown under load:
``create`` must retry them, and still give exactly one winner."""

from __future__ import annotations

import os

import pytest
from lhtest import BUCKET, FaultyS3Proxy

from launchhelm.storage import AlreadyExistsError, StorageError, open_store


@pytest.mark.parametrize(("status", "code"), [(409, "ConditionalRequestConflict"), (503, "SlowDown")])
def test_create_retries_transient_s3_answers(moto_endpoint: str, status: int, code: str) -> None:
    port = int(moto_endpoint.rsplit(":", 1)[1])
    proxy = FaultyS3Proxy(port, status=status, code=code, failures=2, match="/events/")
    try:
        store = open_store(
            f"s3://{BUCKET}/faults-{status}",
            {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}},
        )
        store.create("runs/r/events/001.json", b"first")
        assert proxy.injected == 2 and proxy.forwarded_puts >= 1
        assert store.read("runs/r/events/001.json") == b"first"
        with pytest.raises(AlreadyExistsError):
            store.create("runs/r/events/001.json", b"second")
        assert store.read("runs/r/events/001.json") == b"first"
    finally:
        proxy.close()


def test_a_store_that_keeps_failing_gives_one_clear_error(moto_endpoint: str) -> None:
    port = int(moto_endpoint.rsplit(":", 1)[1])
    proxy = FaultyS3Proxy(port, status=409, code="ConditionalRequestConflict", failures=10**6, match="/events/")
    try:
        store = open_store(
            f"s3://{BUCKET}/faults-forever",
            {
                "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"},
                "config_kwargs": {"retries": {"max_attempts": 1}},
            },
        )
        with pytest.raises(StorageError, match=r"s3://.*/runs/r/events/001.json failed"):
            store.create("runs/r/events/001.json", b"x")
        assert proxy.injected == 6  # retried, with backoff, then gave up
        assert not store.exists("runs/r/events/001.json")
    finally:
        proxy.close()
    assert os.environ["AWS_ENDPOINT_URL"] == moto_endpoint
