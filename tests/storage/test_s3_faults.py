"""S3 answers 409 ConditionalRequestConflict and 503 SlowDown under load:
``create`` must retry them, and still give exactly one winner."""

from __future__ import annotations

import itertools
import logging
import os
import threading

import pytest
from lhtest import BUCKET, FaultyS3Proxy

from launchhelm.storage import AlreadyExistsError, StorageError, open_store
from launchhelm.storage._object import ObjectStore
from launchhelm.storage._retry import Backoff
from launchhelm.storage._transfer import PART_BACKOFF


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


#: The schedule of a store request (ObjectStore._retrying): 6 tries, 0.05 s doubling to at most 1 s.
REQUEST_BACKOFF = Backoff(ObjectStore.retries, first=0.05, cap=1.0)
#: What a request, its error answer and the next request's set-up may add to a wait on a busy machine.
OVERHEAD_S = 0.5


@pytest.mark.serial  # bounds the time between a caller's requests
def test_two_callers_retry_on_their_own_jittered_and_bounded_schedules(
    moto_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two callers (two ranks, say) whose creates fail at the same moment, against an S3 that
    answers 409 ConditionalRequestConflict to every try: each gives up after the same six tries
    with the same clear error; each wait it drew lies between half its nominal delay and the whole
    of it (so no call waits longer in all than before), and really passed between two of its
    requests at the store; and the two callers drew different waits, none the nominal delay: they
    no longer retry in lockstep."""
    port = int(moto_endpoint.rsplit(":", 1)[1])
    proxy = FaultyS3Proxy(port, status=409, code="ConditionalRequestConflict", failures=10**6, match="/events/")
    options = {
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"},
        "config_kwargs": {"retries": {"max_attempts": 1}},
    }
    errors: dict[str, BaseException] = {}
    start = threading.Barrier(2)

    def caller(name: str) -> None:
        store = open_store(f"s3://{BUCKET}/jitter-{name}", options)
        start.wait()
        try:
            store.create(f"runs/{name}/events/001.json", b"x")
        except BaseException as exc:  # checked below
            errors[name] = exc

    try:
        with caplog.at_level(logging.DEBUG, logger="launchhelm"):
            threads = [threading.Thread(target=caller, args=(name,), name=f"caller-{name}") for name in ("a", "b")]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
    finally:
        proxy.close()
    assert sorted(errors) == ["a", "b"]
    for error in errors.values():
        assert isinstance(error, StorageError) and "failed" in str(error), error
    delays = list(REQUEST_BACKOFF.delays())
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.8] and REQUEST_BACKOFF.budget == pytest.approx(1.55)
    drawn = {}
    for name in ("a", "b"):
        mine = [r for r in caplog.records if r.threadName == f"caller-{name}" and hasattr(r, "retry_wait")]
        drawn[name] = [r.retry_wait for r in mine]
        assert len(drawn[name]) == len(delays), (name, drawn[name])
        assert all(d / 2 <= w <= d for w, d in zip(drawn[name], delays, strict=True)), (name, drawn[name])
        times = [at for at, path in proxy.injected_at if f"/jitter-{name}/" in path]
        assert len(times) == REQUEST_BACKOFF.attempts, name  # every try reached the store, no more
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        assert all(gap >= wait for gap, wait in zip(gaps, drawn[name], strict=True)), (name, gaps, drawn[name])
        assert sum(gaps) <= REQUEST_BACKOFF.budget + len(gaps) * OVERHEAD_S, (name, gaps)
        assert drawn[name] != delays
    assert drawn["a"] != drawn["b"]


@pytest.mark.parametrize("backoff", [REQUEST_BACKOFF, PART_BACKOFF], ids=["request", "part"])
def test_each_schedule_draws_bounded_waits_that_differ_from_call_to_call(backoff: Backoff) -> None:
    """The budgets kept from before jitter (requests: 1.55 s of waits over 6 tries; parts: 3 s over
    5), every wait in [delay / 2, delay], and two calls' waits not the same."""
    assert backoff.budget == pytest.approx({6: 1.55, 5: 3.0}[backoff.attempts])
    delays = list(backoff.delays())
    drawn = [list(backoff.waits()) for _ in range(200)]
    for waits in drawn:
        assert len(waits) == backoff.attempts - 1
        assert all(d / 2 <= w <= d for w, d in zip(waits, delays, strict=True))
    assert len({tuple(waits) for waits in drawn}) == len(drawn)
    lowest = [min(waits[i] for waits in drawn) for i in range(len(delays))]
    highest = [max(waits[i] for waits in drawn) for i in range(len(delays))]
    assert all(lo < 0.6 * d and hi > 0.9 * d for lo, hi, d in zip(lowest, highest, delays, strict=True))
