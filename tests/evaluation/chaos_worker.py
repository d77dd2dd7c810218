"""An evaluation worker for the chaos test.

    python chaos_worker.py STORE PROJECT LEASE_SECONDS [GO_FILE]

Scores a checkpoint holding its step as text: ``value`` = the step. With
GO_FILE it is the stalled worker: it announces the checkpoint it holds, waits
until GO_FILE exists (the test SIGSTOPs it meanwhile, so its lease lapses),
then returns a poisoned score (-1) that must never be logged, and exits
after that one evaluation.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time

import launchhelm as lh

store, project, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])
go_file = sys.argv[4] if len(sys.argv) > 4 else None
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")


@lh.evaluate(project=project, store=store, lease_seconds=lease, poll_interval=0.25, discover_interval=3.0)
def score(ctx: lh.EvaluationContext) -> dict[str, float]:
    value = float(ctx.download_to().read_text())
    if go_file is not None:
        print(f"stalling {ctx.checkpoint_id}", flush=True)
        while not os.path.exists(go_file):
            time.sleep(0.05)
        return {"value": -1.0, "stalled": 1.0}
    # the test kills workers whose last line is "scoring": inside this function, before any result is
    # published (a worker past "scored" may already have published, and then nobody takes it over)
    print(f"scoring {ctx.checkpoint_id}", flush=True)
    time.sleep(random.uniform(0.2, 0.8))  # long enough for kills to land mid-evaluation
    print(f"scored {ctx.checkpoint_id}", flush=True)
    return {"value": value, "double": 2 * value}


if __name__ == "__main__":
    print("ready", flush=True)
    done = score.serve(max_evaluations=1 if go_file else None)
    print(f"finished {done}", flush=True)
