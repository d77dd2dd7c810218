"""The browser writes times by the kernel's rules: ``js/src/time.js`` (and
``human.js``, which takes its "how long ago" and durations from it) against
``launchhelm/_views/_humanize.py``, run by Node on the same grid of inputs and
compared exactly: durations from nothing to centuries, negative, fractional
and missing; "how long ago" into the past and the future; local times in
several time zones (one with a half-hour daylight saving shift) across their
clock changes; every status with and without a heartbeat. Python is the
reference.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launchhelm._views._humanize import ago, duration, local_time, status_sentence

SRC = Path(__file__).resolve().parents[2] / "js" / "src"
#: Reads ``[[function, [args...]], ...]`` on stdin, prints each result (JSON numbers can't be NaN: strings stand in).
HARNESS = """
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
const src = process.argv[1];
const time = await import(pathToFileURL(`${src}/time.js`).href);
const human = await import(pathToFileURL(`${src}/human.js`).href);
const fns = {
  localTime: time.localTime,
  duration: time.duration,
  ago: time.ago,
  statusSentence: time.statusSentence,
  shortTime: human.shortTime,
};
const special = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };
const decode = (v) => (typeof v === "string" && v in special ? special[v] : v);
const cases = JSON.parse(readFileSync(0, "utf8"));
console.log(JSON.stringify(cases.map(([name, args]) => fns[name](...args.map(decode)))));
"""

NOW = 1_700_000_000.25
#: Seconds: zero to centuries, edges of each unit (just under, at, just over), fractions, negatives.
SECONDS = [
    0, 0.4, 0.5, 0.999, 1, 4, 4.999, 5, 5.5, 42, 59, 59.6, 59.999999, 60, 61, 75, 119.99999999999999, 120, 179.5,
    3599, 3599.9, 3600, 3601, 3660, 4320, 7199.9, 86399, 86399.99, 86400, 86401, 90000, 2 * 86400 + 3 * 3600,
    30 * 86400, 365 * 86400, 3 * 365 * 86400 + 12345.678, 100 * 365 * 86400, 2**40, 2**53,
    -1e-9, -0.5, -1, -4.999, -5, -60, -86400, -1e9,
]  # fmt: skip
MISSING: list[Any] = [None, math.nan, math.inf, -math.inf]
#: Epoch seconds around 1970, today, clock changes in New York (2024-03-10, 2024-11-03) and Lord Howe, far ahead.
TIMESTAMPS = [
    0, -1, -0.5, 0.999, 1e9, 1_700_000_000.75, 1_714_564_984, 1_710_053_999, 1_710_054_000, 1_710_054_001,
    1_730_613_599, 1_730_613_600, 1_730_613_601, 1_712_415_599, 1_712_415_600, 1_728_142_200, 4_102_444_800,
    253_402_300_799, NOW, NOW - 3, NOW - 86400 * 40, NOW - 86400 * 400,
]  # fmt: skip
ZONES = ["UTC", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
STATUSES = ["running", "stopped", "resumable", "closed", "unknown-status"]
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def _encode(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _node(cases: list[tuple[str, list[Any]]], zone: str) -> list[str]:
    node = shutil.which("node")
    assert node, "Node.js is needed for the widgets' front end (scripts/setup.sh builds it with npm): install it"
    payload = json.dumps([[name, [_encode(a) for a in args]] for name, args in cases], allow_nan=False)
    done = subprocess.run(
        [node, "--input-type=module", "-e", HARNESS, str(SRC)],
        input=payload,
        capture_output=True,
        text=True,
        env={**os.environ, "TZ": zone},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results: list[str] = json.loads(done.stdout)
    return results


@pytest.fixture
def zone_of_python() -> Iterator[None]:
    """Restores the process's time zone after a test that moved it."""
    saved = os.environ.get("TZ")
    yield
    if saved is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = saved
    time.tzset()


def _compare(cases: list[tuple[str, list[Any]]], expected: list[str], zone: str) -> None:
    got = _node(cases, zone)
    wrong = [
        (name, args, want, have) for (name, args), want, have in zip(cases, expected, got, strict=True) if want != have
    ]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ in {zone} (function, args, Python, JS): {wrong[:10]}"


def test_durations_and_how_long_ago_read_as_python_writes_them() -> None:
    cases: list[tuple[str, list[Any]]] = []
    expected: list[str] = []
    for seconds in [*SECONDS, *MISSING]:
        cases.append(("duration", [seconds]))
        expected.append(duration(seconds))
        ts = NOW - seconds if seconds is not None else None
        cases.append(("ago", [ts, NOW]))
        expected.append(ago(ts, NOW))
    # a fractional "now" and times a few units either side of it
    for ts in (NOW - 4.9, NOW - 5.0, NOW + 0.1, NOW + 3600):
        cases.append(("ago", [ts, NOW]))
        expected.append(ago(ts, NOW))
    assert {"1 min 15 s", "1 h 12 min", "2 d 3 h", "-", "just now", "never", "2 min ago"} <= set(expected)
    _compare(cases, expected, "UTC")


@pytest.mark.usefixtures("zone_of_python")
@pytest.mark.parametrize("zone", ZONES)
def test_local_times_read_as_python_writes_them_in_each_time_zone(zone: str) -> None:
    os.environ["TZ"] = zone
    time.tzset()
    cases: list[tuple[str, list[Any]]] = []
    expected: list[str] = []
    for ts in [*TIMESTAMPS, *MISSING]:
        cases.append(("localTime", [ts]))
        expected.append(local_time(ts))
    # the panel's short form ("14:03:07" today, "Nov 30, 14:03" this year): the same clock, fewer parts
    for ts in TIMESTAMPS:
        day, today = time.localtime(math.floor(ts)), time.localtime(math.floor(NOW))
        clock = time.strftime("%H:%M:%S", day)
        if day[:3] == today[:3]:
            short = clock
        elif day.tm_year == today.tm_year:
            short = f"{MONTHS[day.tm_mon - 1]} {day.tm_mday}, {clock[:5]}"
        else:
            short = f"{MONTHS[day.tm_mon - 1]} {day.tm_mday} {day.tm_year}, {clock[:5]}"
        cases.append(("shortTime", [ts, NOW]))
        expected.append(short)
    _compare(cases, expected, zone)


def test_status_sentences_read_as_python_writes_them() -> None:
    cases: list[tuple[str, list[Any]]] = []
    expected: list[str] = []
    for status in STATUSES:
        for beat in [None, math.nan, NOW - 3, NOW - 180, NOW - 90_000, NOW + 100]:
            cases.append(("statusSentence", [status, beat, NOW]))
            expected.append(status_sentence(status, beat, NOW))
    assert "stopped without ending its session (crashed or killed); resume it; last heartbeat 3 min ago" in expected
    _compare(cases, expected, "UTC")
