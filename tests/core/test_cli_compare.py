"""``launchhelm compare RUN RUN ... [--keys k1,k2]``: runs side by side from the shell.

If these fail, a person comparing runs in a terminal sees another run's
values, raw timestamps, a config diff that misses what differs, or a
traceback for a typo.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lhtest import child_env
from rewound_runs import rewound_run

from launchhelm._views._humanize import local_time

pytest.importorskip("torch")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("launchhelm") or str(Path(sys.executable).with_name("launchhelm"))
    # the installed command, else the same entry point through the interpreter (an editable install without scripts)
    command = [exe] if Path(exe).exists() else [sys.executable, "-m", "launchhelm._cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120, env=child_env())


def _cells(out: str, label: str) -> list[str]:
    """The cells of the row starting with ``label`` (cells are separated by two spaces or more)."""
    (line,) = [line for line in out.splitlines() if line.startswith(label + " ")]
    return [cell.strip() for cell in line[len(label) :].split("  ") if cell.strip()]


@pytest.mark.slow
def test_compare_prints_latest_values_and_the_config_diff_on_every_store(shared_store_url: str) -> None:
    import launchhelm as lh

    a = rewound_run(shared_store_url, "cli", "alpha", 0.1)
    b = rewound_run(shared_store_url, "cli", "beta", 0.01, close=False, tunables={"clip": 0.5})
    done = _cli("--store", shared_store_url, "compare", a, b)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    head = out.splitlines()[1]
    assert f"alpha ({a})" in head and f"beta ({b})" in head and head.index("alpha") < head.index("beta")
    assert _cells(out, "status") == ["closed", "resumable"]
    assert _cells(out, "step") == ["50", "50"]
    assert _cells(out, "rewinds") == ["1", "1"]
    assert _cells(out, "acc") == ["0.5", "0.5"]
    api = lh.Api(shared_store_url)
    losses = [f"{api.run(r).summary()['metric.train/loss']:.6g}" for r in (a, b)]
    assert _cells(out, "train/loss") == losses
    created = _cells(out, "created")
    assert created[0].startswith(local_time(api.run(a).created) + " (")  # local time, then how long ago
    assert created[0].endswith(("ago)", "(just now)"))
    assert all(c.endswith(" s") or "min" in c for c in _cells(out, "duration"))
    diff = out.split("config diff:\n", 1)[1]
    assert _cells(diff, "config.lr") == ["0.1", "0.01"]
    assert _cells(diff, "tunable.clip") == ["1", "0.5"]
    assert "config.model" not in diff  # the same in both: not a difference


@pytest.mark.slow
def test_compare_says_what_is_wrong_and_runs_reads_times_as_people_do(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    a = rewound_run(store, "cli", "alpha", 0.1)
    time.sleep(0.01)
    b = rewound_run(store, "cli", "beta", 0.1)
    agree = _cli("--store", store, "compare", a, b)
    assert agree.returncode == 0 and "config diff: none (their config and tunables agree)" in agree.stdout
    one = _cli("--store", store, "compare", a)
    assert one.returncode == 2 and "compare needs two runs or more" in one.stderr
    typo = _cli("--store", store, "compare", a, b, "--keys", "acc,loss")
    assert typo.returncode == 2
    assert "--keys loss: none of these runs logged it; their metrics: acc, train/loss" in typo.stderr
    unknown = _cli("--store", store, "compare", a, "zzzzzzzz")
    assert unknown.returncode == 2 and "no run 'zzzzzzzz'" in unknown.stderr
    assert "Traceback" not in one.stderr + typo.stderr + unknown.stderr
    only = _cli("--store", store, "compare", a, b, "--keys", "acc")
    assert only.returncode == 0, only.stderr
    assert _cells(only.stdout, "acc") == ["0.5", "0.5"] and "train/loss" not in only.stdout

    # and `launchhelm runs` reads its times the same way: local time, how long ago, durations
    listing = _cli("--store", store, "runs", "cli")
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert header.split()[4:7] == ["created", "duration", "last_heartbeat"] and "tunable.clip" in header
    import launchhelm as lh

    created = local_time(lh.Api(store).run(a).created)
    row = next(r for r in rows if r.startswith(a))
    assert f"{created} (" in row and ("ago)" in row or "(just now)" in row)  # not raw timestamps
