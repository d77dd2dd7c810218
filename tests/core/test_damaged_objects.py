"""Damaged objects in the store never make a run unreadable as a whole.

If these fail, one bad byte in one event or heartbeat (a disk error, a
hand edit, a buggy tool) makes a run's status, history or resume fail for good.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import launchhelm as lh
from launchhelm._runlog._events import SessionRecord
from launchhelm._runlog._sessions import liveness


def test_an_event_that_is_not_json_is_skipped_with_a_warning_naming_it(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    run = lh.init("damaged", store=store)
    run.global_step = 3
    run.log({"x": 1.0})
    run.finish(close_run=False)
    again = lh.init("damaged", store=store, resume=run.id)
    again.finish(close_run=False)
    events = sorted((tmp_path / "store" / "runs" / run.id / "events").glob("0*.json"))
    damaged = events[1]  # the first session's end
    damaged.chmod(0o644)
    damaged.write_text("{not json")
    with pytest.warns(UserWarning, match=rf"skipped the damaged event .*{damaged.name}: it is not JSON"):
        handle = lh.Api(store).run(run.id)
        assert handle.status == "resumable"  # the second session's end still says so
        assert handle.history()["x"].tolist() == [1.0]
        assert len(handle.events()) == len(events)


def test_a_heartbeat_from_the_future_is_not_taken_as_a_sign_of_life(tmp_path: Path) -> None:
    store = lh.storage.open_store(tmp_path / "store")
    session = SessionRecord(
        id="s1",
        started_at=time.time() - 100,
        process={"host_id": "another-host", "pid": 1},
        heartbeat_interval=5.0,
        heartbeat_timeout=30.0,
    )
    with pytest.warns(UserWarning, match="heartbeat .*s in the future"):
        live = liveness(store, "r1", session, beat={"time": time.time() + 86400, "step": 3})
    assert not live.alive and live.reason == "heartbeat from the future"
    fresh = liveness(store, "r1", session, beat={"time": time.time() - 1, "step": 3})
    assert fresh.alive and fresh.reason == "heartbeat fresh"
