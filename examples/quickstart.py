"""Quickstart: log a run, read it back, resume it after the session ends.

    python examples/quickstart.py [STORE]

STORE defaults to $LAUNCHHELM_STORE, else ~/.launchhelm.
"""

from __future__ import annotations

import math
import sys

import launchhelm as lh


def main(store: str | None = None) -> str:
    run = lh.init("quickstart", config={"lr": 3e-4, "epochs": 2}, store=store)
    for step in range(1, 101):
        run.global_step = step
        run.log({"loss": math.exp(-step / 30), "lr": 3e-4})
    # end this session but keep the run open, as a job that is pre-empted does
    run.finish(close_run=False)

    again = lh.init("quickstart", resume=run.id, store=store)
    print(f"resumed {again.id} at step {again.global_step}")
    for step in range(101, 151):
        again.global_step = step
        again.log({"loss": math.exp(-step / 30), "lr": 3e-4})
    again.finish()

    handle = lh.Api(store).run(run.id)
    history = handle.history()
    print(f"{handle.name}: {handle.status}, {len(history)} steps, final loss {history['loss'].iloc[-1]:.4f}")
    return run.id


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
