"""A private SLURM cluster on localhost for the tests: its own ``slurmctld`` and ``slurmd``, Debian's ``slurm-wlm``.

The cluster lives in a temporary folder (``slurm.conf``, state, spool, logs) and listens on free ports;
every command the tests run (``sbatch``, ``scontrol``...) and every job finds it through ``SLURM_CONF``,
which ``sbatch`` passes on to the job with the rest of the environment. Munge is not needed:
slurm 22.05 has ``auth/none`` and ``cred/none``, fine for one trusted host. ``AuthInfo=cred_expire``
is short because SLURM holds a requeued job for ``cred_expire + 1`` seconds (120 by default) before it
may start again. Teardown cancels every job, stops both daemons' process groups, and then kills what
is left with this cluster's ``SLURM_CONF`` in its environment: ``slurmstepd`` daemonizes out of
``slurmd``'s group, so a job step would otherwise outlive the cluster.

Tests that need it are skipped only when ``slurmctld`` is absent outside CI (``scripts/test.sh``
installs ``slurm-wlm``); in CI (``CI=true``) a missing SLURM fails them.
"""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SLURMCTLD = shutil.which("slurmctld") or "/usr/sbin/slurmctld"
SLURMD = shutil.which("slurmd") or "/usr/sbin/slurmd"
CLUSTER = "lhtest"


def slurm_marks() -> list[Any]:
    """``pytestmark`` of a module that uses :func:`slurm_cluster`: one xdist worker owns the cluster."""
    return [
        pytest.mark.slow,
        pytest.mark.xdist_group("slurm"),
        pytest.mark.skipif(
            not os.path.exists(SLURMCTLD) and not os.environ.get("CI"),
            reason="needs SLURM (Debian's slurm-wlm: slurmctld, slurmd, sbatch; scripts/test.sh installs it)",
        ),
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlurmCluster:
    """One node (``localhost``, 2 CPUs), one partition (``debug``), requeue allowed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self._daemons: list[subprocess.Popen[bytes]] = []

    def write_conf(self) -> None:
        user = getpass.getuser()
        for sub in ("state", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            "\n".join(
                [
                    f"ClusterName={CLUSTER}",
                    "SlurmctldHost=localhost",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    f"SlurmUser={user}",
                    f"SlurmdUser={user}",
                    "AuthType=auth/none",
                    "CredType=cred/none",
                    "AuthInfo=cred_expire=5",  # a requeued job may start again cred_expire + 1 s later
                    f"StateSaveLocation={self.root / 'state'}",
                    f"SlurmdSpoolDir={self.root / 'spool'}",
                    f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
                    f"SlurmdPidFile={self.root / 'slurmd.pid'}",
                    f"SlurmctldLogFile={self.root / 'slurmctld.log'}",
                    f"SlurmdLogFile={self.root / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "JobRequeue=1",
                    "MinJobAge=5",
                    "KillWait=30",  # SIGTERM to SIGKILL, as on most clusters
                    "ReturnToService=2",
                    "MpiDefault=none",
                    "MailProg=/bin/true",
                    "NodeName=localhost CPUs=2 RealMemory=1000 State=UNKNOWN",
                    "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

    def start(self, timeout: float = 60) -> None:
        self.write_conf()
        for cmd in ([SLURMCTLD, "-D", "-i"], [SLURMD, "-D", "-N", "localhost"]):
            out = open(self.root / f"{Path(cmd[0]).name}.out", "wb")  # noqa: SIM115  (closed with the daemon)
            self._daemons.append(
                subprocess.Popen(cmd, env=self.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            )
            out.close()
        deadline = time.monotonic() + timeout
        while True:
            shown = self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
            if shown == "idle":
                return
            for daemon in self._daemons:
                if daemon.poll() is not None:
                    raise RuntimeError(f"{daemon.args[0]} exited {daemon.returncode}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the SLURM node is not idle after {timeout:.0f}s (sinfo: {shown!r}):\n{self.logs()}"
                )
            time.sleep(0.2)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) pointed at this cluster."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """A SLURM command (``sbatch``, ``scontrol``...) against this cluster; ``sbatch`` passes ``env`` to the job."""
        done = subprocess.run(cmd, env=self.env(env), capture_output=True, text=True, timeout=30)
        if check and done.returncode:
            raise AssertionError(f"{shlex.join(cmd)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def job_state(self, job: str) -> str:
        """``PENDING``, ``RUNNING``, ``COMPLETED``... or ``""`` once SLURM has forgotten the job."""
        shown = self.run("scontrol", "show", "job", job, check=False).stdout
        for field in shown.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return ""

    def logs(self, tail: int = 3000) -> str:
        parts = []
        for name in ("slurmctld.out", "slurmd.out", "slurmctld.log", "slurmd.log"):
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def _leftovers(self) -> list[int]:
        """Processes started for this cluster (daemons, slurmstepd, job steps): its SLURM_CONF is in their env."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                if mark in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                pass
        return found

    def stop(self) -> list[int]:
        """Cancel every job, stop the daemons; return the pids that had to be SIGKILLed after all that."""
        self.run("scancel", "--full", "--user", getpass.getuser(), check=False)
        deadline = time.monotonic() + 15
        while self.run("squeue", "-h", check=False).stdout.strip() and time.monotonic() < deadline:
            time.sleep(0.2)
        for daemon in self._daemons:
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGTERM)
        for daemon in self._daemons:
            try:
                daemon.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait(5)
        deadline = time.monotonic() + 10
        while (left := self._leftovers()) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A running private SLURM cluster on localhost, stopped (no daemon or step left) at the end."""
    if not os.path.exists(SLURMCTLD):
        pytest.fail("SLURM is not installed (apt-get install slurm-wlm; scripts/test.sh does it in CI)")
    # a short root: slurmd's spool paths and the daemons' sockets must stay short
    root = Path(tmp_path_factory.mktemp("slurm"))
    cluster = SlurmCluster(root)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    yield cluster
    left = cluster.stop()
    assert not left, f"SLURM processes outlived the cluster and were SIGKILLed: {left}"
