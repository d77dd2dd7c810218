"""Who launched this process, and which launch of its job it is: the identity behind ``auto_resume``.

A scheduler that relaunches a job (SLURM ``--requeue``, torchrun ``--max-restarts``, a Kubernetes
Job's new pod, SkyPilot's recovery) runs the same command with the same environment, plus a
restart count. :func:`launch_identity` reads that environment once, in a fixed order documented in
``docs/storage.md`` ("Attempts, relaunches and the fence"), and :func:`auto_run_id` turns the
identity into the run id every launch of the job computes alike, so the first launch creates the
run and every relaunch reopens it with no id in the script.

Nothing here touches the store or imports anything heavy: it is called by ``init`` before any I/O.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from launchhelm._exceptions import InvalidArgumentError

__all__ = ["EXPLICIT", "Launch", "auto_run_id", "launch_identity", "launch_script", "newer_attempt"]

EXPLICIT: Final = "explicit"
SLURM: Final = "slurm"
TORCHELASTIC: Final = "torchelastic"
KUBERNETES: Final = "kubernetes"
SKYPILOT: Final = "skypilot"
RAY: Final = "ray"


@dataclass(frozen=True)
class Launch:
    """One launch of a job, as its scheduler describes it.

    ``scheduler`` and ``job`` name the job (the same on every relaunch); ``restart`` orders its
    launches (a higher tuple is a newer attempt; empty when the scheduler gives no count, as for a
    Kubernetes pod, where another ``instance`` is newer); ``instance`` tells two launches with the
    same count apart (the pod's name, the host).
    """

    scheduler: str
    job: str
    restart: tuple[int, ...]
    instance: str

    def as_record(self) -> dict[str, object]:
        """What a session's start event records of its launch (``attempt.launcher``)."""
        return {"scheduler": self.scheduler, "job": self.job, "restart": list(self.restart), "instance": self.instance}


def _count(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name, "")
    if raw == "":
        return 0
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgumentError(f"{name}={raw!r} is not a restart count (a whole number)") from None
    if value < 0:
        raise InvalidArgumentError(f"{name}={raw!r} is not a restart count (it is negative)")
    return value


def _slurm(env: Mapping[str, str]) -> tuple[str, tuple[int, ...]] | None:
    job = env.get("SLURM_JOB_ID", "")
    if not job:
        return None
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    # an array's tasks are jobs of their own (each its own SLURM_JOB_ID), named by array and task so
    # that the name is stable however SLURM numbers the task's job
    name = f"{array_job}_{array_task}" if array_job and array_task else job
    cluster = env.get("SLURM_CLUSTER_NAME", "") or "slurm"
    # SLURM running torchrun: SLURM's requeues outrank torchrun's restarts within one allocation
    return f"{cluster}/{name}", (_count(env, "SLURM_RESTART_COUNT"), _count(env, "TORCHELASTIC_RESTART_COUNT"))


def _kubernetes_job(env: Mapping[str, str]) -> str | None:
    """``<job>/<index>`` of a Job's pod: the Job's name from ``LAUNCHHELM_K8S_JOB`` (the downward API
    can set it from the ``batch.kubernetes.io/job-name`` label), its completion index if indexed."""
    if not env.get("KUBERNETES_SERVICE_HOST"):
        return None
    job = env.get("LAUNCHHELM_K8S_JOB", "")
    if not job:
        return None
    return f"{job}/{env.get('JOB_COMPLETION_INDEX', '0')}"


def _ray_train_experiment() -> str | None:
    """Ray Train's experiment name (``RunConfig(name=...)``) when called inside its training function.

    Read only when Ray Train is already imported (this process is its worker): nothing heavy is imported
    for anyone else.
    """
    if "ray.train" not in sys.modules:
        return None
    try:
        from ray import train

        name = train.get_context().get_experiment_name()
    except Exception:  # not inside trainer.fit()'s training function
        return None
    return str(name) if name else None


def launch_identity(env: Mapping[str, str] | None = None, explicit: str | None = None) -> Launch | None:
    """The job this process belongs to, or ``None`` when no scheduler names one (a laptop).

    The first that applies wins: ``explicit`` (``run_id=``), ``LAUNCHHELM_RUN_ID``; SLURM (with
    torchrun's restart count as a tie-breaker when torchrun runs inside the allocation);
    torchelastic (``TORCHELASTIC_RUN_ID`` other than its default ``none``); Ray Train (its experiment
    name, inside the training function); a Kubernetes Job's pod; SkyPilot (``SKYPILOT_TASK_ID``).
    """
    env = os.environ if env is None else env
    host = socket.gethostname()
    explicit = explicit or env.get("LAUNCHHELM_RUN_ID", "")
    slurm = _slurm(env)
    if explicit:
        restart = slurm[1] if slurm else (_count(env, "TORCHELASTIC_RESTART_COUNT"),)
        return Launch(EXPLICIT, explicit, restart, host)
    if slurm is not None:
        return Launch(SLURM, slurm[0], slurm[1], host)
    elastic = env.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic != "none":
        return Launch(TORCHELASTIC, elastic, (_count(env, "TORCHELASTIC_RESTART_COUNT"),), host)
    experiment = _ray_train_experiment()
    if experiment is not None:
        # a worker group Ray Train restarts (FailureConfig) is new processes: another rank-0 process is newer
        return Launch(RAY, experiment, (), f"{host}:{os.getpid()}")
    k8s = _kubernetes_job(env)
    if k8s is not None:
        # no restart count: each pod is a new attempt; the pod's name tells them apart
        return Launch(KUBERNETES, k8s, (), env.get("HOSTNAME", "") or host)
    task = env.get("SKYPILOT_TASK_ID", "")
    if task:
        return Launch(SKYPILOT, task, (), host)
    return None


def auto_run_id(project: str, launch: Launch) -> str:
    """The run id every launch of this job computes: an explicit id as given, else ``j`` + 19 base-36
    digits of a sha256 of the project, the scheduler and the job, so two projects (or two schedulers'
    jobs that happen to share a number) never share a run."""
    if launch.scheduler == EXPLICIT:
        from launchhelm._runlog._events import validate_run_id

        try:
            return validate_run_id(launch.job)  # a valid run id is the run's id, as given
        except InvalidArgumentError:
            if not launch.job.strip():
                raise InvalidArgumentError("the job's identity (run_id= or LAUNCHHELM_RUN_ID) is blank") from None
            # "exp-42", "My_Run": an identity, not an id; hashed like a scheduler's job below
    digest = hashlib.sha256("\0".join((project, launch.scheduler, launch.job)).encode()).digest()
    number = int.from_bytes(digest[:12], "big")
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
    digits = []
    for _ in range(19):
        number, d = divmod(number, 36)
        digits.append(alphabet[d])
    return "j" + "".join(digits)


def newer_attempt(new: Launch, old: Mapping[str, object] | None) -> bool:
    """Whether launch ``new`` supersedes the session whose recorded launcher is ``old``.

    A higher restart count is newer. Without counts (a Kubernetes pod, SkyPilot), another instance
    is newer: the scheduler starts a new pod only once it gave up on the old one. A launch is never
    newer than itself, nor than a session of another job (that is not a relaunch: refused elsewhere).
    """
    if old is None or old.get("scheduler") != new.scheduler or old.get("job") != new.job:
        return False
    raw = old.get("restart")
    previous = tuple(int(x) for x in raw) if isinstance(raw, (list, tuple)) else ()
    if new.restart or previous:
        return new.restart > previous
    return bool(new.instance) and new.instance != old.get("instance")


def launch_script(argv: list[str] | None = None) -> str:
    """The script a launch runs (its file name, or ``-m``'s module path), not its arguments: a relaunch
    with changed flags is the same job, another script under a reused identity is not."""
    args = sys.argv if argv is None else argv
    first = args[0] if args else ""
    return os.path.basename(first) or "<interactive>"
