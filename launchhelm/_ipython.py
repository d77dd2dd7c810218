"""``%load_ext launchhelm``: the ``%launchhelm`` line magic.

::

    %launchhelm store [URL]           # the store for the rest of the session (no URL: print it)
    %launchhelm runs PROJECT          # the project's runs, as a live table (tick runs to compare them)
    %launchhelm show RUN              # the run panel: Charts, Checkpoints, Evaluations, Details
    %launchhelm resume RUN            # the "Resume…" checkpoint picker alone
    %launchhelm media RUN             # the run's images, tables and histograms (the Media tab alone)
    %launchhelm chart RUN [KEY ...]   # the run's charts (all keys, or those given)
    %launchhelm evals PROJECT|RUN     # the evaluation table (alias: evaluations)
    %launchhelm help                  # every subcommand, one line each (also %launchhelm?)

The magic returns the table or widget, so it displays as the cell's result
and can be assigned (``panel = %launchhelm show RUN``). Every error (an
unknown run, an unreachable store, a bad URL, a mistyped command) is one
line in the cell, never a traceback.

``%launchhelm store URL`` sets ``$LAUNCHHELM_STORE`` in the kernel, so
``lh.Api()``, ``lh.init()``, the widgets and the training subprocesses a
notebook starts all use that store from then on.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, Protocol

from launchhelm._exceptions import InvalidArgumentError
from launchhelm._runlog._events import validate_project

if TYPE_CHECKING:
    from launchhelm._api import Api

__all__ = ["USAGE", "launchhelm_magic", "load_ipython_extension"]

#: The environment variable every default store comes from.
STORE_VARIABLE = "LAUNCHHELM_STORE"

#: ``%launchhelm help``: each subcommand, one line each.
USAGE = """\
%launchhelm store [URL]            the store for the rest of the session (no URL: print the current one)
%launchhelm runs PROJECT           the project's runs, as a live table (tick runs to compare them)
%launchhelm show RUN               the run's panel: Charts, Checkpoints, Evaluations, Details
%launchhelm resume RUN             the "Resume..." checkpoint picker
%launchhelm media RUN              the run's images (one step slider), tables and histograms
%launchhelm chart RUN [KEY ...]    the run's charts (every key, or those given)
%launchhelm evals PROJECT|RUN      the evaluation table of a project or a run (alias: evaluations)
%launchhelm help                   this list (also %launchhelm?)
runs, show, resume, media, chart and evals also take --store URL, for that command only."""

#: Subcommand -> (the argument it needs, whether more words may follow).
COMMANDS: dict[str, tuple[str, bool]] = {
    "runs": ("PROJECT", False),
    "show": ("RUN", False),
    "resume": ("RUN", False),
    "media": ("RUN", False),
    "chart": ("RUN", True),
    "evals": ("PROJECT|RUN", False),
}
ALIASES = {"evaluations": "evals"}
HELP_WORDS = ("help", "-h", "--help", "?")


class MagicError(InvalidArgumentError):
    """A one-line complaint about a ``%launchhelm`` line (shown without a traceback)."""


def _fail(message: str) -> NoReturn:
    raise MagicError(message)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def current_store() -> str:
    """The store the magics (and ``lh.Api()``, ``lh.init()``) use now."""
    from launchhelm.storage._open import default_store_url

    return default_store_url()


def _parse(words: list[str]) -> tuple[str, list[str], str | None]:
    """(command, its positional words, its --store or None)."""
    command = ALIASES.get(words[0], words[0])
    rest = words[1:]
    store: str | None = None
    positional: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "--store":
            if i + 1 >= len(rest):
                _fail(f"%launchhelm {command}: --store needs a URL")
            store = rest[i + 1]
            i += 2
            continue
        if word.startswith("--store="):
            store = word.split("=", 1)[1]
        elif word.startswith("-"):
            _fail(f"%launchhelm {command}: unknown option {word!r}; see %launchhelm help")
        else:
            positional.append(word)
        i += 1
    if command == "store":
        if store is not None:
            _fail("%launchhelm store: give the URL alone: %launchhelm store URL")
        if len(positional) > 1:
            _fail("%launchhelm store: give one URL")
        return command, positional, None
    if command not in COMMANDS:
        _fail(f"%launchhelm: unknown command {words[0]!r}; the commands are store, {', '.join(COMMANDS)}, help")
    what, more = COMMANDS[command]
    if not positional:
        _fail(f"%launchhelm {command}: give a {what} (%launchhelm {command} {what})")
    if len(positional) > 1 and not more:
        _fail(f"%launchhelm {command}: one {what} only, got {' '.join(positional)}")
    return command, positional, store


def launchhelm_magic(line: str) -> object:
    """Errors print one line; the table or widget is returned (see ``%launchhelm help``)."""
    from IPython.core.error import UsageError

    try:
        try:
            words = shlex.split(line)
        except ValueError as exc:
            _fail(f"%launchhelm: {exc} in {line.strip()!r}")
        if not words or words[0] in HELP_WORDS:
            print(USAGE)
            return None
        command, args, store = _parse(words)
        return _dispatch(command, args, store)
    except MagicError as exc:
        raise UsageError(_one_line(str(exc))) from None
    except Exception as exc:  # the store or the run said no: one readable line, not a traceback
        raise UsageError(_one_line(f"%launchhelm {words[0]}: {_describe(exc)}")) from None


# %launchhelm? shows the magic's docstring: make it the list of subcommands
launchhelm_magic.__doc__ = f"The LaunchHelm notebook commands.\n\n{USAGE}\n"


def _describe(exc: BaseException) -> str:
    from launchhelm._exceptions import LaunchHelmError

    if isinstance(exc, KeyError) and exc.args:
        message = str(exc.args[0])
    else:
        message = str(exc) or type(exc).__name__
    if not isinstance(exc, (LaunchHelmError, KeyError, ValueError)):
        message = f"{type(exc).__name__}: {message}"
    return message


def _set_store(url: str | None) -> None:
    if url is None:
        where = "set by %launchhelm store" if os.environ.get(STORE_VARIABLE) else "the default"
        print(f"store: {current_store()} ({where})")
        return
    from launchhelm._api import Api

    api = Api(url)  # a bad URL or a missing file system package fails here
    projects = api.projects()  # an unreachable store or missing credentials fail here, before it is kept
    os.environ[STORE_VARIABLE] = url
    count = f"{len(projects)} project" + ("" if len(projects) == 1 else "s")
    print(f"store: {api.store.url} ({count}); used by %launchhelm, lh.Api(), lh.init() and the widgets from now on")


def _dispatch(command: str, args: list[str], store: str | None) -> object:
    if command == "store":
        _set_store(args[0] if args else None)
        return None
    from launchhelm._api import Api

    if command == "runs":
        api = Api(store)
        validate_project(args[0])  # a malformed name says so, before looking for it
        projects = api.projects()
        if args[0] not in projects:
            known = ", ".join(projects) if projects else "none yet"
            _fail(f"%launchhelm runs: no project {args[0]!r} in the store {api.store.url} (its projects: {known})")
        return _runs(api, args[0], store)
    from launchhelm import widgets

    if command == "show":
        return widgets.RunPanel(args[0], store=store)
    if command == "resume":
        return widgets.ResumePicker(args[0], store=store)
    if command == "media":
        return widgets.MediaPanel(args[0], store=store)
    if command == "chart":
        return widgets.RunChart(args[0], keys=args[1:] or None, store=store)
    return widgets.EvaluationTable(args[0], store=store)


def _runs(api: Api, project: str, store: str | None) -> object:
    """The :class:`RunsTable` widget in a kernel; elsewhere (or without the widgets extra) a DataFrame
    whose times read as people read them (local time, "3 min ago", durations)."""
    from launchhelm.widgets._kernel import in_kernel

    if in_kernel():
        try:
            from launchhelm.widgets._runs_table import RunsTable
        except ImportError:  # no widgets extra: the table below
            pass
        else:
            return RunsTable(project, store=store)
    from launchhelm._views._runs import readable_runs

    return readable_runs(api.runs(project))


class IPythonShell(Protocol):
    """What is used of IPython's ``InteractiveShell`` (its own hints do not describe this method)."""

    def register_magic_function(
        self, func: Callable[[str], object], magic_kind: str = "line", magic_name: str | None = None
    ) -> None: ...


def load_ipython_extension(ipython: IPythonShell) -> None:
    """Register ``%launchhelm`` (what ``%load_ext launchhelm`` calls)."""
    ipython.register_magic_function(launchhelm_magic, magic_kind="line", magic_name="launchhelm")
