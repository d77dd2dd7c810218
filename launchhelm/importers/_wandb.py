"""W&B run folders (``wandb/offline-run-*``): each ``.wandb`` transaction log, read by W&B's own reader.

W&B writes everything a run logs to ``run-<id>.wandb`` in its folder, a
LevelDB-style log of protocol buffer records. Its own reader is in
``wandb-core``, the binary the ``wandb`` package ships: ``wandb leet inspect
--json`` prints each record as a JSON line, checking every block's
checksum, and says on stderr when a file is incomplete or corrupt. That is
what is read here, so the records mean exactly what W&B means by them.

Folders of one run id (a run resumed offline writes a new folder with the
same id) are one run, read oldest first: steps the resumed part logs again
start a new attempt. History rows give the points (``_step`` and
``_timestamp``; keys starting with ``_`` are W&B's own and not imported;
images, image lists, tables of plain cells and histograms become the run's
media, other media and text are counted and left out), the config records the
config (later ``config.update`` calls included), and the summary's numbers
the runs table's latest values (W&B's summary is what its runs table
shows). Tags, notes and the summary's other values go into the record of the
import.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from launchhelm._exceptions import PathNotFoundError, SourceReadError
from launchhelm.importers._common import ImportResult, Recorder, SourceRun, import_runs, require
from launchhelm.storage import Store

__all__ = ["import_wandb"]

_EXTRA = "import-wandb"
_FOLDER = re.compile(r"^(?:offline-)?run-(\d{8}_\d{6})-([A-Za-z0-9_-]+)$")
_SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _core() -> str:
    util = require("wandb.util", _EXTRA, "importing W&B runs")
    try:
        return str(util.get_core_path())
    except Exception as exc:  # WandbCoreNotAvailableError: no wandb-core for this platform
        raise SourceReadError(f"W&B's reader (wandb-core) is not available here: {exc}") from exc


def _records(core: str, path: Path) -> Iterator[dict[str, Any]]:
    """Each record of one ``.wandb`` file as W&B's reader prints it; a file it calls incomplete or corrupt raises."""
    args = [core, "leet", "inspect", "-json", "-no-observability", "-run-file", str(path)]
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL)
        assert process.stdout is not None
        try:
            for line in process.stdout:
                if line.strip():
                    yield json.loads(line)
        finally:
            process.stdout.close()
            if process.poll() is None:
                process.kill()
            code = process.wait()
        errors.seek(0)
        said = errors.read().decode("utf-8", "replace").strip()
    if code != 0 or said:
        # W&B's reader goes on past a bad block (and exits 0) but says so on stderr: not an exact copy then
        raise SourceReadError(
            f"W&B's reader could not read all of {path} ({said or f'exit status {code}'}); "
            "a run still being written is imported once it has finished; move a damaged folder aside "
            "to import the others",
            source=str(path),
        )


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return _SPECIAL.get(value)
    return None


def _time(text: object) -> float | None:
    """Seconds since the epoch of W&B's RFC 3339 times (nanoseconds and ``Z`` included)."""
    if not isinstance(text, str) or not text:
        return None
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?$", text)
    if match is None:
        return None
    base, fraction, zone = match.groups()
    stamp = datetime.datetime.fromisoformat(base + ("+00:00" if zone in (None, "Z") else zone))
    return stamp.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)


def _apply(target: dict[str, Any], record: dict[str, Any]) -> None:
    """A config or summary record's ``update`` and ``remove`` applied to ``target``."""
    update = record.get("update")
    if isinstance(update, dict):
        target.update(update)
    for key in record.get("remove") or []:
        if isinstance(key, list):
            key = ".".join(map(str, key))
        target.pop(str(key), None)


def _read_files(core: str, files: list[Path], recorder: Recorder) -> None:
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    first_run: dict[str, Any] | None = None
    ended: float | None = None
    point = recorder.point
    media: dict[str, str] = {}
    for path in files:
        started: float | None = None
        step = -1
        for record in _records(core, path):
            kind = record.get("type")
            if kind == "history":
                history = record["history"]
                item = history.get("item") or {}
                number = (history.get("step") or {}).get("num", item.get("_step"))
                step = int(number) if number is not None else step + 1
                when = _number(item.get("_timestamp"))
                when = when if when is not None else (started or 0.0)
                for key in item:
                    if key.endswith("._type"):
                        media[key[: -len("._type")]] = str(item[key])
                fields: dict[str, dict[str, Any]] = {}
                for key, value in item.items():
                    if key.startswith("_"):
                        continue
                    if media and "." in key and (owner := _media_owner(key, media)) is not None:
                        fields.setdefault(owner, {})[key[len(owner) + 1 :]] = value
                        continue
                    number_value = _number(value)
                    if number_value is None:
                        recorder.skip(f"values that are not numbers ({key!r}...)")
                        continue
                    point(key, step, when, number_value)
                for owner, value in fields.items():  # images, tables, histograms: one per value logged
                    _media(recorder, path.parent / "files", owner, step, when, value)
            elif kind == "run":
                run = record["run"]
                started = _time(run.get("start_time"))
                _apply(config, run.get("config") or {})
                if first_run is None:
                    first_run = run
            elif kind == "config":
                _apply(config, record["config"])
            elif kind == "summary":
                _apply(summary, record["summary"])
            elif kind == "exit":
                runtime = _number((record.get("exit") or {}).get("runtime"))
                if started is not None and runtime is not None:
                    ended = started + runtime
    config.pop("_wandb", None)
    recorder.config = config
    run = first_run or {}
    recorder.name = str(run.get("display_name") or run.get("run_id") or recorder.name)
    recorder.created = _time(run.get("start_time"))
    if ended is not None:
        recorder.ended = ended
    numbers: dict[str, float] = {}
    others: dict[str, Any] = {}
    for key, value in summary.items():
        if key.startswith("_") or (media and _media_owner(key, media) is not None):
            continue
        number_value = _number(value)
        if number_value is not None:
            numbers[key] = number_value
        else:
            others[key] = value
    recorder.summary = numbers
    recorder.imported.update(
        {
            "project": run.get("project"),
            "entity": run.get("entity"),
            "run_id": run.get("run_id"),
            "tags": list(run.get("tags") or []),
            "notes": run.get("notes"),
            "group": run.get("run_group") or run.get("group"),
            "job_type": run.get("job_type"),
            "summary": others,
        }
    )


def _media(recorder: Recorder, files: Path, key: str, step: int, when: float, value: dict[str, Any]) -> None:
    """One W&B media value of a history row (its fields, ``_type`` first among them) as LaunchHelm media."""
    from launchhelm.media import Histogram, Image, Table
    from launchhelm.media._read import decode_image
    from launchhelm.media._types import Prepared

    kind = str(value.get("_type"))
    items: list[Prepared]

    def image(relative: object, caption: object) -> Image:
        target = (files / str(relative)).resolve()
        if files.resolve() not in target.parents:
            raise SourceReadError(f"a media path outside the run folder: {relative!r}", source=str(relative))
        return Image(decode_image(target.read_bytes()), caption=caption if isinstance(caption, str) else None)

    try:
        if kind == "image-file":
            items = [image(value.get("path"), value.get("caption"))._prepare(key)]
        elif kind == "images/separated":
            names = list(value.get("filenames") or [])
            captions = list(value.get("captions") or [None] * len(names))
            items = [image(name, caption)._prepare(key) for name, caption in zip(names, captions, strict=False)]
        elif kind == "table-file":
            doc = json.loads((files / str(value.get("path"))).read_bytes())
            items = [Table(columns=doc.get("columns") or [], rows=doc.get("data") or [])._prepare(key)]
        elif kind == "histogram":
            items = [Histogram(counts=value.get("values"), edges=value.get("bins"))._prepare(key)]
        else:
            recorder.skip(f"{kind} values ({key!r}...)")
            return
    except (OSError, ValueError, TypeError, ImportError) as exc:
        recorder.skip(f"{kind} values that could not be read ({key!r}: {type(exc).__name__})")
        return
    if items:
        recorder.media(key, step, when, items)


def _media_owner(key: str, media: dict[str, str]) -> str | None:
    """The media value (an image, a histogram: ``<owner>._type`` was logged) a flattened key belongs to."""
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        owner = ".".join(parts[:i])
        if owner in media:
            return owner
    return None


def _order(path: Path) -> tuple[str, str]:
    match = _FOLDER.match(path.parent.name)
    return (match.group(1) if match else "", path.parent.name)


def _sources(path: str | os.PathLike[str], core: Callable[[], str]) -> list[SourceRun]:
    root = Path(path)
    if root.is_file() and root.suffix == ".wandb":
        files = [root]
    elif root.is_dir():
        files = sorted({p.resolve() for p in root.rglob("run-*.wandb") if p.is_file()})
    else:
        raise PathNotFoundError(
            f"no W&B run folder at {os.fspath(path)!r}: give the wandb/ folder a script wrote "
            "(its offline-run-* folders), one run folder, or a run-*.wandb file",
            path=os.fspath(path),
        )
    if not files:
        raise PathNotFoundError(
            f"no W&B runs (run-*.wandb files in offline-run-* folders) under {os.fspath(path)!r}",
            path=os.fspath(path),
        )
    by_id: dict[str, list[Path]] = {}
    for file in files:
        by_id.setdefault(file.stem[len("run-") :], []).append(file)
    reader = core()  # after the path is known to hold runs: a missing extra is the next thing to say

    def read_group(group: list[Path]) -> Callable[[Recorder], None]:
        return lambda recorder: _read_files(reader, group, recorder)

    sources = []
    for run_id, group in sorted(by_id.items(), key=lambda item: _order(min(item[1], key=_order))):
        group.sort(key=_order)
        sources.append(
            SourceRun(
                kind="wandb",
                # the run id and its first folder's name (start time): stable when the folders move
                key=f"{run_id}\0{group[0].parent.name}",
                label=f"{group[0].parent.name}" + (f" (+{len(group) - 1} resumed)" if len(group) > 1 else ""),
                read=read_group(group),
                name=run_id,
                imported={"uri": os.fspath(path), "folders": [p.parent.name for p in group]},
            )
        )
    return sources


def import_wandb(
    path: str | os.PathLike[str],
    project: str,
    *,
    store: str | os.PathLike[str] | Store | None = None,
    storage_options: Mapping[str, object] | None = None,
    progress: bool = True,
    report: Callable[[str], None] | None = None,
) -> ImportResult:
    """Import W&B run folders (offline runs, ``wandb/offline-run-*``): one LaunchHelm run per W&B run.

    Read with W&B's own reader, which the ``wandb`` package ships:
    ``pip install 'launchhelm[import-wandb]'``. Nothing is sent anywhere.

    Parameters
    ----------
    path:
        The ``wandb/`` folder a script wrote (every run folder below it), one
        run folder, or one ``run-<id>.wandb`` file.
    project:
        The LaunchHelm project the runs go into.
    store, storage_options:
        The LaunchHelm store, as for :func:`launchhelm.init`.
    progress:
        Show a progress bar on stderr.
    report:
        Called with one line per run (what the command line prints).

    Returns
    -------
    ImportResult
        The runs imported, and those found already imported (skipped).

    Raises
    ------
    PathNotFoundError
        ``path`` holds no ``run-*.wandb`` file.
    MissingExtraError
        The ``wandb`` package is not installed (also an ``ImportError``).
    ImportFailedError
        Some runs could not be imported (a file W&B's reader calls
        incomplete or corrupt: :class:`SourceReadError` in ``failures``);
        the others were.

    Examples
    --------
    >>> from launchhelm.importers import import_wandb
    >>> import_wandb("wandb/", "migrated")     # doctest: +SKIP
    <ImportResult migrated: 12 imported, 0 already imported>
    """
    return import_runs(
        "wandb",
        _sources(path, _core),
        project,
        store=store,
        storage_options=storage_options,
        progress=progress,
        report=report,
    )
