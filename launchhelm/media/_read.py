"""Reading a run's media: its index in a bounded number of requests, each object on demand."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launchhelm._exceptions import InvalidArgumentError, ObjectNotFoundError
from launchhelm.media._index import INDEX_COLUMNS, choose_index_objects, decode_index
from launchhelm.media._png import decode_png
from launchhelm.storage import Store
from launchhelm.storage._keys import media_index_prefix, media_object_key

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

__all__ = ["MediaItem", "TableImage", "decode_image", "read_media_index"]

KINDS = ("image", "table", "histogram")


@dataclass(frozen=True)
class MediaItem:
    """One image, table or histogram a run logged: what the index says, and :meth:`load` for the content.

    Attributes
    ----------
    key, step, attempt:
        Where it was logged; ``attempt`` as in ``RunHandle.history()``.
    abandoned:
        True when a later rewind went back before ``step`` (the attempt
        redone since; ``media(duplicates="all")`` keeps both).
    kind:
        ``"image"``, ``"table"`` or ``"histogram"``.
    index:
        Its place in the list logged under ``key`` at that step (0 for one item).
    caption:
        The caption given, or None. Text from the store: show it as text.
    size:
        The stored object's bytes.
    height, width:
        An image's pixels; a table's rows and columns; None for a histogram.
    time:
        When it was logged (epoch seconds).
    """

    key: str
    step: int
    attempt: int
    abandoned: bool
    kind: str
    index: int
    caption: str | None
    size: int
    height: int | None
    width: int | None
    time: float
    object: str = field(repr=False)
    thumbnail: str | None = field(repr=False)
    _store: Store = field(repr=False, compare=False)
    _run_id: str = field(repr=False, compare=False)

    def load(self) -> Any:
        """The content: a uint8 ``HxWxC`` numpy array (image), a pandas DataFrame (table, image cells as
        arrays), or ``(counts, edges)`` numpy arrays (histogram). One GET (a table: plus one per image cell)."""
        data = self._store.read(media_object_key(self._run_id, self.object))
        if self.kind == "table":
            return self._table(data)
        return self._decode(data)

    def load_thumbnail(self) -> np.ndarray:
        """An image's thumbnail (longest side at most 256 px) as a uint8 ``HxWxC`` array."""
        if self.thumbnail is None:
            raise InvalidArgumentError(f"media {self.key!r} at step {self.step} is a {self.kind}: it has no thumbnail")
        return decode_image(self._store.read(media_object_key(self._run_id, self.thumbnail)))

    @property
    def mime(self) -> str:
        """The MIME type of the stored object (``image/png``, ``image/jpeg``, ``image/webp``, ``application/json``)."""
        return _mime(self.object)

    def read_bytes(self, thumbnail: bool = False) -> bytes:
        """The stored object's bytes as they are (an image's PNG/JPEG/WebP file; ``thumbnail``: its thumbnail's PNG).

        One GET. For showing an image without decoding it (a browser does that).
        """
        (data,) = MediaItem.read_many_bytes([self], thumbnail=thumbnail)
        return data

    @staticmethod
    def read_many_bytes(items: Sequence[MediaItem], thumbnail: bool = False) -> list[bytes]:
        """The objects of ``items`` (or their thumbnails), read concurrently: one round of GETs for all.

        What a viewer calls for the pictures in view; the order is that of ``items``.
        """
        keys = []
        for item in items:
            name = item.thumbnail if thumbnail else item.object
            if name is None:
                raise InvalidArgumentError(
                    f"media {item.key!r} at step {item.step} is a {item.kind}: it has no thumbnail"
                )
            keys.append((item._store, media_object_key(item._run_id, name)))
        by_store: dict[int, tuple[Store, list[str]]] = {}
        for store, key in keys:
            by_store.setdefault(id(store), (store, []))[1].append(key)
        got: dict[tuple[int, str], bytes | None] = {}
        for ident, (store, wanted) in by_store.items():
            for key, data in store.read_many(wanted).items():
                got[(ident, key)] = data
        out = []
        for item, (store, key) in zip(items, keys, strict=True):
            data = got.get((id(store), key))
            if data is None:
                raise ObjectNotFoundError(f"media {item.key!r} at step {item.step}: its object {key} is missing")
            out.append(data)
        return out

    @staticmethod
    def load_many(items: Sequence[MediaItem]) -> list[Any]:
        """What :meth:`load` gives for each of ``items`` (images and histograms), read in one concurrent round."""
        out: list[Any] = []
        for item, data in zip(items, MediaItem.read_many_bytes(items), strict=True):
            if item.kind == "table":
                out.append(item._table(data))
            else:
                out.append(item._decode(data))
        return out

    def _decode(self, data: bytes) -> Any:
        if self.kind == "image":
            return decode_image(data)
        doc = json.loads(data)
        import numpy as np

        return np.asarray(doc["counts"]), np.asarray(doc["edges"], dtype=np.float64)

    def table_cells(self) -> tuple[list[str], list[list[Any]]]:
        """A table's columns and rows as stored, for a viewer: cells are JSON values, an image cell a
        ``launchhelm.media.TableImage`` holding its thumbnail's PNG. One GET, plus one concurrent round
        for the thumbnails."""
        if self.kind != "table":
            raise InvalidArgumentError(f"media {self.key!r} at step {self.step} is a {self.kind}, not a table")
        doc = json.loads(self.read_bytes())
        columns: list[str] = doc["columns"]
        rows: list[list[Any]] = doc["rows"]
        names = sorted(
            {str(cell.get("thumbnail") or cell["image"]) for row in rows for cell in row if isinstance(cell, dict)}
        )
        fetched = self._store.read_many([media_object_key(self._run_id, n) for n in names]) if names else {}
        out = []
        for row in rows:
            cells: list[Any] = []
            for cell in row:
                if isinstance(cell, dict):
                    name = str(cell.get("thumbnail") or cell["image"])
                    data = fetched.get(media_object_key(self._run_id, name))
                    if data is None:
                        raise ObjectNotFoundError(f"an image of table {self.key!r} at step {self.step} is missing")
                    caption = cell.get("caption")
                    cells.append(TableImage(data, _mime(name), caption if isinstance(caption, str) else None))
                else:
                    cells.append(cell)
            out.append(cells)
        return columns, out

    def _table(self, data: bytes) -> Any:
        import pandas as pd

        doc = json.loads(data)
        columns: list[str] = doc["columns"]
        rows: list[list[Any]] = doc["rows"]
        images = sorted({cell["image"] for row in rows for cell in row if isinstance(cell, dict)})
        fetched = self._store.read_many([media_object_key(self._run_id, name) for name in images]) if images else {}
        pixels = {}
        for name in images:
            blob = fetched.get(media_object_key(self._run_id, name))
            if blob is None:
                raise ObjectNotFoundError(f"an image of table {self.key!r} at step {self.step} is missing: {name}")
            pixels[name] = decode_image(blob)
        data_by_column: dict[str, Any] = {}
        for c, name in enumerate(columns):
            values = [pixels[row[c]["image"]] if isinstance(row[c], dict) else row[c] for row in rows]
            kinds = {type(v) for v in values}
            # one Python type: let pandas pick the dtype; mixed (None among ints, images): objects, cell for cell
            plain = len(kinds) == 1 and kinds <= {int, float, str, bool}
            data_by_column[name] = pd.Series(values, dtype=None if plain else object)
        return pd.DataFrame(data_by_column, columns=columns)


@dataclass(frozen=True)
class TableImage:
    """An image cell of a table, as :meth:`MediaItem.table_cells` gives it: its thumbnail's bytes."""

    data: bytes = field(repr=False)
    mime: str
    caption: str | None


_MIMES = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "jpg": "image/jpeg",
    "webp": "image/webp",
    "json": "application/json",
}


def _mime(name: str) -> str:
    return _MIMES.get(name.rsplit(".", 1)[-1].lower(), "application/octet-stream")


def decode_image(data: bytes) -> np.ndarray:
    """A uint8 ``HxWxC`` array from an image object's bytes: PNG without Pillow, any format with it."""
    try:
        import PIL.Image
    except ImportError:
        pixels = decode_png(data)
        if pixels is None:
            raise
        return pixels
    import io

    import numpy as np

    with PIL.Image.open(io.BytesIO(data)) as image:
        if image.mode not in ("L", "LA", "RGB", "RGBA"):
            image = image.convert("RGBA")
        array = np.array(image, dtype=np.uint8)
    return array[:, :, None] if array.ndim == 2 else array


def read_media_index(store: Store, run_id: str) -> pa.Table:
    """Every index row of the run: one listing of its index, then one concurrent read of the objects chosen.

    A merge that deleted an object between the listing and the read (only
    after the grace period) makes the read start again from a new listing.
    """
    import pyarrow as pa

    from launchhelm.media._index import index_schema

    prefix = media_index_prefix(run_id)
    for _ in range(3):
        chosen = choose_index_objects(store.list(prefix))
        keys = [f"{prefix}/{name}" for name, _, _, _ in chosen]
        got = store.read_many(keys) if keys else {}
        if all(got.get(key) is not None for key in keys):
            tables = [decode_index(got[key]) for key in keys]  # type: ignore[arg-type]
            return pa.concat_tables(tables) if tables else index_schema().empty_table()
    raise ObjectNotFoundError(f"run {run_id}: its media index changed under three reads in a row; try again")


def media_items(
    store: Store, run_id: str, table: pa.Table, state: Any, key: str | list[str] | None, duplicates: str
) -> list[MediaItem]:
    """The index rows as :class:`MediaItem` s, sorted by key, step, attempt and index."""
    import numpy as np

    from launchhelm._metrics._points import abandoned_mask

    columns = {name: table.column(name).to_pylist() for name in INDEX_COLUMNS}
    count = table.num_rows
    if key is not None:
        wanted = {key} if isinstance(key, str) else set(key)
        keep = [i for i in range(count) if columns["key"][i] in wanted]
    else:
        keep = list(range(count))
    steps = np.asarray([columns["step"][i] for i in keep], dtype=np.int64)
    attempts = np.asarray([columns["attempt"][i] for i in keep], dtype=np.int64)
    abandoned = abandoned_mask(steps, attempts, state)
    if duplicates == "last":
        newest: dict[tuple[str, int], int] = {}
        for i in keep:
            where = (columns["key"][i], columns["step"][i])
            newest[where] = max(newest.get(where, -1), columns["attempt"][i])
    items = []
    for n, i in enumerate(keep):
        if duplicates == "last" and columns["attempt"][i] != newest[(columns["key"][i], columns["step"][i])]:
            continue
        items.append(
            MediaItem(
                key=columns["key"][i],
                step=columns["step"][i],
                attempt=columns["attempt"][i],
                abandoned=bool(abandoned[n]),
                kind=columns["kind"][i],
                index=columns["index"][i],
                caption=columns["caption"][i],
                size=columns["size"][i],
                height=columns["height"][i],
                width=columns["width"][i],
                time=columns["time"][i],
                object=columns["object"][i],
                thumbnail=columns["thumbnail"][i],
                _store=store,
                _run_id=run_id,
            )
        )
    items.sort(key=lambda item: (item.key, item.step, item.attempt, item.index))
    return items
