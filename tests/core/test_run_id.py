"""``init(run_id=...)``: a new run under a chosen id, as tools that map another tracker's ids need.

What a user would notice if it failed: two runs under one id (a second
``init`` overwriting the first one's record), or a typo'd id stored as is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import launchhelm as lh


def _init(store: str, **kwargs: object) -> lh.Run:
    return lh.init("p", store=store, capture_console=False, system_metrics=False, **kwargs)  # type: ignore[arg-type]


def test_a_run_is_created_under_the_given_id_once(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    run = _init(store, run_id="chosen42", config={"lr": 0.1})
    run.log({"loss": 1.0})
    run.finish(close_run=False)
    assert run.id == "chosen42"
    with pytest.raises(lh.AlreadyExistsError, match="resume='chosen42'"):
        _init(store, run_id="chosen42", config={"lr": 0.2})
    handle = lh.Api(store).run("chosen42")
    assert handle.config == {"lr": 0.1}  # the first run's record is untouched
    assert handle.history()["loss"].tolist() == [1.0]
    again = _init(store, resume="chosen42")  # and resume finds it as any other run
    again.finish()


def test_a_bad_run_id_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    with pytest.raises(lh.InvalidArgumentError, match="invalid run id"):
        _init(store, run_id="Not-Valid")
    with pytest.raises(lh.InvalidArgumentError, match="resume="):
        _init(store, run_id="abcd1234", resume="abcd1234")
    assert not (tmp_path / "store").exists() or lh.Api(store).projects() == []
