"""The evaluation worker of ``evaluate.ipynb``, run in a subprocess as a real worker would be.

    python evaluate_worker.py STORE FLAKY_FOLDER

It scores each checkpoint of project ``evaluate`` (a JSON file holding a
number) until interrupted (Ctrl-C / SIGINT stops it cleanly). The first
evaluation of the step-20 checkpoint fails, once, as a flaky evaluation job
does (a marker file in FLAKY_FOLDER remembers it failed): "Try again" in the
notebook then succeeds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import launchhelm as lh

STORE, FLAKY = sys.argv[1], Path(sys.argv[2])
FLAKY_STEP = 20


@lh.evaluate(project="evaluate", store=STORE, poll_interval=0.2)
def score(ctx: lh.EvaluationContext) -> dict[str, float]:
    weights = json.loads((Path(ctx.download_to()) / "weights.json").read_text())
    marker = FLAKY / f"failed-{ctx.step}"
    if ctx.step == FLAKY_STEP and not marker.exists():
        marker.touch()
        raise RuntimeError("the evaluation data set was not mounted yet")
    return {"accuracy": round(1.0 - 1.0 / (1.0 + weights["w"]), 4)}


if __name__ == "__main__":
    print("worker ready", flush=True)
    try:
        score.serve()
    except KeyboardInterrupt:
        pass
    print("worker stopped", flush=True)
