"""A run killed after logging pictures and resumed from an earlier checkpoint keeps both attempts' pictures.

What a user would notice if this failed: after a crash and a resume from
step 5, the validation images of steps 6-8 from before the crash are gone
(or the new ones are), so the run cannot show what changed.
"""

from __future__ import annotations

import signal

import numpy as np
import pytest
from lhtest import run_python, spawn

import launchhelm as lh

#: Trains to step 8 with a checkpoint at step 5, logging an image each step; flushes, says so, and waits to be killed.
DOOMED = """
import sys, time
import numpy as np, torch
import launchhelm as lh
import launchhelm.torch as lht

tr = lht.init("media-kill", store=sys.argv[1], flush_interval=3600)
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
tr.watch(model, opt)
print(tr.id, flush=True)
while tr.global_step < 8:
    opt.step()
    step = tr.global_step
    tr.log({"loss": 1.0 / step, "sample": lh.Image(np.full((6, 4, 3), step, dtype=np.uint8), caption=f"first {step}")})
    if step == 5:
        tr.save_checkpoint()
tr.flush()
print("flushed", flush=True)
time.sleep(600)
"""

#: Resumes from the step-5 checkpoint and logs steps 6-8 again with other pixels.
RESUMED = """
import sys
import numpy as np, torch
import launchhelm as lh
import launchhelm.torch as lht

tr = lht.init("media-kill", store=sys.argv[1], resume=sys.argv[2])
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
tr.watch(model, opt)
tr.load_checkpoint("latest")
assert tr.global_step == 5, tr.global_step
while tr.global_step < 8:
    opt.step()
    step = tr.global_step
    tr.log({"sample": lh.Image(np.full((6, 4, 3), 100 + step, dtype=np.uint8), caption=f"again {step}")})
tr.finish()
"""


@pytest.mark.slow
def test_sigkill_then_resume_from_step_5_keeps_both_attempts_images(shared_store_url: str) -> None:
    proc = spawn(DOOMED, shared_store_url)
    assert proc.stdout is not None
    try:
        run_id = proc.stdout.readline().strip()
        assert proc.stdout.readline().strip() == "flushed", proc.stderr.read() if proc.stderr else ""
    finally:
        proc.send_signal(signal.SIGKILL)  # a real SIGKILL: no atexit, no finish()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert lh.Api(shared_store_url).run(run_id).status == "stopped"

    done = run_python(RESUMED, shared_store_url, run_id)
    assert done.returncode == 0, done.stderr
    handle = lh.Api(shared_store_url).run(run_id)
    every = [(i.step, i.attempt, i.abandoned, i.caption) for i in handle.media("sample", duplicates="all")]
    assert every == [(s, 0, False, f"first {s}") for s in range(1, 6)] + [
        row for s in (6, 7, 8) for row in ((s, 0, True, f"first {s}"), (s, 1, False, f"again {s}"))
    ]
    last = handle.media("sample", duplicates="last")
    assert [(i.step, i.attempt, i.caption) for i in last] == [(s, 0, f"first {s}") for s in range(1, 6)] + [
        (s, 1, f"again {s}") for s in (6, 7, 8)
    ]
    for item in last:
        expected = item.step if item.attempt == 0 else 100 + item.step
        np.testing.assert_array_equal(item.load(), np.full((6, 4, 3), expected, dtype=np.uint8))
    abandoned = [i for i in handle.media("sample") if i.abandoned]
    assert [int(i.load()[0, 0, 0]) for i in abandoned] == [6, 7, 8]
