"""A run's media index as a viewer holds it, and the thumbnails it has read.

What the Media tab (:class:`MediaPanel`) and CompareChart's media section
share: the index read once (:meth:`launchhelm.RunHandle.media`, a bounded
number of requests whatever the run's length), items looked up by key and
step, and thumbnails read in one concurrent round for what is in view, kept
up to a byte budget so that moving a slider back costs no request.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from launchhelm._api import RunHandle
from launchhelm.media import MediaItem
from launchhelm.widgets._messages import MediaPicture

__all__ = ["THUMBNAIL_CACHE_BYTES", "RunMedia", "media_picture"]

#: Thumbnail bytes the kernel keeps, so that moving the slider back costs no request.
THUMBNAIL_CACHE_BYTES = 32 * 2**20


def media_picture(item: MediaItem, buffer: int, mime: str) -> MediaPicture:
    """An image as a message describes it; its bytes are the message's buffer ``buffer``."""
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


class RunMedia:
    """One run's media index (every attempt), by key and step, and the thumbnails read so far."""

    def __init__(self, handle: RunHandle, keys: Sequence[str] | None = None, cache_bytes: int = THUMBNAIL_CACHE_BYTES):
        self.handle = handle
        self.keys = list(keys) if keys is not None else None
        self.items: list[MediaItem] = []
        self._at: dict[str, dict[int, list[MediaItem]]] = {}
        self._steps: dict[str, list[int]] = {}
        self._thumbs: dict[str, bytes] = {}
        self._thumb_bytes = 0
        self._cache_bytes = cache_bytes

    def read(self) -> bool:
        """Re-read the index (one listing and one round of reads); whether it changed."""
        items = self.handle.media(self.keys)
        if len(items) == len(self.items) and items == self.items:
            return False
        self.index(items)
        return True

    def index(self, items: list[MediaItem]) -> None:
        self.items = items
        at: dict[str, dict[int, list[MediaItem]]] = {}
        for item in items:
            at.setdefault(item.key, {}).setdefault(item.step, []).append(item)
        for by_step in at.values():
            for shown in by_step.values():
                # each picture of a list beside its redo: the abandoned attempt's first (left), then the newer
                shown.sort(key=lambda i: (i.index, not i.abandoned, i.attempt))
        self._at = at
        self._steps = {key: sorted(by_step) for key, by_step in at.items()}

    def by_step(self, key: str) -> dict[int, list[MediaItem]]:
        """``key``'s items per step (both attempts at a redone step); {} for a key the run never logged."""
        return self._at.get(key, {})

    def steps(self, key: str) -> list[int]:
        """Every step ``key`` was logged at, ascending."""
        return self._steps.get(key, [])

    def kind(self, key: str) -> str | None:
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

    def find(self, key: str, step: int, attempt: int, index: int) -> MediaItem | None:
        """The item of ``key`` logged at ``step`` by ``attempt``, ``index`` in its list; None if none."""
        return next(
            (i for i in self._at.get(key, {}).get(step, []) if i.attempt == attempt and i.index == index),
            None,
        )

    def thumbnails(self, items: Sequence[MediaItem]) -> list[bytes]:
        """The thumbnails of ``items`` (images): one round of reads for those not kept yet."""
        missing = [item for item in items if item.thumbnail is not None and item.thumbnail not in self._thumbs]
        unique = list({item.thumbnail: item for item in missing}.values())
        if unique:
            for item, data in zip(unique, MediaItem.read_many_bytes(unique, thumbnail=True), strict=True):
                self._keep_thumbnail(str(item.thumbnail), data)
        out: list[bytes] = []
        for item in items:
            kept = self._thumbs.get(str(item.thumbnail)) if item.thumbnail else None
            data = kept if kept is not None else b""
            if kept is None:  # evicted between the read and now: read it alone
                data = item.read_bytes(thumbnail=True)
            out.append(data)
        return out

    def _keep_thumbnail(self, name: str, data: bytes) -> None:
        while self._thumbs and self._thumb_bytes + len(data) > self._cache_bytes:
            oldest = next(iter(self._thumbs))
            self._thumb_bytes -= len(self._thumbs.pop(oldest))
        self._thumbs[name] = data
        self._thumb_bytes += len(data)
