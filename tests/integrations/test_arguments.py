"""The Lightning logger and the Transformers callback refuse bad arguments alike, before any run starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import launchhelm as lh

CASES = [
    ({}, lh.InvalidArgumentError, "needs a project name"),
    ({"project": "p", "config": [1]}, lh.InvalidTypeError, "config is a list"),
    ({"project": "p", "resume": 3}, lh.InvalidTypeError, "pass the run id string"),
    ({"run": 3}, lh.InvalidTypeError, "run= takes a launchhelm.Run"),
    ({"project": "p", "flush_intervall": 2.0}, lh.UnknownOptionError, "did you mean 'flush_interval'"),
    ({"project": "p", "rnu": None}, lh.UnknownOptionError, "did you mean 'run'"),
]


def _classes() -> list[Any]:
    found = []
    wanted = (("launchhelm.lightning", "LaunchHelmLogger"), ("launchhelm.transformers", "LaunchHelmCallback"))
    for module, name in wanted:
        try:
            found.append(getattr(__import__(module, fromlist=[name]), name))
        except ImportError:  # the extra is not installed: its own tests say so
            pass
    return found


@pytest.mark.parametrize(("kwargs", "error", "words"), CASES)
def test_bad_arguments_are_refused_naming_what_to_pass(
    kwargs: dict[str, Any], error: type[Exception], words: str, tmp_path: Path
) -> None:
    classes = _classes()
    if not classes:
        pytest.skip("neither the lightning nor the transformers extra is installed")
    for cls in classes:
        with pytest.raises(error, match=words):
            cls(store=str(tmp_path / "store"), **kwargs)
    assert not (tmp_path / "store").exists()  # refused before anything was written
