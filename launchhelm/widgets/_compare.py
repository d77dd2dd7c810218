"""``CompareChart``: several runs side by side, one panel per metric, a line per run.

The kernel owns the data, as for :class:`RunChart`: it reads each selected
run through the query API (:meth:`RunHandle.poll`: after the first read,
only what arrived since), keeps each run's line (the values a rewind did
not abandon), smooths it when asked (an exponential moving average with
TensorBoard's debiasing, over the whole series), downsamples each
``(run, key)`` series keeping its extremes (:func:`minmax_indices`, as
``RunChart``) and sends rows as custom messages into a Vega-Lite spec built
here, whose named datasets ``points`` and ``rewinds`` the front end changes
in place (the spec and the points: ``_compare_spec.py``).

Each run keeps its colour whatever else is selected (the colour comes from
its id), the legend names runs by name, and each run's rewinds are dashed
rules in its colour. Beside the chart, the config diff: the ``config.`` and
``tunable.`` values that differ between the selected runs.

Under the charts, when the runs logged images, the media section: one image
key at one step, each run's picture side by side in the chart's run order.
It shares the Media tab's kernel side (:class:`RunMedia`): each run's media
index read once (again now and then while it runs), thumbnails read only
for the step in view and kept, the full image on a click.
"""

from __future__ import annotations

import base64
import html
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar

import traitlets

from launchhelm._api import Api, ProjectReader, RunHandle, RunView, settled_views
from launchhelm._exceptions import InvalidArgumentError, InvalidTypeError, RunNotFoundError
from launchhelm._runlog._events import validate_project
from launchhelm._views._humanize import duration, local_time
from launchhelm._views._runs import ConfigDiff, _epoch, config_diff
from launchhelm.widgets._base import LiveWidget, StoreArg, front_end
from launchhelm.widgets._compare_spec import (
    DEFAULT_MAX_POINTS,
    DEFAULT_SMOOTHING,
    STATIC_POINTS,
    X_AXES,
    _check_names,
    _expand,
    _plain,
    build_compare_spec,
    compare_points,
    ema,
    encode_points,
    metric_keys,
    rewind_rows,
    run_colors,
    run_labels,
)
from launchhelm.widgets._media_index import THUMBNAIL_CACHE_BYTES, RunMedia, media_picture
from launchhelm.widgets._messages import (
    MSG_PICTURES,
    MSG_SNAPSHOT,
    CompareMediaKey,
    CompareMediaState,
    ComparePicturesMessage,
    CompareRewind,
    CompareRun,
    CompareRunPictures,
    CompareSnapshot,
    CompareState,
    FetchMessage,
    ShownRun,
    read_fetch,
    synced_dict,
)
from launchhelm.widgets._static import table_html

if TYPE_CHECKING:
    import pandas as pd

    from launchhelm.media import MediaItem

T = TypeVar("T")


class _XAxisChange(TypedDict):
    """What traitlets hands an observer of ``x_axis``."""

    name: Literal["x_axis"]
    old: str
    new: str
    owner: object
    type: str


class _SmoothChange(TypedDict):
    """... of ``smooth``."""

    name: Literal["smooth"]
    old: bool
    new: bool
    owner: object
    type: str


class _SmoothingChange(TypedDict):
    """... of ``smoothing``."""

    name: Literal["smoothing"]
    old: float
    new: float
    owner: object
    type: str


#: Seconds between reads of a running run's media index (the chart itself polls more often).
MEDIA_INTERVAL = 10.0
#: Thumbnail bytes kept per compared run (the Media tab keeps :data:`THUMBNAIL_CACHE_BYTES` for its one run).
COMPARE_THUMBNAIL_BYTES = THUMBNAIL_CACHE_BYTES // 4

__all__ = [
    "CompareChart",
    "build_compare_spec",
    "compare_points",
    "config_diff",
    "ema",
    "run_colors",
    "run_labels",
]


class CompareChart(LiveWidget[tuple[Api, list[str] | None, list[str] | None]]):
    """Runs side by side: one panel per metric, a line per run, each run's rewinds marked.

    The legend names runs by name; each run keeps its colour whatever else
    is selected; each rewind is a dashed rule in its run's colour ("Resumed
    from step 64 after reaching 120" as tooltip). "x: step / wall time"
    switches the axis, "Smooth" draws an exponential moving average (with
    TensorBoard's debiasing; the raw values stay, faint). Beside the chart,
    the config diff: the config and tunable values that differ between the
    runs. Live while any of the runs is running. Each series is downsampled
    to at most ``max_points`` points, keeping its extremes (as ``RunChart``).

    When the runs logged images, a media section under the charts shows one
    image key (``media_key``) at one step (``media_step``, a slider over
    every step any of the runs logged it at): each run's picture side by
    side, in the legend's order and colours; a run with none at that step
    says so. At a step a rewind redid, a run shows its newest attempt's
    picture, noted as redone. A click on a thumbnail shows the full image.

    Parameters
    ----------
    project:
        The project whose runs to compare.
    runs:
        Run ids (default: every run of the project, newest first).
    keys:
        Metric keys, one panel each (default: every key the runs logged).
    store:
        Store URL or path (default ``$LAUNCHHELM_STORE``, else ``~/.launchhelm``).
    x:
        ``"step"``, ``"time"`` (wall time) or ``"relative"`` (seconds since each run's first point).
    smoothing:
        The EMA weight used when smoothing is on (0 to 0.999; default 0.6).
    max_points:
        Points per ``(run, key)`` series sent to the browser, at most.
    interval:
        Seconds between reads while a run is running.

    Examples
    --------
    >>> from launchhelm.widgets import CompareChart
    >>> CompareChart("quickstart", runs=[a, b], keys=["train/loss"])   # doctest: +SKIP
    """

    spec = traitlets.Dict().tag(sync=True)
    state = synced_dict(CompareState)
    x_axis = traitlets.Unicode("step").tag(sync=True)
    smooth = traitlets.Bool(False).tag(sync=True)
    smoothing = traitlets.Float(DEFAULT_SMOOTHING).tag(sync=True)
    #: Image keys the runs logged, and their steps (the media section; no keys: no section).
    media = synced_dict(CompareMediaState)
    #: The image key the media section shows ("": the first).
    media_key = traitlets.Unicode("").tag(sync=True)
    #: The media section's step (-1: the key's newest).
    media_step = traitlets.Int(-1).tag(sync=True)

    @classmethod
    def _reuse_key(
        cls,
        project: str,
        runs: Sequence[str] | None = None,
        keys: Sequence[str] | None = None,
        store: StoreArg | Api = None,
        *,
        x: str = "step",
        smoothing: float = DEFAULT_SMOOTHING,
        max_points: int = DEFAULT_MAX_POINTS,
        **_: object,
    ) -> tuple[tuple[Hashable, ...], tuple[Api, list[str] | None, list[str] | None]]:
        # checked here, in __new__, so a refused chart is never built half-way (nor kept for reuse)
        if x not in X_AXES:
            raise InvalidArgumentError(f"x={x!r}: use 'step', 'time' (wall time) or 'relative' (since each run began)")
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
            raise InvalidArgumentError(f"smoothing={smoothing!r}: give a weight from 0 up to, not including, 1")
        if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 8:
            raise InvalidArgumentError(f"max_points={max_points!r}: give at least 8")
        if not isinstance(project, str):
            raise InvalidTypeError(f"project={project!r}: give a project name (a string)")
        validate_project(project)
        chosen_runs = _check_names("runs", runs, "run ids")
        chosen_keys = _check_names("keys", keys, "metric keys")
        api = store if isinstance(store, Api) else Api(store)
        key = (
            cls.__qualname__,
            api.store.url,
            project,
            tuple(chosen_runs) if chosen_runs is not None else None,
            tuple(chosen_keys) if chosen_keys is not None else None,
        )
        return key, (api, chosen_runs, chosen_keys)

    def __init__(
        self,
        project: str,
        runs: Sequence[str] | None = None,
        keys: Sequence[str] | None = None,
        store: StoreArg | Api = None,
        *,
        x: str = "step",
        smoothing: float = DEFAULT_SMOOTHING,
        max_points: int = DEFAULT_MAX_POINTS,
        interval: float = 2.0,
    ) -> None:
        if self._reused():
            return
        self._esm, self._css, self.missing_front_end = front_end("compare.js")
        super().__init__(interval=interval, x_axis=x, smoothing=float(smoothing))
        self._setup_live()
        self._api: Api = self._resolved[0]
        self.project = project
        self.max_points = max_points
        self._keys: list[str] | None = self._resolved[2]
        self._all_runs = self._resolved[1] is None
        self._run_ids: list[str] = []
        self._handles: dict[str, RunHandle] = {}
        self._views: dict[str, RunView] = {}
        self._rows: dict[str, dict[str, Any]] = {}
        self._project_reader = ProjectReader(self._api.store, project)
        self._from_dataset: set[str] = set()  # runs whose view came from the project dataset
        self._shown: tuple[object, ...] | None = None
        self._last_snapshot: CompareSnapshot | None = None
        self._last_basis: tuple[object, ...] | None = None
        self._media: dict[str, RunMedia] = {}
        self._media_read: dict[str, float] = {}
        self._fetch_lock = threading.Lock()
        self.observe(self._on_view_option, names=["x_axis", "smooth", "smoothing"])
        try:
            self.set_runs(self._resolved[1] if self._resolved[1] is not None else self._project_runs())
        except Exception:
            self._forget()
            raise

    def __repr__(self) -> str:
        return f"<launchhelm.widgets.CompareChart {self.project} runs={self._run_ids}>"

    # -- what is compared -----------------------------------------------------
    @property
    def runs(self) -> list[str]:
        """The run ids compared, in legend order."""
        return list(self._run_ids)

    def _project_runs(self) -> list[str]:
        handles = self._open(self._api.run_ids(self.project))
        return [h.id for h in sorted(handles, key=lambda h: h.created, reverse=True)]

    def _open(self, run_ids: Sequence[str]) -> list[RunHandle]:
        missing = [r for r in run_ids if r not in self._handles]
        if missing:
            opened = _parallel([partial(self._api.run, r) for r in missing])
            for handle in opened:
                if handle.project != self.project:
                    raise RunNotFoundError(
                        f"run {handle.id} belongs to project {handle.project!r}, not {self.project!r}; "
                        f"compare runs of one project (Api().runs({self.project!r}) lists them)",
                        run_id=handle.id,
                    )
                self._handles[handle.id] = handle
        return [self._handles[r] for r in run_ids]

    def set_runs(self, run_ids: Sequence[str]) -> None:
        """Compare these runs instead (what ticking runs in :class:`RunsTable` does)."""
        chosen = _check_names("runs", list(run_ids), "run ids") or []
        with self._lock:
            self._open(chosen)
            self._run_ids = list(dict.fromkeys(chosen))
            self._views = {r: v for r, v in self._views.items() if r in self._run_ids}
            self._rows = {r: v for r, v in self._rows.items() if r in self._run_ids}
            self._media = {r: m for r, m in self._media.items() if r in self._run_ids}
            self.refresh()

    # -- reading --------------------------------------------------------------
    def is_active(self) -> bool:
        return any(row.get("status") == "running" for row in self._rows.values())

    def _read(self) -> None:
        """Each run's summary row and new points, the runs read concurrently (a few requests each).

        Settled runs the project dataset holds are read from it, as
        :meth:`Api.history` reads them (a few requests for all of them).
        """
        unread = [r for r in self._run_ids if r not in self._views]
        if self._from_dataset or len(unread) > 1:
            settled = settled_views(self._api.store, self.project, self._run_ids, self._keys, self._project_reader)
            for run_id in self._from_dataset - set(settled):
                self._views.pop(run_id, None)  # changed since (resumed, scored): read by itself again
            self._from_dataset = set(settled)
            self._views.update(settled)
        handles = [self._handles[r] for r in self._run_ids if r not in self._from_dataset]

        def one(handle: RunHandle) -> tuple[str, RunView, dict[str, Any] | None]:
            view = handle.poll(keys=self._keys)
            row = self._rows.get(handle.id)
            # a run's row (config, tunables, latest values) changes only while a session is attached
            if row is None or row.get("status") == "running" or view.summary["status"] == "running":
                row = handle.summary()
            return handle.id, view, row

        def summary(handle: RunHandle) -> tuple[str, dict[str, Any]]:
            return handle.id, handle.summary()

        fresh = [partial(summary, self._handles[r]) for r in self._from_dataset if r not in self._rows]
        for run_id, view, row in _parallel([partial(one, h) for h in handles]):
            self._views[run_id] = view
            if row is not None:
                self._rows[run_id] = row
        for run_id, row in _parallel(fresh):
            self._rows[run_id] = row

    def history(self) -> pd.DataFrame:
        """The compared runs' history as :meth:`Api.history` returns it (``run`` column first)."""
        import pandas as pd

        parts = []
        for run_id in self._run_ids:
            view = self._views.get(run_id)
            if view is None:
                continue
            frame = view.history.copy()
            frame.insert(0, "run", run_id)
            parts.append(frame)
        if not parts:
            none: pd.DataFrame = pd.DataFrame({"run": pd.Series([], dtype=object)})
            return none
        result: pd.DataFrame = pd.concat(parts, ignore_index=True, sort=False)
        return result

    def shown_keys(self) -> list[str]:
        """The panels, in order."""
        if self._keys is not None:
            return list(self._keys)
        keys: list[str] = []
        for run_id in self._run_ids:
            view = self._views.get(run_id)
            if view is not None:
                keys.extend(k for k in metric_keys(view.history) if k not in keys)
        return [k for k in keys if not k.startswith("eval/")] + [k for k in keys if k.startswith("eval/")]

    def _runs_shown(self) -> list[ShownRun]:
        colors = run_colors(self._run_ids)
        labels = run_labels({r: self._handles[r].name for r in self._run_ids})
        return [{"id": r, "label": labels[r], "color": colors[r], "name": self._handles[r].name} for r in self._run_ids]

    def diff(self) -> list[ConfigDiff]:
        """The config diff: :func:`config_diff` of the compared runs' rows."""
        return config_diff([self._rows[r] for r in self._run_ids if r in self._rows])

    def points(self, budget: int | None = None) -> pd.DataFrame:
        """The rows the browser holds (:func:`compare_points`, with a ``label`` column)."""
        weight = self.smoothing if self.smooth else 0.0
        rows = compare_points(self.history(), self.shown_keys(), budget=budget or self.max_points, smoothing=weight)
        labels = {r["id"]: r["label"] for r in self._runs_shown()}
        rows.insert(1, "label", [labels.get(r, r) for r in rows["run"].tolist()])
        return rows

    def rewinds(self) -> list[CompareRewind]:
        """Each compared run's rewind markers (``run_id``, ``label``, ``to_step``, ``time``, ``text``)."""
        labels = {r["id"]: r["label"] for r in self._runs_shown()}
        out: list[CompareRewind] = []
        for run_id in self._run_ids:
            view = self._views.get(run_id)
            if view is None:
                continue
            for m in rewind_rows(run_id, view.rewinds, view.history):
                out.append(
                    {
                        "run_id": m["run_id"],
                        "to_step": m["to_step"],
                        "reached": m["reached"],
                        "attempt": m["attempt"],
                        "time": m["time"],
                        "elapsed": m["elapsed"],
                        "text": m["label"],
                        "label": labels[run_id],
                    }
                )
        return out

    def refresh(self) -> None:
        """Re-read the runs; re-embed when the panels changed, else send the new rows."""
        with self._lock:
            self._read()
            self._read_media()
            runs = self._runs_shown()
            keys = self.shown_keys()
            shown = (tuple(keys), tuple((r["id"], r["label"]) for r in runs), self.x_axis, self.smooth)
            self.state = self._state(runs)
            if shown != self._shown:
                self._shown = shown
                self._ready = False  # the front end embeds the new spec, then says ready again
                self._last_snapshot = None
                self.spec = build_compare_spec(keys, runs, x=self.x_axis, smoothed=self.smooth)
                return
            self._send_snapshot()

    def _state(self, runs: list[ShownRun]) -> CompareState:
        described: list[CompareRun] = []
        for run in runs:
            row = self._rows.get(run["id"], {})
            created_s = _epoch(row.get("created"))
            beat_s = _epoch(row.get("last_heartbeat"))
            described.append(
                {
                    **run,
                    "status": row.get("status", ""),
                    "step": _plain(row.get("step")),
                    "created": _plain(created_s),
                    "last_heartbeat": _plain(beat_s),
                    "rewinds": _plain(row.get("rewinds")),
                }
            )
        return {
            "project": self.project,
            "runs": described,
            "diff": [{"key": d["key"], "values": [_plain(v) for v in d["values"]]} for d in self.diff()],
        }

    def _snapshot(self) -> CompareSnapshot:
        labels = {r["id"]: r["label"] for r in self._runs_shown()}
        rows = self.points()
        return {
            "type": MSG_SNAPSHOT,
            "points": encode_points(rows.drop(columns="label"), labels),
            "rewinds": [_plain(r) for r in self.rewinds()],
        }

    def _send_snapshot(self) -> None:
        with self._lock:
            if not self._ready:
                return
            basis = self._basis()
            if self._last_snapshot is not None and basis == self._last_basis:
                return  # no run has new points or rewinds: the browser already shows it all
            snapshot = self._snapshot()
            self._last_basis = basis
            if snapshot == self._last_snapshot:
                return
            self._last_snapshot = snapshot
            self.send(snapshot)

    def _basis(self) -> tuple[object, ...]:
        """What a snapshot is made from: each run's row and rewind counts, and the smoothing."""
        counts = []
        for run_id in self._run_ids:
            view = self._views.get(run_id)
            counts.append((run_id, len(view.history), len(view.rewinds)) if view is not None else (run_id,))
        return (tuple(counts), self.smooth, self.smoothing, self.max_points)

    def snapshot_messages(self) -> list[CompareSnapshot]:
        snapshot = self._snapshot()
        self._last_snapshot, self._last_basis = snapshot, self._basis()
        return [snapshot]

    def _on_view_option(self, change: _XAxisChange | _SmoothChange | _SmoothingChange) -> None:
        if change["name"] == "x_axis" and change["new"] not in X_AXES:
            self.x_axis = change["old"]
            self.error = f"x axis {change['new']!r}: use 'step', 'time' or 'relative'"
            return
        if change["name"] == "smoothing" and not 0 <= float(change["new"]) < 1:
            self.smoothing = change["old"]
            self.error = f"smoothing {change['new']!r}: give a weight from 0 up to, not including, 1"
            return
        with self._lock:
            runs = self._runs_shown()
            keys = self.shown_keys()
            shown = (tuple(keys), tuple((r["id"], r["label"]) for r in runs), self.x_axis, self.smooth)
            if shown != self._shown:
                self._shown = shown
                self._ready = False
                self._last_snapshot = None
                self.spec = build_compare_spec(keys, runs, x=self.x_axis, smoothed=self.smooth)
            else:
                self._send_snapshot()

    # -- the media section ---------------------------------------------------------
    def _read_media(self) -> None:
        """Each run's media index: once, then every :data:`MEDIA_INTERVAL` s while it runs (concurrently)."""
        now = time.monotonic()
        running = {r for r in self._run_ids if self._rows.get(r, {}).get("status") == "running"}
        due = [
            r
            for r in self._run_ids
            if r not in self._media or (r in running and now - self._media_read.get(r, 0.0) >= MEDIA_INTERVAL)
        ]
        for run_id in due:
            self._media.setdefault(run_id, RunMedia(self._handles[run_id], cache_bytes=COMPARE_THUMBNAIL_BYTES))
        _parallel([self._media[r].read for r in due])
        self._media_read.update(dict.fromkeys(due, now))
        state = self._media_state()
        if state != self.media:
            self.media = state

    def _media_state(self) -> CompareMediaState:
        steps: dict[str, set[int]] = {}
        runs: dict[str, list[str]] = {}
        for run_id in self._run_ids:
            media = self._media.get(run_id)
            if media is None:
                continue
            for key in sorted({i.key for i in media.items if i.kind == "image"}):
                steps.setdefault(key, set()).update(media.steps(key))
                runs.setdefault(key, []).append(run_id)
        keys: list[CompareMediaKey] = [{"key": k, "steps": sorted(steps[k]), "runs": runs[k]} for k in sorted(steps)]
        return {"keys": keys}

    @traitlets.validate("media_key")
    def _valid_media_key(self, proposal: dict[str, Any]) -> str:
        key = proposal["value"]
        known = [k["key"] for k in self.media.get("keys", [])]
        if key and known and key not in known:
            raise InvalidArgumentError(
                f"media_key={key!r}: none of the compared runs logged images under it; use one of {known}"
            )
        return str(key)

    @traitlets.validate("media_step")
    def _valid_media_step(self, proposal: dict[str, Any]) -> int:
        step = proposal["value"]
        if step < -1:
            raise InvalidArgumentError(f"media_step={step}: give a step (0 or more), or -1 for the newest")
        return int(step)

    def shown_media(self) -> tuple[str, int]:
        """The image key and step the media section shows (``("", -1)`` when the runs logged no image)."""
        keys = {k["key"]: k for k in self.media.get("keys", [])}
        if not keys:
            return "", -1
        key = self.media_key if self.media_key in keys else next(iter(keys))
        steps = keys[key]["steps"]
        if self.media_step >= 0 or not steps:
            return key, self.media_step
        return key, steps[-1]

    def media_pictures(self, key: str, step: int) -> tuple[ComparePicturesMessage, list[bytes]]:
        """Each compared run's pictures of ``key`` at ``step``, in the chart's run order, and their thumbnails.

        A run shows its newest attempt's pictures there (``redone`` notes an
        earlier, abandoned attempt at that step); a run with none says so in
        ``empty``. Thumbnails the kernel has not kept are read in one
        concurrent round per run.
        """
        with self._lock:
            described: list[CompareRunPictures] = []
            chosen: list[tuple[str, list[MediaItem]]] = []
            for shown in self._runs_shown():
                media = self._media.get(shown["id"])
                images = [i for i in (media.by_step(key).get(step, []) if media else []) if i.kind == "image"]
                newest = max((i.attempt for i in images), default=-1)
                items = sorted((i for i in images if i.attempt == newest), key=lambda i: i.index)
                if items:
                    empty = ""
                elif media is not None and media.steps(key):
                    empty = f"nothing logged at step {step}"
                else:
                    empty = f"logged no {key}"
                described.append(
                    {
                        "id": shown["id"],
                        "label": shown["label"],
                        "color": shown["color"],
                        "empty": empty,
                        "redone": any(i.attempt < newest for i in images),
                        "pictures": [],
                    }
                )
                chosen.append((shown["id"], items))
            read = _parallel([partial(self._media[r].thumbnails, items) for r, items in chosen if items])
        buffers: list[bytes] = []
        thumbnails = iter(read)
        for run, (_, items) in zip(described, chosen, strict=True):
            if not items:
                continue
            for item, data in zip(items, next(thumbnails), strict=True):
                run["pictures"].append(media_picture(item, len(buffers), "image/png"))
                buffers.append(data)
        message: ComparePicturesMessage = {
            "type": MSG_PICTURES,
            "key": key,
            "step": step,
            "full": False,
            "runs": described,
        }
        return message, buffers

    def _full_picture(self, fetch: FetchMessage) -> tuple[ComparePicturesMessage, list[bytes]]:
        run_id = fetch.get("run", "")
        key = fetch["keys"][0] if fetch["keys"] else ""
        with self._lock:
            media = self._media.get(run_id)
            item = media.find(key, fetch["step"], fetch["attempt"], fetch["index"]) if media else None
            if item is None or item.kind != "image":
                raise InvalidArgumentError(
                    f"no image {key!r} of run {run_id!r} at step {fetch['step']} (attempt {fetch['attempt']})"
                )
            shown = next(r for r in self._runs_shown() if r["id"] == run_id)
        picture: CompareRunPictures = {
            "id": run_id,
            "label": shown["label"],
            "color": shown["color"],
            "empty": "",
            "redone": False,
            "pictures": [media_picture(item, 0, item.mime)],
        }
        full: ComparePicturesMessage = {
            "type": MSG_PICTURES,
            "key": key,
            "step": fetch["step"],
            "full": True,
            "runs": [picture],
        }
        return full, [item.read_bytes()]

    def _on_front_end_message(self, _widget: object, content: object, buffers: Sequence[bytes]) -> None:
        fetch = read_fetch(content)
        if fetch is None:
            super()._on_front_end_message(_widget, content, buffers)
            return
        try:
            with self._fetch_lock:
                if fetch["what"] == "thumbnails" and fetch["keys"]:
                    message, data = self.media_pictures(fetch["keys"][0], fetch["step"])
                elif fetch["what"] == "image":
                    message, data = self._full_picture(fetch)
                else:
                    return
                # sent at once: the front end asked, so it listens (``ready`` is about the chart's embed)
                self.send(message, data)
        except Exception as exc:  # shown in the widget: a fetch must never kill the comm
            self.error = f"{type(exc).__name__}: {exc}"

    def media_html(self) -> str:
        """The media section as it stands (its key, at its step; thumbnails inline), as HTML; "" without images."""
        key, step = self.shown_media()
        if not key:
            return ""
        message, buffers = self.media_pictures(key, step)
        cells = []
        for run in message["runs"]:
            figures = []
            for p in run["pictures"]:
                src = "data:image/png;base64," + base64.b64encode(buffers[p["buffer"]]).decode("ascii")
                dim = "opacity:0.45;" if p["abandoned"] else ""
                figures.append(
                    f"<figure style='display:inline-block;margin:4px;{dim}'><img src='{src}' "
                    f"alt='{html.escape(key, quote=True)}' style='max-width:256px'>"
                    f"<figcaption style='font-size:11px'>{html.escape(p['caption'])}</figcaption></figure>"
                )
            note = run["empty"] or ("an earlier attempt redone" if run["redone"] else "")
            swatch = f"<span style='color:{html.escape(run['color'], quote=True)}'>&#9632;</span>"
            cells.append(
                f"<div style='display:inline-block;vertical-align:top;margin:4px 12px 4px 0'>"
                f"<b>{swatch} {html.escape(run['label'])}</b><br>{''.join(figures)}"
                + (f"<div style='font-size:11px;color:#666'>{html.escape(note)}</div>" if note else "")
                + "</div>"
            )
        title = html.escape(f"{key} at step {step}")
        return f"<div class='launchhelm-static-compare-media'><b>{title}</b><div>{''.join(cells)}</div></div>"

    # -- saved notebooks --------------------------------------------------------
    def static_svg(self) -> str | None:
        """The comparison as SVG (fewer points than the live view); None without vl-convert."""
        try:
            import vl_convert
        except ImportError:
            return None
        import copy

        with self._lock:
            spec = copy.deepcopy(self.spec)
            labels = {r["id"]: r["label"] for r in self._runs_shown()}
            rows = self.points(STATIC_POINTS)
            spec["datasets"] = {
                "points": _expand(encode_points(rows.drop(columns="label"), labels)),
                "rewinds": [_plain(r) for r in self.rewinds()],
            }
        try:
            svg: str = vl_convert.vegalite_to_svg(spec)
        except Exception:  # a picture is a nicety: never fail a display for it
            return None
        return svg

    def diff_html(self) -> str:
        """The config diff as an HTML table (inline styles), and each run's facts."""
        state = self.state
        runs = state.get("runs", [])
        header = ["", *[r["label"] for r in runs]]
        facts = [
            ("status", *[r["status"] for r in runs]),
            ("step", *[r["step"] for r in runs]),
            ("created", *[local_time(r["created"]) for r in runs]),
            (
                "duration",
                *[
                    duration(r["last_heartbeat"] - r["created"]) if r["last_heartbeat"] and r["created"] else "-"
                    for r in runs
                ],
            ),
        ]
        diff = [(d["key"], *["-" if v is None else v for v in d["values"]]) for d in state.get("diff", [])]
        caption = "Config diff" if diff else "Config diff: the runs' config and tunables agree"
        return table_html(header, [*facts, *diff], caption, "compare-diff")

    def static_mimebundle(self) -> dict[str, str]:
        svg = self.static_svg() or ""
        try:
            media = self.media_html()
        except Exception:  # a picture is a nicety: the chart and the diff show regardless
            media = ""
        return {"text/html": f"<div class='launchhelm-static-compare'>{svg}{self.diff_html()}{media}</div>"}


def _parallel(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Independent reads concurrently (each batches its own requests); results in order."""
    if len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(max_workers=min(16, len(calls))) as pool:
        return list(pool.map(lambda call: call(), calls))
