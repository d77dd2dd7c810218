"""``%load_ext launchhelm``: the ``%launchhelm`` line magic.

::

    %launchhelm runs PROJECT          # the project's runs, as a table
    %launchhelm show RUN              # the run panel: Charts, Checkpoints, Evaluations, Details
    %launchhelm resume RUN            # the "Resume…" checkpoint picker alone
    %launchhelm chart RUN [KEY ...]   # the run's charts (all keys, or those given)
    %launchhelm evaluations PROJECT_OR_RUN

Each takes ``--store URL`` (default ``$LAUNCHHELM_STORE``, else
``~/.launchhelm``). The magic returns the table or widget, so it displays
as the cell's result and can be assigned (``panel = %launchhelm show RUN``).
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any, NoReturn

__all__ = ["launchhelm_magic", "load_ipython_extension"]

USAGE = """\
%launchhelm runs PROJECT [--store URL]          the project's runs, as a table
%launchhelm show RUN [--store URL]              the run's panel (Charts, Checkpoints, Evaluations, Details)
%launchhelm resume RUN [--store URL]            the "Resume..." checkpoint picker
%launchhelm chart RUN [KEY ...] [--store URL]   the run's charts
%launchhelm evaluations PROJECT_OR_RUN [--store URL]"""


class _Parser(argparse.ArgumentParser):
    """argparse that raises IPython's UsageError instead of exiting the kernel."""

    def error(self, message: str) -> NoReturn:
        from IPython.core.error import UsageError

        raise UsageError(f"{message}\nusage:\n{USAGE}")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="%launchhelm", add_help=False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, what in (
        ("runs", "project"),
        ("show", "run"),
        ("resume", "run"),
        ("chart", "run"),
        ("evaluations", "target"),
    ):
        cmd = sub.add_parser(name, add_help=False)
        cmd.add_argument(what)
        if name == "chart":
            cmd.add_argument("keys", nargs="*")
        cmd.add_argument("--store", default=None)
    return parser


def launchhelm_magic(line: str) -> Any:
    """``%launchhelm runs|show|resume|chart|evaluations ... [--store URL]``."""
    from IPython.core.error import UsageError

    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"{exc}\nusage:\n{USAGE}") from None
    if not words or words[0] in ("-h", "--help", "help"):
        print(USAGE)
        return None
    args = _parser().parse_args(words)
    from launchhelm._exceptions import LaunchHelmError

    try:
        return _dispatch(args)
    except (LaunchHelmError, KeyError, ValueError) as exc:
        # a readable one-line error in the cell, not a traceback through the magic machinery
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise UsageError(f"%launchhelm {args.command}: {message}") from None


def _dispatch(args: argparse.Namespace) -> Any:
    from launchhelm._api import Api

    if args.command == "runs":
        return Api(args.store).runs(args.project)
    from launchhelm import widgets

    if args.command == "show":
        return widgets.RunPanel(args.run, store=args.store)
    if args.command == "resume":
        return widgets.ResumePicker(args.run, store=args.store)
    if args.command == "chart":
        return widgets.RunChart(args.run, keys=args.keys or None, store=args.store)
    return widgets.EvaluationTable(args.target, store=args.store)


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%launchhelm`` (what ``%load_ext launchhelm`` calls)."""
    ipython.register_magic_function(launchhelm_magic, magic_kind="line", magic_name="launchhelm")
