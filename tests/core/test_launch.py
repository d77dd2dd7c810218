"""The job identity behind ``auto_resume``: every relaunch of one job names the same run, two jobs never do.

What a user would notice if this failed: a SLURM requeue or a torchrun restart starting a new run
from step 0 (the identity changed between launches), two jobs with the same number on two clusters
writing into one run, or a zombie of an older launch taking the run back from a newer one.
"""

from __future__ import annotations

import re

import pytest

from launchhelm._exceptions import InvalidArgumentError, LaunchHelmError
from launchhelm._runlog._launch import Launch, auto_run_id, launch_identity, newer_attempt

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_CLUSTER_NAME": "alpha", "SLURM_RESTART_COUNT": "0"}


def test_no_scheduler_is_no_identity() -> None:
    assert launch_identity({"HOME": "/root", "TORCHELASTIC_RUN_ID": "none"}) is None


def test_a_slurm_requeue_names_the_same_run_as_a_newer_attempt() -> None:
    first = launch_identity(SLURM)
    again = launch_identity({**SLURM, "SLURM_RESTART_COUNT": "1"})
    assert first is not None and again is not None
    assert (first.scheduler, first.job) == ("slurm", "alpha/4242")
    assert auto_run_id("p", first) == auto_run_id("p", again)
    assert newer_attempt(again, first.as_record()) and not newer_attempt(first, again.as_record())
    assert not newer_attempt(first, first.as_record())  # a launch never replaces itself


def test_the_same_job_number_on_another_cluster_or_project_is_another_run() -> None:
    here = launch_identity(SLURM)
    there = launch_identity({**SLURM, "SLURM_CLUSTER_NAME": "beta"})
    assert here is not None and there is not None
    ids = {auto_run_id("p", here), auto_run_id("p", there), auto_run_id("q", here)}
    assert len(ids) == 3
    assert all(re.fullmatch(r"j[a-z0-9]{19}", i) for i in ids)
    assert not newer_attempt(there, here.as_record())  # another job is never a relaunch


def test_an_array_task_is_named_by_array_and_task() -> None:
    task = launch_identity({**SLURM, "SLURM_ARRAY_JOB_ID": "4000", "SLURM_ARRAY_TASK_ID": "7"})
    assert task is not None and task.job == "alpha/4000_7"


def test_torchrun_inside_slurm_orders_attempts_by_both_counts() -> None:
    inner = launch_identity({**SLURM, "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "2"})
    requeued = launch_identity({**SLURM, "SLURM_RESTART_COUNT": "1", "TORCHELASTIC_RUN_ID": "def"})
    assert inner is not None and requeued is not None
    assert inner.scheduler == requeued.scheduler == "slurm" and inner.restart == (0, 2)
    assert newer_attempt(requeued, inner.as_record())  # a requeue outranks restarts inside the old allocation


def test_torchelastic_restarts_are_newer_attempts_of_one_run() -> None:
    env = {"TORCHELASTIC_RUN_ID": "3f1c", "TORCHELASTIC_RESTART_COUNT": "0"}
    first, second = launch_identity(env), launch_identity({**env, "TORCHELASTIC_RESTART_COUNT": "1"})
    assert first is not None and second is not None and first.scheduler == "torchelastic"
    assert auto_run_id("p", first) == auto_run_id("p", second) and newer_attempt(second, first.as_record())


def test_an_explicit_id_wins_and_is_the_run_id() -> None:
    launch = launch_identity({**SLURM, "LAUNCHHELM_RUN_ID": "myrun2026"})
    assert launch is not None and launch.scheduler == "explicit"
    assert auto_run_id("p", launch) == "myrun2026"
    assert launch.restart == (0, 0)  # SLURM's counts still order its attempts
    # an identity that is not a run id ("exp-42") names the job; its run id is derived, the same each launch
    derived = auto_run_id("p", Launch("explicit", "Not An Id!", (), "h"))
    assert derived == auto_run_id("p", Launch("explicit", "Not An Id!", (1,), "other")) and derived.startswith("j")
    with pytest.raises(InvalidArgumentError, match="blank"):
        auto_run_id("p", Launch("explicit", "  ", (), "h"))


def test_a_kubernetes_jobs_new_pod_is_a_newer_attempt() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "LAUNCHHELM_K8S_JOB": "train", "JOB_COMPLETION_INDEX": "0"}
    old = launch_identity({**env, "HOSTNAME": "train-0-abcde"})
    new = launch_identity({**env, "HOSTNAME": "train-0-fghij"})
    assert old is not None and new is not None and old.job == new.job == "train/0"
    assert newer_attempt(new, old.as_record()) and not newer_attempt(old, old.as_record())
    assert launch_identity({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "x"}) is None  # no job named


def test_a_restart_count_that_is_not_a_count_is_refused_clearly() -> None:
    with pytest.raises(InvalidArgumentError, match="SLURM_RESTART_COUNT='x'") as info:
        launch_identity({**SLURM, "SLURM_RESTART_COUNT": "x"})
    assert isinstance(info.value, LaunchHelmError) and isinstance(info.value, ValueError)
