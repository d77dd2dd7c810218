"""The keyword options of every call that starts a run, typed once.

:func:`launchhelm.init`, ``launchhelm.torch.init``, the Lightning logger and
the Transformers callback all take ``**options: Unpack[RunOptions]`` (PEP
692), so a type checker reports a misspelt option in the caller's script,
and each call checks the names again at run time, before it touches a store.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from launchhelm._exceptions import UnknownOptionError

__all__ = ["RUN_OPTIONS", "RUN_PARAMETERS", "RunOptions", "check_options"]


class RunOptions(TypedDict, total=False):
    """The keyword options of :func:`launchhelm.init`, also taken by ``launchhelm.torch.init``,
    ``LaunchHelmLogger`` and ``LaunchHelmCallback``.

    Every option may be left out; the defaults below apply. Type checkers
    (mypy, pyright) check the names and types of these options in calls
    (PEP 692), and an unknown name is refused at run time before anything is
    written.

    Examples
    --------
    >>> import launchhelm as lh
    >>> options: lh.RunOptions = {"flush_interval": 1.0, "system_metrics": False}
    >>> run = lh.init("quickstart", store="memory://options-doc", **options)
    >>> run.finish()
    """

    storage_options: dict[str, Any] | None
    """Passed to fsspec (credentials, ``endpoint_url``...)."""

    takeover: bool
    """With ``resume``: take the run over even if its last session still looks alive (default False).

    Only for when you know that process is gone (a node that vanished); two
    live writers would interleave their metrics.
    """

    flush_interval: float | None
    """Seconds between writes of logged metrics to the store (default 2, or ``LAUNCHHELM_FLUSH_INTERVAL``)."""

    heartbeat_interval: float | None
    """Seconds between the session's heartbeats (default 5, or ``LAUNCHHELM_HEARTBEAT_INTERVAL``)."""

    heartbeat_timeout: float | None
    """Seconds without a heartbeat after which a session on another host counts as dead.

    Default 30, or ``LAUNCHHELM_HEARTBEAT_TIMEOUT``; must exceed
    ``heartbeat_interval``.
    """

    control_interval: float | None
    """Seconds between looks for tunable changes and pause/resume/stop/checkpoint requests.

    Default 3, or ``LAUNCHHELM_CONTROL_INTERVAL``.
    """

    system_metrics: bool | float | None
    """Seconds between samples of CPU, memory, disk, network and NVIDIA GPU metrics; False for none.

    Logged as ``system/...`` by the background thread (default 15, or
    ``LAUNCHHELM_SYSTEM_METRICS``). Read them with
    ``RunHandle.history(stream="system")``.
    """

    capture_console: bool
    """Keep what the process writes to stdout and stderr in the run (default True; False: none).

    The terminal or notebook still shows it; it is written with the metric
    flushes. Read it with ``RunHandle.console()``, follow it with
    ``launchhelm logs RUN --follow`` or the run panel's Logs tab. A script's
    file descriptors 1 and 2 are captured (C extensions and child processes
    included), a notebook's streams at Python level. Under DDP only rank 0
    captures. Output faster than the store takes it, beyond 4 MiB between
    flushes, is dropped and counted in the log, and lines past 64 KiB are
    cut (see ``docs/storage.md``).
    """

    run_id: str | None
    """Create the new run under this id (4-64 lowercase letters and digits) instead of a random one.

    For tools that map another tracker's run ids (``launchhelm.wandb``'s
    ``id=``). Refused with ``AlreadyExistsError`` if a run has it. Not with
    ``resume``.
    """

    compaction_memory: int | str | None
    """Bytes the session's background compaction of metrics may hold at once.

    Bytes or a string such as ``"64MiB"`` (default 64 MiB, or
    ``LAUNCHHELM_COMPACTION_MEMORY``). The session's memory does not grow
    with the run's length: see ``docs/long-runs.md``.
    """

    auto_resume: bool
    """Create the run on the job's first launch and reopen it on every relaunch (default False).

    The run's id comes from ``run_id=``, else ``LAUNCHHELM_RUN_ID``, else the
    scheduler's job (SLURM, torchelastic, a Kubernetes Job, SkyPilot: the
    table in ``docs/guides/relaunch.md``), so a scheduler's relaunch of the
    same command resumes the same run with no id in the script. A relaunch
    that the scheduler numbers as newer takes the run over from a session
    that still looks alive, and fences it (:class:`launchhelm.RunFencedError`).
    With no identity anywhere each launch is a new run. Not with ``resume``.
    Implies ``preemption=True``.
    """

    preemption: bool | None
    """Turn a preemption notice into a checkpoint and a clean, resumable exit (default: ``auto_resume``'s value).

    See ``preemption_signals`` and ``preemption_budget``.
    """

    preemption_signals: tuple[str, ...] | list[str] | None
    """The signals that announce a preemption (default ``("SIGTERM", "SIGUSR1")``)."""

    preemption_budget: float | None
    """Seconds from the notice within which the process exits, saved or not (default 25)."""

    hang_timeout: float | str | None
    """Seconds without a step after which a live session counts as hung; ``"auto"`` (default) or None (off).

    ``"auto"``: once the run has made its first steps, no step for
    max(5 minutes, 10x its slowest recent step). A number counts from the
    first step. Time spent saving or loading a checkpoint, paused, or in an
    evaluation does not count. A small watchdog process beside the training
    process watches (it sees a hang even when the stuck call holds the GIL),
    dumps every thread's stack into the run (``runs/<id>/hangs/``) and, with
    ``auto_resume``, ends the attempt as ``hung`` and kills the process so
    the scheduler relaunches it; without, the process is left alone. It
    takes the signal ``SIGRTMIN+6`` for ``faulthandler`` while the session
    lives. Not on ``memory://`` stores (the watchdog cannot reach them).
    """

    max_failed_restarts: int | None
    """With ``auto_resume``: attempts in a row that end crashed or hung without progress before a refusal.

    Default 3. The next launch then raises
    :class:`launchhelm.RestartLoopError` before it trains; choosing a
    checkpoint (``RunHandle.choose_for_resume``) clears it. None: never refuse.
    """


#: The names :class:`RunOptions` defines, in the order it defines them.
RUN_OPTIONS: tuple[str, ...] = tuple(RunOptions.__annotations__)
#: The named parameters before the options in ``init`` and its kin: suggested for a misspelling too.
RUN_PARAMETERS: tuple[str, ...] = ("name", "config", "tunables", "resume", "store")


def check_options(owner: str, options: Mapping[str, object], parameters: Iterable[str] = ()) -> None:
    """Refuse a keyword that is not an option, naming the closest valid name, before any I/O.

    ``parameters`` are ``owner``'s named parameters (``name``, ``store``...),
    offered as suggestions too: ``confg=`` lands in ``options`` as well.

    Raises
    ------
    UnknownOptionError
        Naming the first unknown keyword and the closest valid name (also a ``TypeError``).
    """
    for given in options:
        if given in RUN_OPTIONS:
            continue
        valid = [*parameters, *RUN_OPTIONS]
        close = difflib.get_close_matches(given, valid, n=1, cutoff=0.6)
        suggestion = close[0] if close else None
        hint = f"did you mean {suggestion!r}? It takes" if suggestion is not None else "it takes"
        raise UnknownOptionError(
            f"{owner}() got an unknown option {given!r}: {hint} {', '.join(valid)} (see launchhelm.RunOptions); "
            "nothing was written",
            option=given,
            suggestion=suggestion,
        )
