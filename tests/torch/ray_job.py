"""The driver of test_relaunch.py's Ray Train test: the relaunch guide's Ray script, run on one local Ray cluster.

    python ray_job.py SCRIPT EXPERIMENT:CRASH_AT [EXPERIMENT:CRASH_AT ...]

``SCRIPT`` is the guide's Ray Train block as the test took it from docs/guides/relaunch.md (with the test's
declared substitutions: the experiment name and Ray's results folder come from ``EXPERIMENT`` and
``RAY_RESULTS``). Each experiment runs the whole script in a fresh namespace with ``CRASH_AT`` set (-1: no
crash), one after another on a cluster started once here: starting one is most of the time on a small
machine. Without a cluster of its own, the script's ``trainer.fit()`` would start one per experiment.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main() -> None:
    script, experiments = Path(sys.argv[1]), sys.argv[2:]
    import ray

    for attempt in range(3):
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
            break
        except Exception as exc:
            # this Ray waits a fixed 30 s for its raylet to register; a machine running the rest of the
            # suite beside it can take longer: start the cluster again rather than fail the test
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise
            ray.shutdown()
            time.sleep(5)
    code = compile(script.read_text(), str(script), "exec")
    try:
        for spec in experiments:
            name, crash_at = spec.rsplit(":", 1)
            os.environ.update(EXPERIMENT=name, CRASH_AT=crash_at)
            exec(code, {"__name__": "__main__"})  # the guide's script, as `python ray_train.py` runs it
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
