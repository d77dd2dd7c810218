"""TensorBoard event files: each folder holding ``events.out.tfevents.*`` is a run.

The files are read here, without TensorBoard: an event file is a TFRecord
stream (length, masked CRC32C of the length, the record, its masked CRC32C)
of ``Event`` protocol buffers, formats frozen for years. Only the fields an
import needs are decoded (wall time, step, and in each summary value its
tag, ``simple_value``, scalar tensor and plugin metadata); everything else is
skipped by its wire type. Every record's checksums are verified, so a
truncated or corrupt file stops the import of its run with an error naming
the file and the byte, before anything of the run is visible.

Scalars are stored as the file holds them: a ``simple_value`` or
``DT_FLOAT`` tensor is the float32 as written (widened exactly to float64),
a ``DT_DOUBLE`` tensor its float64. The hparams plugin's session start info
(``SummaryWriter.add_hparams``, Lightning's ``log_hyperparams``) becomes the
run's config.
"""

from __future__ import annotations

import os
import posixpath
import re
import struct
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, BinaryIO

from launchhelm._types import JSONValue

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

from launchhelm._exceptions import PathNotFoundError, SourceReadError
from launchhelm.importers._common import ImportResult, Recorder, SourceRun, import_runs
from launchhelm.storage import Store

__all__ = ["import_tensorboard", "read_event_file"]

_EVENT_FILE = re.compile(r"events\.out\.tfevents\.")
_HPARAMS = "hparams"
_SCALARS = "scalars"
# TensorProto dtypes a scalar can come in, and how its tensor_content holds one
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_BOOL, _DT_HALF = 1, 2, 3, 9, 10, 19
_CONTENT = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q", _DT_BOOL: "<?", _DT_HALF: "<e"}
_FLOAT = struct.Struct("<f")
_DOUBLE = struct.Struct("<d")
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_BLOCK = 8 << 20


# -- protocol buffer wire format: just what an Event needs ------------------------------
class _Malformed(Exception):
    """A record that passes its checksum but is no protocol buffer (turned into a SourceReadError)."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Malformed("varint too long")


def _skip(buf: bytes, pos: int, wire: int) -> int:
    if wire == 0:
        return _varint(buf, pos)[1]
    if wire == 1:
        return pos + 8
    if wire == 2:
        size, pos = _varint(buf, pos)
        return pos + size
    if wire == 5:
        return pos + 4
    raise _Malformed(f"wire type {wire}")


def _fields(buf: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int, int, int]]:
    """``(field, wire type, value or start, end)`` of each field; a length-delimited one's span."""
    pos = start
    end = len(buf) if end is None else end
    while pos < end:
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 2:
            size, pos = _varint(buf, pos)
            yield number, wire, pos, pos + size
            pos += size
        elif wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value, pos
        elif wire == 1:
            yield number, wire, pos, pos + 8
            pos += 8
        elif wire == 5:
            yield number, wire, pos, pos + 4
            pos += 4
        else:
            raise _Malformed(f"wire type {wire} at byte {pos}")
    if pos != end:
        raise _Malformed("a field runs past its message")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _tensor_scalar(buf: bytes, start: int, end: int) -> float | None:
    """The one value of a scalar ``TensorProto``, or None if it is not a single number."""
    dtype = 0
    content: bytes | None = None
    values: list[float] = []
    for number, wire, a, b in _fields(buf, start, end):
        if number == 1 and wire == 0:
            dtype = a
        elif number == 2 and wire == 2:  # shape: a scalar has no dimension above 1
            for dim_field, dim_wire, da, db in _fields(buf, a, b):
                if dim_field == 2 and dim_wire == 2:
                    for size_field, size_wire, size, _ in _fields(buf, da, db):
                        if size_field == 1 and size_wire == 0 and size != 1:
                            return None
        elif number == 4 and wire == 2:
            content = buf[a:b]
        elif number == 5:  # float_val, packed or not
            if wire == 2:
                values.extend(v for (v,) in struct.iter_unpack("<f", buf[a:b]))
            elif wire == 5:
                values.append(_FLOAT.unpack_from(buf, a)[0])
        elif number == 6:  # double_val
            if wire == 2:
                values.extend(v for (v,) in struct.iter_unpack("<d", buf[a:b]))
            elif wire == 1:
                values.append(_DOUBLE.unpack_from(buf, a)[0])
        elif number in (7, 10, 11, 13):  # int_val, int64_val, bool_val, half_val (varints)
            if wire == 2:
                pos = a
                while pos < b:
                    v, pos = _varint(buf, pos)
                    values.append(_half(v) if number == 13 else float(_signed(v)))
            elif wire == 0:
                values.append(_half(a) if number == 13 else float(_signed(a)))
    if content:
        fmt = _CONTENT.get(dtype)
        if fmt is None or len(content) != struct.calcsize(fmt):
            return None
        return float(struct.unpack(fmt, content)[0])
    if len(values) != 1:
        return None
    return values[0]


def _half(bits: int) -> float:
    return float(struct.unpack("<e", struct.pack("<H", bits & 0xFFFF))[0])


def _plugin(buf: bytes, start: int, end: int) -> tuple[str, bytes]:
    """``(plugin name, content)`` of a ``SummaryMetadata``."""
    for number, wire, a, b in _fields(buf, start, end):
        if number == 1 and wire == 2:
            name, content = "", b""
            for f, w, pa, pb in _fields(buf, a, b):
                if f == 1 and w == 2:
                    name = buf[pa:pb].decode("utf-8", "replace")
                elif f == 2 and w == 2:
                    content = buf[pa:pb]
            return name, content
    return "", b""


# -- google.protobuf.Value, as the hparams plugin stores values ----------------------------
def _struct_value(buf: bytes, start: int, end: int) -> JSONValue:
    value: JSONValue = None
    for number, wire, a, b in _fields(buf, start, end):
        if number == 2 and wire == 1:
            value = _DOUBLE.unpack_from(buf, a)[0]
        elif number == 3 and wire == 2:
            value = buf[a:b].decode("utf-8", "replace")
        elif number == 4 and wire == 0:
            value = bool(a)
        elif number == 5 and wire == 2:  # Struct: map<string, Value> fields = 1
            fields: dict[str, JSONValue] = {}
            for f, w, ea, eb in _fields(buf, a, b):
                if f == 1 and w == 2:
                    key, item = _entry(buf, ea, eb)
                    fields[key] = item
            value = fields
        elif number == 6 and wire == 2:  # ListValue: repeated Value values = 1
            value = [_struct_value(buf, va, vb) for f, w, va, vb in _fields(buf, a, b) if f == 1 and w == 2]
        elif number == 1:
            value = None
    return value


def _entry(buf: bytes, start: int, end: int) -> tuple[str, JSONValue]:
    key: str = ""
    value: JSONValue = None
    for number, wire, a, b in _fields(buf, start, end):
        if number == 1 and wire == 2:
            key = buf[a:b].decode("utf-8", "replace")
        elif number == 2 and wire == 2:
            value = _struct_value(buf, a, b)
    return key, value


def _session_start_hparams(content: bytes) -> dict[str, JSONValue] | None:
    """The hparams of an ``HParamsPluginData`` holding a ``SessionStartInfo`` (field 3), else None."""
    for number, wire, a, b in _fields(content):
        if number == 3 and wire == 2:
            hparams: dict[str, JSONValue] = {}
            for f, w, ea, eb in _fields(content, a, b):
                if f == 1 and w == 2:
                    key, value = _entry(content, ea, eb)
                    hparams[key] = value
            return hparams
    return None


# -- the TFRecord stream ---------------------------------------------------------------
#: The event a scalar logged the usual way is (``SummaryWriter.add_scalar``, ``tf.summary.scalar`` in
#: TF1): wall time, step (absent at 0), and a summary of one value with a tag and a ``simple_value``.
#: Matched whole, its lengths checked, it is decoded without walking its fields one by one.
_SIMPLE = re.compile(
    rb"\x09(.{8})(?:\x10([\x80-\xff]{0,9}[\x00-\x7f]))?\x2a([\x00-\x7f])\x0a([\x00-\x7f])\x0a([\x00-\x7f])(.*)\x15(.{4})",
    re.DOTALL,
)


def _truncated(path: str, at: int, left: int) -> SourceReadError:
    return SourceReadError(
        f"{path} is truncated: it ends {left:,} bytes into a record at byte {at:,} (was its writer still "
        "running, or killed mid-write?); import it once the writer has closed it, or move it out of the folder",
        source=path,
    )


def _corrupt(path: str, at: int, what: str) -> SourceReadError:
    return SourceReadError(
        f"{path} is corrupt at byte {at:,}: {what}; move the file out of the log folder to import the rest",
        source=path,
    )


def read_event_file(f: BinaryIO, path: str, recorder: Recorder, plugins: dict[str, str]) -> None:
    """Feed one event file's scalars (and hparams as config) to ``recorder``, every checksum verified.

    ``plugins`` maps tags to the plugin their first value named (later
    values of a tag often carry no metadata); shared by a run's files.
    """
    from awscrt.checksums import crc32c

    header = _HEADER.unpack_from
    crc_at = _CRC.unpack_from
    double = _DOUBLE.unpack_from
    single = _FLOAT.unpack_from
    simple = _SIMPLE.fullmatch
    point = recorder.point
    buf = b""
    offset = 0  # of buf[0] in the file
    while True:
        more = f.read(_BLOCK)
        buf = buf + more if buf else more
        size = len(buf)
        pos = 0
        while pos + 12 <= size:
            length, length_crc = header(buf, pos)
            if (((c := crc32c(buf[pos : pos + 8])) >> 15 | c << 17) + 0xA282EAD8) & 0xFFFFFFFF != length_crc:
                raise _corrupt(path, offset + pos, "a record's length fails its checksum (not an event file?)")
            start = pos + 12
            stop = start + length
            if stop + 4 > size:
                break
            data = buf[start:stop]
            if (((c := crc32c(data)) >> 15 | c << 17) + 0xA282EAD8) & 0xFFFFFFFF != crc_at(buf, stop)[0]:
                raise _corrupt(path, offset + pos, "a record fails its checksum")
            at = offset + pos
            pos = stop + 4
            m = simple(data)
            if m is not None:
                summary_len, value_len, tag_len, tag = m.group(3)[0], m.group(4)[0], m.group(5)[0], m.group(6)
                if len(tag) == tag_len and value_len == tag_len + 7 and summary_len == value_len + 2:
                    name = tag.decode("utf-8", "replace")
                    if plugins.get(name) is None:
                        raw = m.group(2)
                        step = _varint(raw, 0)[0] if raw else 0
                        point(name, _signed(step), double(data, 1)[0], single(m.group(7))[0])
                        continue
            _read_event(data, path, at, recorder, plugins)
        if not more:
            if pos < size:
                raise _truncated(path, offset + pos, size - pos)
            return
        buf = buf[pos:]
        offset += pos


def _read_event(data: bytes, path: str, at: int, recorder: Recorder, plugins: dict[str, str]) -> None:
    """Every other event: its fields walked one by one."""
    point = recorder.point
    try:
        wall_time = 0.0
        step = 0
        summary: tuple[int, int] | None = None
        for number, wire, a, b in _fields(data):  # Event: wall_time = 1, step = 2, summary = 5
            if number == 1 and wire == 1:
                wall_time = _DOUBLE.unpack_from(data, a)[0]
            elif number == 2 and wire == 0:
                step = _signed(a)
            elif number == 5 and wire == 2:
                summary = (a, b)
        if summary is None:
            return
        for number, wire, va, vb in _fields(data, summary[0], summary[1]):
            if number != 1 or wire != 2:
                continue
            name = ""
            simple: float | None = None
            tensor: tuple[int, int] | None = None
            metadata: tuple[int, int] | None = None
            image: tuple[int, int] | None = None
            histogram: tuple[int, int] | None = None
            other = ""
            for f_number, f_wire, a, b in _fields(data, va, vb):
                if f_number == 1 and f_wire == 2:
                    name = data[a:b].decode("utf-8", "replace")
                elif f_number == 2 and f_wire == 5:
                    simple = _FLOAT.unpack_from(data, a)[0]
                elif f_number == 8 and f_wire == 2:
                    tensor = (a, b)
                elif f_number == 9 and f_wire == 2:
                    metadata = (a, b)
                elif f_number == 4 and f_wire == 2:
                    image = (a, b)
                elif f_number == 5 and f_wire == 2:
                    histogram = (a, b)
                elif f_number in (3, 6):
                    other = {3: "histogram", 4: "image", 5: "histogram", 6: "audio"}[f_number]
            plugin = plugins.get(name)
            content = b""
            if metadata is not None:
                found, content = _plugin(data, *metadata)
                if found:
                    plugin = plugins.setdefault(name, found)
            if simple is not None:
                point(name, step, wall_time, simple)
            elif image is not None:
                _image(recorder, name, step, wall_time, data, *image)
            elif histogram is not None:
                _histogram(recorder, name, step, wall_time, data, *histogram)
            elif plugin == _HPARAMS and content:
                hparams = _session_start_hparams(content)
                if hparams is not None:
                    recorder.config.update(hparams)
            elif tensor is not None and plugin in (_SCALARS, None):
                value = _tensor_scalar(data, *tensor)
                if value is not None:
                    point(name, step, wall_time, value)
                else:
                    recorder.skip(f"tensor summaries that are not scalars ({name!r}...)")
            elif other or plugin:
                recorder.skip(f"{plugin or other} summaries ({name!r}...)")
    except (_Malformed, ValueError, IndexError, struct.error) as exc:
        raise SourceReadError(
            f"{path}: the record at byte {at:,} passes its checksum but is not a TensorBoard event ({exc}); "
            "move the file out of the log folder to import the rest",
            source=path,
        ) from None


def _image(recorder: Recorder, name: str, step: int, wall_time: float, buf: bytes, start: int, end: int) -> None:
    """``Summary.Image``: its encoded picture (field 4), decoded and stored as our PNG of the same pixels."""
    from launchhelm.media import Image
    from launchhelm.media._read import decode_image

    encoded = b""
    for number, wire, a, b in _fields(buf, start, end):
        if number == 4 and wire == 2:
            encoded = buf[a:b]
    try:
        item = Image(decode_image(encoded))._prepare(name)
    except (OSError, ValueError, TypeError, ImportError):
        recorder.skip(f"images that could not be decoded ({name!r}...)")
        return
    recorder.media(name, step, wall_time, [item])


def _doubles(buf: bytes, number: int, wire: int, a: int, b: int) -> list[float]:
    if wire == 2:  # packed
        return list(struct.unpack_from(f"<{(b - a) // 8}d", buf, a))
    return [_DOUBLE.unpack_from(buf, a)[0]] if wire == 1 else []


def _histogram(recorder: Recorder, name: str, step: int, wall_time: float, buf: bytes, start: int, end: int) -> None:
    """``HistogramProto``: ``bucket_limit`` (6) are right edges, the first bucket an empty one whose
    right edge is the first bin's left: so the bins are ``bucket[1:]`` between the limits."""
    from launchhelm.media import Histogram

    limits: list[float] = []
    buckets: list[float] = []
    for number, wire, a, b in _fields(buf, start, end):
        if number == 6:
            limits += _doubles(buf, number, wire, a, b)
        elif number == 7:
            buckets += _doubles(buf, number, wire, a, b)
    counts: list[float] | list[int] = buckets[1:]
    if all(c == int(c) for c in counts):
        counts = [int(c) for c in counts]
    try:
        item = Histogram(counts=counts, edges=limits)._prepare(name)
    except (ValueError, TypeError):
        recorder.skip(f"histograms of a form LaunchHelm does not keep ({name!r}...)")
        return
    recorder.media(name, step, wall_time, [item])


def _event_files(fs: AbstractFileSystem, root: str) -> dict[str, list[str]]:
    """``{folder: its event files, oldest first}`` under ``root``."""
    runs: dict[str, list[str]] = {}
    for folder, _dirs, files in fs.walk(root):
        events = [name for name in files if _EVENT_FILE.match(name)]
        if events:
            runs[folder] = [posixpath.join(folder, name) for name in sorted(events, key=_file_order)]
    return dict(sorted(runs.items()))


def _file_order(name: str) -> tuple[float, str]:
    # events.out.tfevents.<wall time>.<host>...: TensorBoard reads a folder's files in this order
    try:
        return float(name.split(".")[3]), name
    except (IndexError, ValueError):
        return float("inf"), name


def _sources(logdir: str | os.PathLike[str], storage_options: Mapping[str, object] | None) -> list[SourceRun]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(os.fspath(logdir), **(storage_options or {}))
    root = root.rstrip("/") or "/"
    if not fs.isdir(root):
        raise PathNotFoundError(
            f"no TensorBoard log folder at {os.fspath(logdir)!r}: give the folder SummaryWriter wrote into "
            "(its log_dir, or a folder above several)",
            path=os.fspath(logdir),
        )
    found = _event_files(fs, root)
    if not found:
        raise PathNotFoundError(
            f"no TensorBoard event files (events.out.tfevents.*) under {os.fspath(logdir)!r}",
            path=os.fspath(logdir),
        )
    base = posixpath.basename(root) or root
    sources = []
    for folder, files in found.items():
        rel = posixpath.relpath(folder, root)
        name = base if rel == "." else rel

        def read(recorder: Recorder, files: list[str] = files) -> None:
            plugins: dict[str, str] = {}
            for path in files:
                with fs.open(path, "rb") as f:
                    read_event_file(f, path, recorder, plugins)

        sources.append(
            SourceRun(
                kind="tensorboard",
                # the folder and its first file's name (wall time, host, pid): stable when the logdir moves
                key=f"{rel}\0{posixpath.basename(files[0])}",
                label=name,
                read=read,
                name=name,
                imported={"uri": os.fspath(logdir), "folder": rel, "files": [posixpath.basename(p) for p in files]},
            )
        )
    return sources


def import_tensorboard(
    logdir: str | os.PathLike[str],
    project: str,
    *,
    store: str | os.PathLike[str] | Store | None = None,
    storage_options: Mapping[str, object] | None = None,
    source_options: Mapping[str, object] | None = None,
    progress: bool = True,
    report: Callable[[str], None] | None = None,
) -> ImportResult:
    """Import TensorBoard event files: each folder under ``logdir`` holding event files becomes a run.

    Parameters
    ----------
    logdir:
        A log folder (local, or any fsspec URL such as ``s3://bucket/logs``).
        Its own event files and those of every folder below it are read.
    project:
        The LaunchHelm project the runs go into.
    store, storage_options:
        The LaunchHelm store, as for :func:`launchhelm.init`.
    source_options:
        fsspec options for reading ``logdir`` (credentials...).
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
        ``logdir`` is not a folder, or holds no event files.
    ImportFailedError
        Some runs could not be imported (a truncated or corrupt event file:
        :class:`SourceReadError` in ``failures``); the others were.

    Examples
    --------
    >>> from launchhelm.importers import import_tensorboard
    >>> import_tensorboard("runs/", "mnist")      # doctest: +SKIP
    <ImportResult mnist: 3 imported, 0 already imported>
    """
    return import_runs(
        "tensorboard",
        _sources(logdir, source_options),
        project,
        store=store,
        storage_options=storage_options,
        progress=progress,
        report=report,
    )
