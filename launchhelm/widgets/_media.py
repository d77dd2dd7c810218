"""``MediaPanel``: a run's images, tables and histograms (the run panel's Media tab).

Every image key in one grid under one step slider: the slider stops at
every step an image or table was logged (none sampled away), and moving it
moves every key. The kernel holds only the run's media index
(:meth:`launchhelm.RunHandle.media`); the front end asks for what it shows
(``fetch`` messages) and gets the bytes in the message's buffers:
thumbnails of the keys in view at the chosen step, one full image when a
thumbnail is clicked, a table's cells, the histograms. So opening it on a
run of any length costs the index's reads plus one round of thumbnails.

At a step a rewind made the run redo, the abandoned attempt's picture shows
beside the new one, dimmed and labelled. Captions and cells come from a
store others write: the front end shows them as text only.
"""

from __future__ import annotations

import base64
import html
import itertools
import threading
from collections.abc import Hashable, Sequence

import traitlets

from launchhelm._api import Api, RunHandle
from launchhelm._exceptions import InvalidArgumentError
from launchhelm._types import RunLike
from launchhelm.media import MediaItem, TableImage
from launchhelm.widgets._base import LiveWidget, StoreArg, front_end, resolve_run, run_key
from launchhelm.widgets._media_index import RunMedia, media_picture
from launchhelm.widgets._messages import (
    MSG_HISTOGRAMS,
    MSG_PICTURES,
    MSG_TABLE,
    FetchMessage,
    HistogramsMessage,
    Json,
    MediaKey,
    MediaPicture,
    MediaState,
    PicturesMessage,
    TableImageCell,
    TableMessage,
    VegaLiteSpec,
    read_fetch,
    synced_dict,
)

__all__ = ["MAX_HISTOGRAM_STEPS", "MediaPanel", "histogram_spec", "media_state"]

#: Steps of a histogram key the chart draws (evenly spread, first and last included): one GET each,
#: in one concurrent round, and a heatmap has no more rows than a screen has pixels anyway.
MAX_HISTOGRAM_STEPS = 100


def media_state(handle: RunHandle, items: Sequence[MediaItem], status: str) -> MediaState:
    """What the Media tab holds: each key, its kind and every step it was logged at."""
    steps: dict[str, set[int]] = {}
    rewound: dict[str, set[int]] = {}
    kinds: dict[str, str] = {}
    for item in items:
        kinds.setdefault(item.key, item.kind)
        steps.setdefault(item.key, set()).add(item.step)
        if item.abandoned:
            rewound.setdefault(item.key, set()).add(item.step)
    keys: list[MediaKey] = [
        {"key": key, "kind": kinds[key], "steps": sorted(steps[key]), "rewound": sorted(rewound.get(key, ()))}
        for key in sorted(kinds)
    ]
    stops = sorted({s for k in keys if k["kind"] != "histogram" for s in k["steps"]})
    return {
        "run": {"id": handle.id, "name": handle.name, "project": handle.project},
        "status": status,
        "keys": keys,
        "steps": stops,
        "empty": "" if keys else "This run has logged no images, tables or histograms yet.",
    }


def _sampled(values: Sequence[MediaItem], most: int) -> list[MediaItem]:
    """At most ``most`` of ``values``, evenly spread, the first and the last kept."""
    if len(values) <= most:
        return list(values)
    last = len(values) - 1
    return [values[round(i * last / (most - 1))] for i in range(most)]


def histogram_spec(rows: list[dict[str, Json]], dark: bool = False) -> VegaLiteSpec:
    """One Vega-Lite chart of every histogram key over steps: a heatmap per key (x: value, y: step, colour: count)."""
    del dark  # the front end applies the theme
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "data": {"values": rows},  # type: ignore[dict-item]
        "facet": {"row": {"field": "key", "type": "nominal", "title": None, "header": {"labelAngle": 0}}},
        "spec": {
            "width": 520,
            "height": 160,
            "mark": {"type": "rect", "tooltip": True},
            "encoding": {
                "x": {"field": "low", "type": "quantitative", "title": "value", "scale": {"zero": False}},
                "x2": {"field": "high"},
                "y": {
                    "field": "step",
                    "type": "quantitative",
                    "title": "step",
                    "scale": {"zero": False, "reverse": True},
                    "axis": {"format": "d", "tickMinStep": 1},
                },
                "y2": {"field": "next"},
                "color": {
                    "field": "count",
                    "type": "quantitative",
                    "scale": {"scheme": "viridis"},
                    "legend": {"title": "count"},
                },
            },
        },
        "resolve": {"scale": {"x": "independent", "y": "independent", "color": "independent"}},
    }


class MediaPanel(LiveWidget[tuple[Api, RunHandle]]):
    """A run's images, tables and histograms, under one step slider (the run panel's Media tab).

    Every image key shows in one grid; the slider stops at every logged step
    and moves them all. Thumbnails show first; a click fetches the full
    image. At a step a rewind redid, the abandoned attempt's picture shows
    beside the new one, dimmed and labelled. Tables show as sortable grids
    with their images inline; histograms as one heatmap chart over steps.

    Parameters
    ----------
    run_or_id:
        A :class:`launchhelm.Run`, a :class:`launchhelm.RunHandle` or a run id.
    keys:
        The media keys to show (default: all).
    store:
        Store URL or path for a run id.
    interval:
        Seconds between reads of the run's media index while it runs.

    Examples
    --------
    >>> from launchhelm.widgets import MediaPanel
    >>> MediaPanel(run_id)                    # doctest: +SKIP
    >>> MediaPanel(run_id, keys=["samples"])  # doctest: +SKIP
    """

    state = synced_dict(MediaState)
    #: The slider's step; -1 follows the newest step logged.
    step = traitlets.Int(-1).tag(sync=True)

    @classmethod
    def _reuse_key(
        cls,
        run_or_id: RunLike | str,
        keys: Sequence[str] | str | None = None,
        store: StoreArg = None,
        **_: object,
    ) -> tuple[tuple[Hashable, ...], tuple[Api, RunHandle]]:
        if keys is not None and not isinstance(keys, str) and not all(isinstance(k, str) for k in keys):
            raise InvalidArgumentError(f"keys={keys!r}: give media keys as strings")
        api, handle = resolve_run(run_or_id, store)
        chosen = (keys,) if isinstance(keys, str) else (tuple(keys) if keys is not None else None)
        return run_key(cls, api, handle, chosen), (api, handle)

    def __init__(
        self,
        run_or_id: RunLike | str,
        keys: Sequence[str] | str | None = None,
        store: StoreArg = None,
        *,
        interval: float = 5.0,
    ) -> None:
        if self._reused():
            return
        self._keys: list[str] | None = [keys] if isinstance(keys, str) else (list(keys) if keys is not None else None)
        self._histograms_asked = False
        self._histogram_steps: dict[str, list[int]] = {}
        self._fetch_lock = threading.Lock()
        self._esm, self._css, self.missing_front_end = front_end("media.js")
        super().__init__(interval=interval)
        self._setup_live()
        self._api: Api = self._resolved[0]
        self._handle: RunHandle = self._resolved[1]
        self._media = RunMedia(self._handle, self._keys)
        self.refresh()

    @property
    def run(self) -> RunHandle:
        """The run shown."""
        return self._handle

    def is_active(self) -> bool:
        return self.state.get("status") == "running"

    # -- reading the store -------------------------------------------------
    @property
    def items(self) -> list[MediaItem]:
        """The media index as the panel holds it (every attempt)."""
        return list(self._media.items)

    def refresh(self) -> None:
        """Re-read the run's media index (one listing and one round of reads) and its status."""
        with self._lock:
            self._media.read()
            status = self._handle.status
            state = media_state(self._handle, self._media.items, status)
            changed = state["keys"] != self.state.get("keys")
            if state != self.state:
                self.state = state
            if changed and self._histograms_asked and self.ready:
                self._send_histograms()

    def _kind(self, key: str) -> str | None:
        return self._media.kind(key)

    def shown_at(self, key: str, step: int) -> list[MediaItem]:
        """What ``key`` shows with the slider at ``step``: its items there (both attempts at a redone step),
        else those of its last step before it; [] when it has none by then."""
        return self._media.shown_at(key, step)

    def _last_step(self) -> int:
        stops = self.state.get("steps") or []
        return int(stops[-1]) if stops else -1

    # -- what the front end asks for ------------------------------------------
    def _on_front_end_message(self, _widget: object, content: object, buffers: Sequence[bytes]) -> None:
        fetch = read_fetch(content)
        if fetch is None:
            super()._on_front_end_message(_widget, content, buffers)
            return
        try:
            with self._fetch_lock:
                self.fetch(fetch)
        except Exception as exc:  # shown in the widget: a fetch must never kill the comm
            self.error = f"{type(exc).__name__}: {exc}"

    def fetch(self, message: FetchMessage) -> None:
        """Answer one ``fetch``: pictures, a table or the histograms, sent to the front end."""
        what = message["what"]
        if what == "thumbnails":
            self._send_pictures(message["step"], message["keys"])
        elif what == "image":
            self._send_full(message)
        elif what == "table":
            for key in message["keys"]:
                self._send_table(key, message["step"])
        else:
            self._histograms_asked = True
            self._send_histograms()

    def pictures(self, step: int, keys: Sequence[str]) -> tuple[PicturesMessage, list[bytes]]:
        """The thumbnails of ``keys`` with the slider at ``step``, and their bytes (one round of reads for
        those the kernel has not kept)."""
        shown = [item for key in keys if self._kind(key) == "image" for item in self.shown_at(key, step)]
        buffers = self._media.thumbnails(shown)
        pictures = [self._picture(item, n, "image/png") for n, item in enumerate(shown)]
        message: PicturesMessage = {
            "type": MSG_PICTURES,
            "step": step,
            "full": False,
            "keys": [k for k in keys if self._kind(k) == "image"],
            "pictures": pictures,
        }
        return message, buffers

    @staticmethod
    def _picture(item: MediaItem, buffer: int, mime: str) -> MediaPicture:
        return media_picture(item, buffer, mime)

    def _send_pictures(self, step: int, keys: Sequence[str]) -> None:
        message, buffers = self.pictures(step, keys)
        self.send_when_ready(message, buffers)

    def _send_full(self, message: FetchMessage) -> None:
        if not message["keys"]:
            return
        key, step = message["keys"][0], message["step"]
        item = self._media.find(key, step, message["attempt"], message["index"])
        if item is None or item.kind != "image":
            raise InvalidArgumentError(f"no image {key!r} at step {step} (attempt {message['attempt']})")
        full: PicturesMessage = {
            "type": MSG_PICTURES,
            "step": step,
            "full": True,
            "keys": [key],
            "pictures": [self._picture(item, 0, item.mime)],
        }
        self.send_when_ready(full, [item.read_bytes()])

    def table(self, key: str, step: int) -> tuple[TableMessage, list[bytes]]:
        """The table ``key`` shows with the slider at ``step`` (its newest attempt there), and its image
        cells' thumbnails."""
        shown = [i for i in self.shown_at(key, step) if i.kind == "table"]
        message: TableMessage = {
            "type": MSG_TABLE,
            "key": key,
            "asked": step,
            "step": -1,
            "attempt": 0,
            "abandoned": False,
            "caption": "",
            "columns": [],
            "rows": [],
        }
        if not shown:
            return message, []
        item = max(shown, key=lambda i: (not i.abandoned, i.attempt, -i.index))  # the newest attempt's first
        columns, rows = item.table_cells()
        buffers: list[bytes] = []
        out: list[list[Json | TableImageCell]] = []
        for row in rows:
            cells: list[Json | TableImageCell] = []
            for cell in row:
                if isinstance(cell, TableImage):
                    cells.append({"buffer": len(buffers), "mime": cell.mime, "caption": cell.caption or ""})
                    buffers.append(cell.data)
                else:
                    cells.append(cell)
            out.append(cells)
        message["step"], message["attempt"], message["abandoned"] = item.step, item.attempt, item.abandoned
        message["caption"], message["columns"], message["rows"] = item.caption or "", columns, out
        return message, buffers

    def _send_table(self, key: str, step: int) -> None:
        if self._kind(key) != "table":
            return
        message, buffers = self.table(key, step)
        self.send_when_ready(message, buffers)

    def histograms(self) -> HistogramsMessage:
        """Every histogram key over its steps (at most :data:`MAX_HISTOGRAM_STEPS` each, evenly spread;
        the newest attempt at a redone step) as one Vega-Lite spec: one concurrent round of reads."""
        chosen: dict[str, list[MediaItem]] = {}
        counts: dict[str, list[int]] = {}
        for key in sorted({item.key for item in self._media.items}):
            by_step = self._media.by_step(key)
            if self._kind(key) != "histogram":
                continue
            newest = [
                [i for i in by_step[s] if i.index == 0 and not i.abandoned] or by_step[s][-1:] for s in sorted(by_step)
            ]
            current = [items[-1] for items in newest if items]
            chosen[key] = _sampled(current, MAX_HISTOGRAM_STEPS)
            counts[key] = [len(chosen[key]), len(current)]
        every = [item for items in chosen.values() for item in items]
        loaded = MediaItem.load_many(every) if every else []
        content = dict(zip([(i.key, i.step) for i in every], loaded, strict=True))
        rows: list[dict[str, Json]] = []
        for key, items in chosen.items():
            steps = [i.step for i in items]
            gap = min((b - a for a, b in itertools.pairwise(steps)), default=1)
            for n, item in enumerate(items):
                hist_counts, edges = content[(key, item.step)]
                following = steps[n + 1] if n + 1 < len(steps) else item.step + gap
                for c, low, high in zip(hist_counts.tolist(), edges[:-1].tolist(), edges[1:].tolist(), strict=True):
                    rows.append(
                        {"key": key, "step": item.step, "next": following, "low": low, "high": high, "count": c}
                    )
        self._histogram_steps = {key: [i.step for i in items] for key, items in chosen.items()}
        return {"type": MSG_HISTOGRAMS, "spec": histogram_spec(rows) if rows else {}, "shown": counts}

    def _send_histograms(self) -> None:
        self.send_when_ready(self.histograms())

    # -- the saved notebook's picture -----------------------------------------------------
    def static_mimebundle(self) -> dict[str, str]:
        """The images at the slider's step (thumbnails, inline), the tables there and the histograms, as HTML."""
        step = self.step if self.step >= 0 else self._last_step()
        keys = self.state.get("keys") or []
        title = html.escape(f"Media of run {self._handle.name} at step {step}")
        parts = [f"<div class='launchhelm-static-media'><b>{title}</b>"]
        images = [k["key"] for k in keys if k["kind"] == "image"]
        message, buffers = self.pictures(step, images)
        for key in images:
            shown = [p for p in message["pictures"] if p["key"] == key]
            figures = []
            for p in shown:
                src = "data:image/png;base64," + base64.b64encode(buffers[p["buffer"]]).decode("ascii")
                label = (f"abandoned attempt {p['attempt']} · " if p["abandoned"] else "") + f"step {p['step']}"
                caption = html.escape(" · ".join(x for x in (label, p["caption"]) if x))
                dim = "opacity:0.45;" if p["abandoned"] else ""
                figures.append(
                    f"<figure style='display:inline-block;margin:4px;{dim}'><img src='{src}' "
                    f"alt='{html.escape(key, quote=True)}' style='max-width:256px'>"
                    f"<figcaption style='font-size:11px'>{caption}</figcaption></figure>"
                )
            parts.append(f"<div><b>{html.escape(key)}</b><br>{''.join(figures) or '-'}</div>")
        from launchhelm.widgets._static import table_html

        for key in [k["key"] for k in keys if k["kind"] == "table"]:
            table, _ = self.table(key, step)
            if table["step"] < 0:
                continue
            rows = [
                [("[image]" + (f" {c['caption']}" if c["caption"] else "")) if isinstance(c, dict) else c for c in row]
                for row in table["rows"]
            ]
            parts.append(table_html(table["columns"], rows, f"{key} at step {table['step']}", "media-table"))
        if any(k["kind"] == "histogram" for k in keys):
            svg = self._histograms_svg()
            if svg:
                from launchhelm.widgets._static import svg_img

                parts.append(svg_img(svg, "histograms over steps"))
        return {"text/html": "".join(parts) + "</div>"}

    def _histograms_svg(self) -> str | None:
        try:
            import vl_convert
        except ImportError:
            return None
        spec = self.histograms()["spec"]
        if not spec:
            return None
        try:
            svg: str = vl_convert.vegalite_to_svg(spec)
        except Exception:  # a picture is a nicety
            return None
        return svg

    def __repr__(self) -> str:
        return f"<launchhelm.widgets.MediaPanel {self._handle.project}/{self._handle.id}>"
