"""What ``run.log()`` takes besides numbers: :class:`Image`, :class:`Table`, :class:`Histogram`.

A media object only keeps what it was given; ``log()`` checks it and makes
the copy the store will get (:meth:`Media._prepare`), in the training thread,
before anything of the call is recorded: a bad input raises there, naming the
key. Encoding (PNG, JSON) happens later in the media thread
(``launchhelm.media._writer``).
"""

from __future__ import annotations

import math
import numbers
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from launchhelm._exceptions import InvalidMediaError, InvalidTypeError, MissingExtraError, PathNotFoundError

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "IMAGE_FORMATS",
    "MAX_BINS",
    "MAX_IMAGE_SIDE",
    "MAX_TABLE_CELLS",
    "MAX_TABLE_ROWS",
    "Histogram",
    "Image",
    "Media",
    "PreparedHistogram",
    "PreparedImage",
    "PreparedTable",
    "grid",
    "prepare_media",
]

#: Image formats: PNG (lossless, the default) and the lossy ones Pillow writes.
IMAGE_FORMATS = ("png", "jpeg", "webp")
#: The longest side of an image, in pixels (W&B's and TensorBoard's viewers show far less).
MAX_IMAGE_SIDE = 16384
#: Rows of one table (W&B's limit for tables logged with ``log``).
MAX_TABLE_ROWS = 10_000
#: Cells of one table.
MAX_TABLE_CELLS = 1_000_000
#: Bins of one histogram (W&B's limit; 64 by default, as W&B's).
MAX_BINS = 512
#: Bins of a histogram given as counts and edges (TensorBoard's default bins can give several hundred).
MAX_GIVEN_BINS = 4096
#: Images logged under one key in one call (a list): W&B keeps 108.
MAX_LIST = 1024


class Media:
    """Base of what ``log()`` stores as an object rather than a number.

    ``isinstance(x, launchhelm.Media)`` tells a value that ``log()`` stores
    as an image, table or histogram.
    """

    kind = ""

    def _prepare(self, key: str) -> Prepared:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError


@dataclass(frozen=True)
class PreparedImage:
    """An image checked and copied at ``log()``: uint8 ``HxWxC`` pixels, C in 1..4."""

    pixels: np.ndarray
    caption: str | None
    format: str
    quality: int | None
    kind: str = "image"


@dataclass(frozen=True)
class PreparedTable:
    """A table checked at ``log()``: cells are None, bool, int, float, str or a :class:`PreparedImage`."""

    columns: list[str]
    rows: list[list[Any]]
    caption: str | None
    kind: str = "table"


@dataclass(frozen=True)
class PreparedHistogram:
    """A histogram checked at ``log()``: ``len(edges) == len(counts) + 1``."""

    counts: list[float] | list[int]
    edges: list[float]
    caption: str | None
    kind: str = "histogram"


Prepared = Union[PreparedImage, PreparedTable, PreparedHistogram]  # noqa: UP007 (a runtime alias on 3.10)


def _check_caption(key: str, caption: object) -> str | None:
    if caption is None or isinstance(caption, str):
        return caption
    raise InvalidTypeError(f"media {key!r}: caption must be a string or None, not {type(caption).__name__}")


class Image(Media):
    """An image to log: ``run.log({"samples": lh.Image(array, caption="seed 0")})``.

    Parameters
    ----------
    data:
        A numpy array ``HxW`` or ``HxWxC`` (C = 1, 3 or 4), uint8 or float in
        ``[0, 1]``; a torch tensor ``CxHxW``, ``HxWxC`` or ``NxCxHxW`` (a
        batch, laid out as a grid like torchvision's ``make_grid``); a PIL
        image; or the path of an image file.
    caption:
        Shown under the image.
    format:
        ``"png"`` (lossless, the default), or ``"jpeg"`` / ``"webp"`` with
        ``quality`` (1-100, default 90): smaller objects, pixels not exact.
        The lossy formats need Pillow.
    quality:
        For ``"jpeg"`` and ``"webp"`` only.

    Notes
    -----
    Nothing is checked or copied until ``log()``: there the image is checked
    (a bad one raises, naming the key, and nothing of the call is recorded)
    and its pixels are copied; encoding happens in the background.

    Examples
    --------
    >>> run.log({"val/samples": [lh.Image(x, caption=p) for x, p in zip(images, prompts)]})  # doctest: +SKIP
    """

    kind = "image"

    def __init__(
        self, data: object, caption: str | None = None, *, format: str = "png", quality: int | None = None
    ) -> None:
        self.data = data
        self.caption = caption
        self.format = format
        self.quality = quality

    def __repr__(self) -> str:
        shape = getattr(self.data, "shape", None)
        what = f"shape {tuple(shape)}" if shape is not None else type(self.data).__name__
        return f"<launchhelm.Image {what}{f' {self.caption!r}' if self.caption else ''}>"

    def _prepare(self, key: str) -> PreparedImage:
        caption = _check_caption(key, self.caption)
        if self.format not in IMAGE_FORMATS:
            raise InvalidMediaError(f"media {key!r}: format={self.format!r}: use one of {IMAGE_FORMATS}", key=key)
        quality = self.quality
        if self.format == "png":
            if quality is not None:
                raise InvalidMediaError(f"media {key!r}: quality is for 'jpeg' and 'webp'; PNG is lossless", key=key)
        else:
            _check_pillow(f"media {key!r}: format={self.format!r}")
            if quality is None:
                quality = 90
            if type(quality) is not int or not 1 <= quality <= 100:
                raise InvalidMediaError(f"media {key!r}: quality={quality!r}: give an int from 1 to 100", key=key)
        return PreparedImage(image_pixels(key, self.data), caption, self.format, quality)


_pillow_found: bool | None = None


def _check_pillow(what: str) -> None:
    """Refuse at ``log()`` where Pillow is missing, without importing it: the helper process encodes."""
    global _pillow_found
    if _pillow_found is None:
        import importlib.util

        _pillow_found = importlib.util.find_spec("PIL") is not None
    if not _pillow_found:
        _require_pillow(what)


def _require_pillow(what: str) -> Any:
    try:
        import PIL.Image
    except ImportError:
        raise MissingExtraError(
            f"{what} needs Pillow: pip install 'launchhelm[media]' (or pip install pillow)",
            extra="media",
            package="PIL",
        ) from None
    return PIL.Image


def image_pixels(key: str, data: object) -> np.ndarray:
    """A fresh uint8 ``HxWxC`` copy of ``data`` (see :class:`Image`), or a clear error naming ``key``."""
    import numpy as np

    module = type(data).__module__ or ""
    if isinstance(data, (str, os.PathLike)):
        return _file_pixels(key, os.fspath(data))
    if module.startswith("PIL"):
        return _pil_pixels(data)
    torch_layout = False
    if module.startswith("torch") and hasattr(data, "detach"):
        tensor: Any = data
        data = tensor.detach().cpu().numpy()
        torch_layout = True
    if not isinstance(data, np.ndarray):
        raise InvalidTypeError(
            f"media {key!r}: an image is a numpy array, a torch tensor, a PIL image or a file path, "
            f"not {type(data).__name__}"
        )
    array = data
    if torch_layout and array.ndim == 4:
        array = grid(np.ascontiguousarray(array.transpose(0, 2, 3, 1)) if array.shape[1] in (1, 3, 4) else array)
    elif torch_layout and array.ndim == 3 and array.shape[0] in (1, 3, 4) and array.shape[2] not in (1, 3, 4):
        array = array.transpose(1, 2, 0)  # torch's CxHxW
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4):
        hint = "HxW or HxWxC with C = 1, 3 or 4" + (", or CxHxW / NxCxHxW for a torch tensor" if torch_layout else "")
        raise InvalidMediaError(f"media {key!r}: an image of shape {tuple(data.shape)}: give {hint}", key=key)
    height, width = array.shape[:2]
    if not (0 < height <= MAX_IMAGE_SIDE and 0 < width <= MAX_IMAGE_SIDE):
        raise InvalidMediaError(
            f"media {key!r}: an image of {height}x{width} pixels: each side must be 1 to {MAX_IMAGE_SIDE:,} pixels",
            key=key,
        )
    if array.dtype == np.uint8:
        out = take_buffer(array.shape)
        np.copyto(out, array)
        return out
    if np.issubdtype(array.dtype, np.floating):
        with np.errstate(invalid="ignore"):
            low, high = float(array.min()), float(array.max())
        if math.isnan(low) or math.isnan(high):
            raise InvalidMediaError(f"media {key!r}: the image has NaN pixels; log finite values in [0, 1]", key=key)
        if low < 0.0 or high > 1.0:
            raise InvalidMediaError(
                f"media {key!r}: a float image must be in [0, 1], this one spans [{low:g}, {high:g}]; "
                "scale it, or convert to uint8",
                key=key,
            )
        return np.asarray(np.rint(array.astype(np.float32) * 255.0), dtype=np.uint8, order="C")
    raise InvalidTypeError(
        f"media {key!r}: an image of dtype {array.dtype}: give uint8 (0-255) or float in [0, 1] "
        "(e.g. x.astype(np.uint8))"
    )


#: Pixel buffers the media thread is done with, by shape, for log() to copy into: a fresh buffer of an
#: image's size is new pages from the kernel, whose first touch costs log() more than the copy itself.
_SPARE: dict[tuple[int, ...], list[np.ndarray]] = {}
#: Buffers kept per shape, and bytes kept in all.
_SPARE_PER_SHAPE = 4
_SPARE_BYTES = 64 * 2**20
_spare_bytes = 0
_spare_lock = threading.Lock()


def take_buffer(shape: tuple[int, ...]) -> np.ndarray:
    """A uint8 buffer of ``shape`` to copy pixels into: a spare one if there is one."""
    global _spare_bytes
    import numpy as np

    with _spare_lock:
        spare = _SPARE.get(shape)
        if spare:
            buffer = spare.pop()
            _spare_bytes -= buffer.nbytes
            return buffer
    return np.empty(shape, dtype=np.uint8)


def give_back(pixels: np.ndarray) -> None:
    """The media thread is done with ``pixels`` (nothing else holds them): keep them for a next ``log()``."""
    global _spare_bytes
    with _spare_lock:
        spare = _SPARE.setdefault(pixels.shape, [])
        if len(spare) < _SPARE_PER_SHAPE and _spare_bytes + pixels.nbytes <= _SPARE_BYTES:
            spare.append(pixels)
            _spare_bytes += pixels.nbytes


def _pil_pixels(image: Any) -> np.ndarray:
    import numpy as np

    if image.mode not in ("L", "LA", "RGB", "RGBA"):
        image = image.convert("RGBA" if "A" in image.mode or "transparency" in image.info else "RGB")
    array = np.array(image, dtype=np.uint8)
    return array[:, :, None] if array.ndim == 2 else array


def _file_pixels(key: str, path: str) -> np.ndarray:
    if not os.path.isfile(path):
        raise PathNotFoundError(f"media {key!r}: no image file at {path!r}", path=path)
    with open(path, "rb") as f:
        data = f.read()
    try:
        pil = _require_pillow(f"media {key!r}: reading the image file {path!r}")
    except MissingExtraError:
        from launchhelm.media._png import decode_png

        pixels = decode_png(data)
        if pixels is None:
            raise
        return pixels
    import io

    try:
        with pil.open(io.BytesIO(data)) as image:
            image.load()
            return _pil_pixels(image)
    except (OSError, ValueError) as exc:
        raise InvalidMediaError(f"media {key!r}: {path!r} is not an image Pillow can read: {exc}", key=key) from None


def grid(batch: np.ndarray, columns: int = 8, padding: int = 2) -> np.ndarray:
    """``NxHxWxC`` images laid out as torchvision's ``make_grid`` does: ``columns`` wide, 2 px of black between."""
    import numpy as np

    count, height, width, channels = batch.shape
    if count == 0:
        return batch.reshape(0, 0, channels)
    across = min(columns, count)
    down = (count + across - 1) // across
    cell_h, cell_w = height + padding, width + padding
    out = np.zeros((down * cell_h + padding, across * cell_w + padding, channels), dtype=batch.dtype)
    for i in range(count):
        y, x = divmod(i, across)
        top, left = y * cell_h + padding, x * cell_w + padding
        out[top : top + height, left : left + width] = batch[i]
    return out


class Table(Media):
    """A table to log: from a DataFrame, or ``columns`` and ``rows``.

    Cells are None, bools, ints, floats (numpy scalars too), strings or
    :class:`Image`. At most 10,000 rows and 1,000,000 cells.

    Parameters
    ----------
    dataframe:
        A pandas DataFrame (column names become strings).
    columns, rows:
        Column names and a sequence of rows, each a sequence of cells.
    caption:
        Shown with the table.

    Examples
    --------
    >>> run.log({"completions": lh.Table(columns=["prompt", "completion", "reward"], rows=rows)})  # doctest: +SKIP
    """

    kind = "table"

    def __init__(
        self,
        dataframe: object = None,
        *,
        columns: Sequence[object] | None = None,
        rows: Sequence[Sequence[object]] | None = None,
        caption: str | None = None,
    ) -> None:
        self.dataframe = dataframe
        self.columns = columns
        self.rows = rows
        self.caption = caption

    def __repr__(self) -> str:
        return "<launchhelm.Table>"

    def _prepare(self, key: str) -> PreparedTable:
        caption = _check_caption(key, self.caption)
        if self.dataframe is not None:
            if self.columns is not None or self.rows is not None:
                raise InvalidMediaError(f"media {key!r}: give a Table a dataframe, or columns and rows", key=key)
            frame: Any = self.dataframe
            if not (hasattr(frame, "columns") and hasattr(frame, "itertuples")):
                raise InvalidTypeError(f"media {key!r}: Table() takes a pandas DataFrame, not {type(frame).__name__}")
            columns: list[object] = list(frame.columns)
            raw_rows: Sequence[Sequence[object]] = [list(row) for row in frame.itertuples(index=False, name=None)]
        else:
            columns = list(self.columns or [])
            raw_rows = self.rows if self.rows is not None else []
        names = []
        for name in columns:
            if isinstance(name, bool) or not isinstance(name, (str, int)):
                raise InvalidTypeError(f"media {key!r}: a column name must be a string, not {type(name).__name__}")
            names.append(str(name))
        if len(set(names)) != len(names):
            raise InvalidMediaError(f"media {key!r}: the table names a column twice: {names}", key=key)
        if len(raw_rows) > MAX_TABLE_ROWS or len(raw_rows) * max(1, len(names)) > MAX_TABLE_CELLS:
            raise InvalidMediaError(
                f"media {key!r}: a table of {len(raw_rows):,} rows x {len(names)} columns is over the limit "
                f"({MAX_TABLE_ROWS:,} rows, {MAX_TABLE_CELLS:,} cells): log a sample, or split it",
                key=key,
            )
        rows = []
        for r, raw in enumerate(raw_rows):
            cells = list(raw)
            if len(cells) != len(names):
                raise InvalidMediaError(
                    f"media {key!r}: row {r} has {len(cells)} cells for {len(names)} columns", key=key
                )
            rows.append([_cell(key, r, names[c], cell) for c, cell in enumerate(cells)])
        return PreparedTable(names, rows, caption)


def _cell(key: str, row: int, column: str, cell: object) -> Any:
    if cell is None or type(cell) in (str, bool, int, float):
        return cell
    if isinstance(cell, Image):
        return cell._prepare(f"{key}[{row}][{column!r}]")
    if isinstance(cell, numbers.Integral):
        return bool(cell) if type(cell).__name__ == "bool_" else int(cell)
    if isinstance(cell, numbers.Real):
        return float(cell)
    if isinstance(cell, str):
        return str(cell)
    module = type(cell).__module__ or ""
    if module.startswith("numpy") and getattr(cell, "ndim", None) == 0:
        return _cell(key, row, column, cell.item())  # type: ignore[attr-defined]
    raise InvalidTypeError(
        f"media {key!r}: row {row}, column {column!r} holds a {type(cell).__name__}; "
        "cells are None, bool, int, float, str or launchhelm.Image"
    )


class Histogram(Media):
    """A histogram to log: of ``values`` in ``bins`` bins, or from ``counts`` and ``edges``.

    Parameters
    ----------
    values:
        Numbers (a sequence, numpy array or torch tensor); NaN and infinities
        are refused.
    bins:
        Number of equal-width bins, 1 to 512 (default 64, as W&B's).
    counts, edges:
        A histogram already made: ``len(edges) == len(counts) + 1``, edges
        increasing (as ``numpy.histogram`` returns them); up to 4,096 bins.
    caption:
        Shown with the chart.

    Examples
    --------
    >>> run.log({"weights": lh.Histogram(layer.weight, bins=32)})  # doctest: +SKIP
    """

    kind = "histogram"

    def __init__(
        self,
        values: object = None,
        bins: int = 64,
        *,
        counts: object = None,
        edges: object = None,
        caption: str | None = None,
    ) -> None:
        self.values = values
        self.bins = bins
        self.counts = counts
        self.edges = edges
        self.caption = caption

    def __repr__(self) -> str:
        return "<launchhelm.Histogram>"

    def _prepare(self, key: str) -> PreparedHistogram:
        import numpy as np

        caption = _check_caption(key, self.caption)
        if self.values is not None:
            if self.counts is not None or self.edges is not None:
                raise InvalidMediaError(f"media {key!r}: give a Histogram values, or counts and edges", key=key)
            if type(self.bins) is not int or not 1 <= self.bins <= MAX_BINS:
                raise InvalidMediaError(f"media {key!r}: bins={self.bins!r}: give an int from 1 to {MAX_BINS}", key=key)
            values = _numbers(key, "values", self.values).ravel()
            if values.size and not np.isfinite(values).all():
                raise InvalidMediaError(f"media {key!r}: the histogram's values hold NaN or infinity", key=key)
            counts, edges = np.histogram(values, bins=self.bins)
            return PreparedHistogram([int(c) for c in counts], [float(e) for e in edges], caption)
        if self.counts is None or self.edges is None:
            raise InvalidMediaError(f"media {key!r}: give a Histogram values, or both counts and edges", key=key)
        counts = _numbers(key, "counts", self.counts).ravel()
        edges = _numbers(key, "edges", self.edges).ravel().astype(np.float64)
        if not 1 <= counts.size <= MAX_GIVEN_BINS or edges.size != counts.size + 1:
            raise InvalidMediaError(
                f"media {key!r}: {counts.size} counts and {edges.size} edges: give 1 to {MAX_GIVEN_BINS:,} counts "
                "and one edge more",
                key=key,
            )
        if not (np.isfinite(counts).all() and np.isfinite(edges).all()) or (counts < 0).any():
            raise InvalidMediaError(f"media {key!r}: counts must be finite and >= 0, edges finite", key=key)
        if (np.diff(edges) <= 0).any():
            raise InvalidMediaError(f"media {key!r}: the histogram's edges must increase", key=key)
        kept: list[float] | list[int] = (
            [int(c) for c in counts] if np.issubdtype(counts.dtype, np.integer) else [float(c) for c in counts]
        )
        return PreparedHistogram(kept, [float(e) for e in edges], caption)


def _numbers(key: str, what: str, data: object) -> np.ndarray:
    import numpy as np

    module = type(data).__module__ or ""
    if module.startswith("torch") and hasattr(data, "detach"):
        tensor: Any = data
        data = tensor.detach().cpu().double().numpy()
    try:
        array = np.asarray(data)
    except (TypeError, ValueError):
        array = np.asarray([], dtype=object)
    if array.dtype == bool or not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise InvalidTypeError(f"media {key!r}: the histogram's {what} must be real numbers, not {array.dtype}")
    return array


def prepare_media(key: str, value: object) -> list[Prepared] | None:
    """``value``'s media checked and copied (a list: one per item), or None when it is not media.

    A list or tuple is media when its first item is; then every item must be.
    """
    if isinstance(value, Media):
        return [value._prepare(key)]
    if type(value) in (list, tuple) and value and isinstance(value[0], Media):  # type: ignore[index]
        items: Sequence[object] = value  # type: ignore[assignment]
        if len(items) > MAX_LIST:
            raise InvalidMediaError(f"media {key!r}: {len(items):,} items in one call; at most {MAX_LIST:,}", key=key)
        kinds = {type(item).kind for item in items if isinstance(item, Media)}
        if len(kinds) != 1 or not all(isinstance(item, Media) for item in items):
            raise InvalidTypeError(
                f"media {key!r}: a list logged under one key holds media of one kind (all images, say), "
                f"not {sorted({type(item).__name__ for item in items})}"
            )
        return [item._prepare(key) for item in items if isinstance(item, Media)]
    return None
