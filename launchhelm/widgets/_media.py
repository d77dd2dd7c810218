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
import bisect
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
#: Thumbnail bytes the kernel keeps, so that moving the slider back costs no request.
THUMBNAIL_CACHE_BYTES = 32 * 2**20


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
        self._items: list[MediaItem] = []
        self._at: dict[str, dict[int, list[MediaItem]]] = {}
        self._steps: dict[str, list[int]] = {}
        self._thumbs: dict[str, bytes] = {}
        self._thumb_bytes = 0
        self._histograms_asked = False
        self._histogram_steps: dict[str, list[int]] = {}
        self._fetch_lock = threading.Lock()
        self._esm, self._css, self.missing_front_end = front_end("media.js")
        super().__init__(interval=interval)
        self._setup_live()
        self._api: Api = self._resolved[0]
        self._handle: RunHandle = self._resolved[1]
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
        return list(self._items)

    def refresh(self) -> None:
        """Re-read the run's media index (one listing and one round of reads) and its status."""
        with self._lock:
            items = self._handle.media(self._keys)
            status = self._handle.status
            if len(items) != len(self._items) or items != self._items:
                self._index(items)
            state = media_state(self._handle, self._items, status)
            changed = state["keys"] != self.state.get("keys")
            if state != self.state:
                self.state = state
            if changed and self._histograms_asked and self.ready:
                self._send_histograms()

    def _index(self, items: list[MediaItem]) -> None:
        self._items = items
        at: dict[str, dict[int, list[MediaItem]]] = {}
        for item in items:
            at.setdefault(item.key, {}).setdefault(item.step, []).append(item)
        for by_step in at.values():
            for shown in by_step.values():
                # each picture of a list beside its redo: the abandoned attempt's first (left), then the newer
                shown.sort(key=lambda i: (i.index, not i.abandoned, i.attempt))
        self._at = at
        self._steps = {key: sorted(by_step) for key, by_step in at.items()}

    def _kind(self, key: str) -> str | None:
        shown = self._at.get(key)
        if not shown:
            return None
        return next(iter(shown.values()))[0].kind

    def shown_at(self, key: str, step: int) -> list[MediaItem]:
        """What ``key`` shows with the slider at ``step``: its items there (both attempts at a redone step),
        else those of its last step before it; [] when it has none by then."""
        steps = self._steps.get(key, [])
        where = bisect.bisect_right(steps, step)
        if where == 0:
            return []
        return list(self._at[key][steps[where - 1]])

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
        shown = [(key, item) for key in keys if self._kind(key) == "image" for item in self.shown_at(key, step)]
        missing = [item for _, item in shown if item.thumbnail is not None and item.thumbnail not in self._thumbs]
        unique = list({item.thumbnail: item for item in missing}.values())
        if unique:
            for item, data in zip(unique, MediaItem.read_many_bytes(unique, thumbnail=True), strict=True):
                self._keep_thumbnail(str(item.thumbnail), data)
        pictures: list[MediaPicture] = []
        buffers: list[bytes] = []
        for _key, item in shown:
            kept = self._thumbs.get(str(item.thumbnail)) if item.thumbnail else None
            data = kept if kept is not None else b""
            if kept is None:  # evicted between the read and now: read it alone
                data = item.read_bytes(thumbnail=True)
            pictures.append(self._picture(item, len(buffers), "image/png"))
            buffers.append(data)
        message: PicturesMessage = {
            "type": MSG_PICTURES,
            "step": step,
            "full": False,
            "keys": [k for k in keys if self._kind(k) == "image"],
            "pictures": pictures,
        }
        return message, buffers

    def _keep_thumbnail(self, name: str, data: bytes) -> None:
        while self._thumbs and self._thumb_bytes + len(data) > THUMBNAIL_CACHE_BYTES:
            oldest = next(iter(self._thumbs))
            self._thumb_bytes -= len(self._thumbs.pop(oldest))
        self._thumbs[name] = data
        self._thumb_bytes += len(data)

    @staticmethod
    def _picture(item: MediaItem, buffer: int, mime: str) -> MediaPicture:
        return {
            "key": item.key,
            "step": item.step,
            "attempt": item.attempt,
            "abandoned": item.abandoned,
            "index": item.index,
            "caption": item.caption or "",
            "width": int(item.width or 0),
            "height": int(item.height or 0),
            "mime": mime,
            "buffer": buffer,
        }

    def _send_pictures(self, step: int, keys: Sequence[str]) -> None:
        message, buffers = self.pictures(step, keys)
        self.send_when_ready(message, buffers)

    def _send_full(self, message: FetchMessage) -> None:
        if not message["keys"]:
            return
        key, step = message["keys"][0], message["step"]
        item = next(
            (
                i
                for i in self._at.get(key, {}).get(step, [])
                if i.attempt == message["attempt"] and i.index == message["index"]
            ),
            None,
        )
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
        for key, by_step in self._at.items():
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
