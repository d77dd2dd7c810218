"""A Ray Train job for test_relaunch.py: ``TorchTrainer`` on a local Ray cluster, 2 workers, one killed once.

    python ray_job.py STORE OUT EXPERIMENT:KILL_STEP [EXPERIMENT:KILL_STEP ...]

Each worker runs the relaunch guide's loop with ``lht.init(..., auto_resume=True)``: the identity is Ray Train's
experiment name, read inside the training function. With ``--kill-step``, worker 1 SIGKILLs itself after that
step the first time (a marker file says it happened); ``FailureConfig(max_failures=1)`` restarts the group.
Rank 0 writes the final model and optimizer state to ``OUT/EXPERIMENT/final.pt``. The experiments run one
after another on one local Ray cluster (starting one is most of the time on a small machine).
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any


def loop(config: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    import launchhelm.torch as lht

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 4))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    tr = lht.init("ray", store=config["store"], auto_resume=True, system_metrics=False, capture_console=False)
    tr.watch(model, optimizer)
    tr.load_checkpoint("resume")
    marker = Path(config["out"]) / "killed"
    for i in range(tr.global_step, 20):
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1000 * i + rank))
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        tr.log({"loss": float(loss.detach())})
        if tr.global_step % 5 == 0:
            tr.save_checkpoint()
        if rank == 1 and tr.global_step == config["kill_step"] and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
    tr.finish()
    if rank == 0:
        torch.save(
            {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "run": tr.id},
            Path(config["out"]) / "final.pt",
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("out")
    parser.add_argument("experiments", nargs="+", help="NAME:KILL_STEP (-1: no kill)")
    args = parser.parse_args()
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

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
    try:
        for spec in args.experiments:
            name, kill_step = spec.rsplit(":", 1)
            out = Path(args.out) / name
            out.mkdir(parents=True, exist_ok=True)
            trainer = TorchTrainer(
                loop,
                train_loop_config={"store": args.store, "out": str(out), "kill_step": int(kill_step)},
                scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                run_config=RunConfig(
                    name=name,
                    storage_path=tempfile.mkdtemp(prefix="ray-results-"),
                    failure_config=FailureConfig(max_failures=1),
                ),
            )
            trainer.fit()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
