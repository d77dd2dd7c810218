"""The command line's evaluation commands.

``launchhelm evaluate evaluate_checkpoints:score [--stop-when-idle] [--max-evaluations N]``
runs a worker; ``launchhelm policy evaluation --store s3://bucket/prefix`` (or ``gs://``,
``az://``) prints its least-privilege policy.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType, ModuleType
from typing import TYPE_CHECKING

from launchhelm._evaluation._policies import worker_policy
from launchhelm._evaluation._worker import EvaluationWorker
from launchhelm._exceptions import InvalidArgumentError

if TYPE_CHECKING:
    from typing import TypeAlias

    from launchhelm._api import RunHandle
    from launchhelm._types import JSONValue

    #: The subparsers of a command (``parser.add_subparsers()``).
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["add_commands", "print_evaluations"]


def _load_module(name: str) -> ModuleType:
    if name.endswith(".py") or os.sep in name or "/" in name:
        path = Path(name).absolute()
        if not path.is_file():
            raise InvalidArgumentError(f"no such file {str(path)!r}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise InvalidArgumentError(f"cannot import {str(path)!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        sys.path.insert(0, str(path.parent))
        spec.loader.exec_module(module)
        return module
    sys.path.insert(0, os.getcwd())  # as `python -m` would: the worker's own modules import
    return importlib.import_module(name)


def load_worker(target: str, project: str | None) -> EvaluationWorker:
    """The worker that ``MODULE:FUNCTION`` names (a decorated or a plain score function)."""
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgumentError(f"{target!r}: write MODULE:FUNCTION, e.g. evaluate_checkpoints:score")
    module = _load_module(module_name)
    found = getattr(module, attr, None)
    if isinstance(found, EvaluationWorker):
        return found
    if callable(found):
        if project is None:
            raise InvalidArgumentError(
                f"{target} is a plain function: pass --project, or decorate it with @launchhelm.evaluate(project=...)"
            )
        return EvaluationWorker(found, project=project)
    raise InvalidArgumentError(f"{module_name} has no score function {attr!r}")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # serve() releases its lease and returns


def _cmd_evaluate(args: argparse.Namespace) -> int:
    worker = load_worker(args.target, args.project)
    worker = worker._replace(
        store=args.command_store or args.store,
        project=args.project,
        lease_seconds=args.lease_seconds,
        poll_interval=args.poll_interval,
    )
    logger = logging.getLogger("launchhelm")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as cleanly as Ctrl-C
    finished = worker.serve(args.max_evaluations, stop_when_idle=args.stop_when_idle)
    print(f"evaluated {finished} checkpoint{'s' if finished != 1 else ''} of project {worker.project}")
    return 0


def _cmd_policy(args: argparse.Namespace) -> int:
    store = args.command_store or args.store
    if store is None:
        raise InvalidArgumentError(
            "give the store the workers use: launchhelm policy evaluation --store s3://bucket/prefix "
            "(or gs://bucket/prefix, az://container/prefix)"
        )
    policy: dict[str, JSONValue] = worker_policy(store, project=args.project, principal=args.principal)
    print(json.dumps(policy, indent=2))
    return 0


def add_commands(sub: Subparsers) -> None:
    """Add ``evaluate`` and ``policy`` to the command line's subcommands."""
    evaluate = sub.add_parser(
        "evaluate",
        help="run an evaluation worker: take queued evaluations one at a time (MODULE:FUNCTION)",
        epilog="examples:\n  launchhelm evaluate examples/evaluate_checkpoints.py:score --stop-when-idle",
    )
    evaluate.add_argument("target", metavar="MODULE:FUNCTION", help="e.g. evaluate_checkpoints:score, or file.py:score")
    evaluate.add_argument("--project", help="the project to serve (default: the decorator's)")
    evaluate.add_argument("--store", dest="command_store", help="store URL (default: the decorator's, else --store)")
    evaluate.add_argument("--max-evaluations", type=int, default=None, help="stop after taking this many")
    evaluate.add_argument("--stop-when-idle", action="store_true", help="stop once nothing is left to take")
    evaluate.add_argument("--poll-interval", type=float, default=None, help="seconds between looks at an empty queue")
    evaluate.add_argument("--lease-seconds", type=float, default=None, help="lease length (default 120)")
    evaluate.set_defaults(func=_cmd_evaluate)
    policy = sub.add_parser(
        "policy",
        help="print a least-privilege S3 bucket policy, GCS IAM policy or Azure role assignments for "
        "evaluation workers: policy evaluation --store s3://… | gs://… | az://…",
        epilog="examples:\n  launchhelm policy evaluation --store s3://bucket/prefix "
        "--principal arn:aws:iam::123456789012:role/evaluator",
    )
    policy.add_argument("kind", choices=["evaluation"], help="whose policy: evaluation workers")
    policy.add_argument(
        "--store", dest="command_store", help="the workers' store: s3://bucket/prefix, gs://… or az://container/…"
    )
    policy.add_argument("--project", help="only this project's queue (default: every project)")
    policy.add_argument(
        "--principal",
        help="the workers' identity: an IAM role ARN (S3), serviceAccount:… (GCS) or an object id (Azure)",
    )
    policy.set_defaults(func=_cmd_policy)


def print_evaluations(run: RunHandle) -> None:
    """The ``evaluations:`` part of ``launchhelm show``."""
    evaluations = run.evaluations()
    if evaluations:
        print("evaluations:")
        for ev in evaluations:
            print(f"  {ev.checkpoint}  step {ev.step:<7} {ev.describe()}")
