"""A training process leaves no native thread pool behind, so it exits 0.

Arrow's CPU and IO pools are C++ ``std::thread``s; once started, tearing them
down at interpreter exit can abort the process ("terminate called without an
active exception", apache/arrow#34314). A DDP rank that aborts at exit fails
the whole ``torchrun`` job, so nothing a session or a read does may start one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from lhtest import ROOT, child_env

SCRIPT = r"""
import os, sys
import numpy, pandas, pyarrow  # their own resident threads (BLAS, jemalloc) start at import

def threads():
    # native threads by name, less jemalloc's background threads (it starts them as it likes; they never abort)
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # ended meanwhile
            pass
    return sorted(n for n in names if n != "jemalloc_bg_thd")

import launchhelm as lh
store = sys.argv[1]
before = threads()
run = lh.init("exit", store=store, system_metrics=False)
for i in range(300):
    run.log({"loss": 1.0 / (i + 1), "acc": i / 300})
run.finish(close_run=False)
again = lh.init("exit", store=store, resume=run.id, system_metrics=False)  # reads the compacted segments
again.log({"loss": 0.5})
again.finish()
api = lh.Api(store)
handle = api.run(run.id)
handle.history()
handle.history(stream="system")
handle.poll()
api.runs("exit")
api.history("exit", keys=["loss"])
import json, threading, time
deadline = time.monotonic() + 5  # a joined thread's OS thread can take a moment to exit on a loaded machine
while threads() != before and time.monotonic() < deadline:
    time.sleep(0.05)
print("threads", json.dumps({"before": before, "after": threads(), "python": [t.name for t in threading.enumerate()]}))
"""


@pytest.mark.slow
def test_no_arrow_thread_pool_outlives_a_session_or_a_read(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "store")],
        env=child_env(LAUNCHHELM_SPOOL="off", OMP_NUM_THREADS="1"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("threads ")][-1]
    seen = json.loads(line.split(" ", 1)[1])
    # every thread a session starts is joined by finish(); no read starts one
    assert seen["after"] == seen["before"], seen
