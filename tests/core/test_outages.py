"""Outages of the store: said in one line each way, nothing lost, nothing half-published, nothing hung.

moto S3 sits behind a proxy on 127.0.0.1 (``tests/http_proxy.py``) that can
refuse connections (the service is down) or take them and never answer (a
partition, a hung load balancer). The training loop runs in a real child
process, so what its user would read on stderr is what the test reads.
"""

from __future__ import annotations

import json
import secrets
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_proxy import BLACKHOLE, REFUSE, RequestCounter
from lhtest import BUCKET, child_env

import launchhelm as lh

#: What a user must never read: a third party's traceback or asyncio's noise.
_FOREIGN = ("Traceback", "never retrieved", "Unclosed", "Exception in thread", "aiohttp", "botocore")


def _outage(proxy: RequestCounter, mode: str) -> None:
    proxy.refuse() if mode == REFUSE else proxy.blackhole()


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[RequestCounter]:
    counter = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    try:
        yield counter
    finally:
        counter.close()


def _options(proxy: RequestCounter) -> dict[str, Any]:
    return {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}}


# -- save_checkpoint during an outage ------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", [REFUSE, BLACKHOLE])
def test_save_checkpoint_during_an_outage_raises_in_bounded_time_and_publishes_nothing(
    proxy: RequestCounter, moto_endpoint: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The save retries, then raises a CheckpointError saying nothing was published; after the store is back
    "latest" is still the previous checkpoint, and the next save works. A blackhole fails it within the
    configured timeouts, not never."""
    import torch

    import launchhelm.torch as lht

    monkeypatch.setenv("LAUNCHHELM_READ_TIMEOUT", "2")
    store = f"s3://{BUCKET}/{secrets.token_hex(6)}"
    tr = lht.init("outage", store=store, storage_options=_options(proxy), system_metrics=False, capture_console=False)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tr.watch(model, optimizer)
    tr.global_step = 10
    before = tr.save_checkpoint(extra={"at": 10})
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    tr.global_step = 20
    with torch.no_grad():
        model.weight.add_(1.0)
    _outage(proxy, mode)
    started = time.monotonic()
    with pytest.raises(lh.CheckpointError) as caught:
        tr.save_checkpoint(extra={"at": 20})
    took = time.monotonic() - started
    assert isinstance(caught.value, lh.LaunchHelmError)
    message = str(caught.value)
    assert "step 20 was not saved" in message and "StoreUnreachableError" in message, message
    assert "nothing was published" in message and "previous checkpoint is still the latest" in message, message
    # bounded by the timeouts: a refused connection fails fast; no answer within 3 client tries of 2 s
    assert took < 45, took
    proxy.restore()
    events = [
        e
        for e in lh.Api(lh.storage.open_store(store, {"client_kwargs": {"endpoint_url": moto_endpoint}}))
        .run(tr.id)
        .checkpoints()
    ]
    assert [c.id for c in events] == [before]  # no checkpoint event for the failed save
    assert tr.load_checkpoint("latest") == {"at": 10}
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    tr.global_step = 30
    after = tr.save_checkpoint(extra={"at": 30})
    assert after is not None and after != before
    assert tr.load_checkpoint("latest") == {"at": 30}
    tr.finish()
