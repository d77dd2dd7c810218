"""Batched reads: what keeps a run's history and the runs table fast on object stores.

If these fail, a notebook waits one round trip per object again (105 s for a
runs table of 301 runs on S3), or a missing object breaks a whole read.
"""

from __future__ import annotations

import os

import pytest
from http_proxy import RequestCounter
from lhtest import BUCKET

from launchhelm.storage import ObjectNotFoundError, StorageError, open_store


def test_read_many_returns_every_object_and_none_for_missing_keys(store_url: str) -> None:
    store = open_store(store_url)
    stored = {f"runs/r{i}/summary.json": os.urandom(100 + i) for i in range(12)}
    for key, data in stored.items():
        store.create(key, data)
    wanted = [*stored, "runs/nope/summary.json", "runs/r3/summary.json"]
    got = store.read_many(wanted)
    assert list(got) == [*stored, "runs/nope/summary.json"]  # given order, duplicates once
    for key, data in stored.items():
        assert got[key] == data
    assert got["runs/nope/summary.json"] is None
    assert store.read_many([]) == {}


def test_read_many_refuses_a_bad_key_like_read(store_url: str) -> None:
    store = open_store(store_url)
    with pytest.raises(ValueError):
        store.read("../escape")
    with pytest.raises(ValueError):
        store.read_many(["ok/key", "../escape"])


def test_read_many_of_one_missing_key_is_none_not_an_error(store_url: str) -> None:
    store = open_store(store_url)
    assert store.read_many(["a/b"]) == {"a/b": None}
    with pytest.raises(ObjectNotFoundError):
        store.read("a/b")


def _proxied(moto_endpoint: str, prefix: str, latency: float) -> tuple[RequestCounter, object]:
    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]), latency=latency)
    store = open_store(f"s3://{BUCKET}/{prefix}", {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}})
    return proxy, store


@pytest.mark.slow
def test_read_many_on_s3_sends_one_get_per_key_concurrently(moto_endpoint: str) -> None:
    proxy, store = _proxied(moto_endpoint, f"many-{os.urandom(3).hex()}", latency=0.05)
    try:
        for i in range(40):
            store.create(f"k/{i:03d}", str(i).encode())  # type: ignore[attr-defined]
        proxy.reset()
        got = store.read_many([f"k/{i:03d}" for i in range(40)], max_concurrency=16)  # type: ignore[attr-defined]
        assert [got[f"k/{i:03d}"] for i in range(40)] == [str(i).encode() for i in range(40)]
        counts = proxy.snapshot()
        assert sum(n for what, n in counts.items() if what.startswith("GET")) == 40, counts
        assert sum(counts.values()) == 40, counts  # no listing, no HEAD
        assert 2 <= proxy.peak_in_flight <= 16  # concurrent, and bounded
    finally:
        proxy.close()


def test_read_many_on_s3_reports_a_missing_key_per_key(moto_endpoint: str) -> None:
    proxy, store = _proxied(moto_endpoint, f"miss-{os.urandom(3).hex()}", latency=0.0)
    try:
        store.create("k/a", b"a")  # type: ignore[attr-defined]
        assert store.read_many(["k/a", "k/missing"]) == {"k/a": b"a", "k/missing": None}  # type: ignore[attr-defined]
    finally:
        proxy.close()


def test_read_many_from_a_missing_bucket_says_so(moto_endpoint: str) -> None:
    store = open_store(f"s3://no-such-bucket-{os.urandom(3).hex()}/x")
    with pytest.raises(StorageError, match="does not exist"):
        store.read_many(["a", "b"])
