"""PNG without a dependency: the encoder media use, and a decoder for the PNGs it writes.

LaunchHelm writes its own PNGs (zlib and numpy only) so that the bytes of an
image depend on its pixels alone, not on which Pillow a machine has: the same
picture logged twice is the same content-addressed object. Rows use filter 0
(none): the encoder is one ``zlib.compress`` of the pixels. Foreign PNGs
(files, TensorBoard's event files) are decoded by :func:`decode_png`, which
takes every PNG of 8 bits per sample without interlace, the kind Pillow and
TensorBoard write; anything else goes through Pillow.
"""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["decode_png", "encode_png", "png_size"]

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: PNG colour type by channel count: grey, grey+alpha, RGB, RGBA.
_COLOUR = {1: 0, 2: 4, 3: 2, 4: 6}
_CHANNELS = {value: key for key, value in _COLOUR.items()}
#: zlib level: 6 is within a few percent of 9's size at a fraction of its time.
_LEVEL = 6


def _chunk(kind: bytes, data: bytes) -> list[bytes]:
    # the CRC runs on on kind then data without joining them: no copy of a large IDAT while holding the GIL
    return [
        struct.pack(">I", len(data)),
        kind,
        data,
        struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)) & 0xFFFFFFFF),
    ]


def encode_png(pixels: np.ndarray) -> bytes:
    """PNG bytes of a uint8 ``HxWxC`` array (C in 1..4), each row with the filter that suits it.

    PNG's five filters predict a byte from the raw left, upper and upper-left bytes, so all of them
    filter the whole image in a few numpy operations; each row takes the one whose output is smallest
    in absolute value (the heuristic libpng and Pillow use). The choice depends on the pixels alone, so
    the same pixels still give the same bytes on every machine.
    """
    import numpy as np

    height, width, channels = pixels.shape
    raw = pixels.reshape(height, width * channels).astype(np.int16)
    left = np.zeros_like(raw)
    left[:, channels:] = raw[:, :-channels]
    up = np.zeros_like(raw)
    up[1:] = raw[:-1]
    upper_left = np.zeros_like(raw)
    upper_left[1:, channels:] = raw[:-1, :-channels]
    estimate = left + up - upper_left
    pa, pb, pc = np.abs(estimate - left), np.abs(estimate - up), np.abs(estimate - upper_left)
    paeth = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, upper_left))
    # None, Sub, Up, Average, Paeth: each as the bytes it stores (modulo 256, as the filters are defined)
    candidates = np.stack([raw, raw - left, raw - up, raw - (left + up) // 2, raw - paeth]).astype(np.uint8)
    cost = np.abs(candidates.astype(np.int8).astype(np.int16)).sum(axis=2)  # bytes read as signed, per row
    chosen = cost.argmin(axis=0)
    rows = np.empty((height, 1 + width * channels), dtype=np.uint8)
    rows[:, 0] = chosen
    rows[:, 1:] = candidates[chosen, np.arange(height)]
    header = struct.pack(">IIBBBBB", width, height, 8, _COLOUR[channels], 0, 0, 0)
    # Z_FILTERED: deflate tuned for filtered rows (small values), as PNG encoders use; zlib lets the GIL go
    deflate = zlib.compressobj(_LEVEL, zlib.DEFLATED, 15, 9, zlib.Z_FILTERED)
    compressed = deflate.compress(rows.data) + deflate.flush()
    return b"".join([_SIGNATURE, *_chunk(b"IHDR", header), *_chunk(b"IDAT", compressed), *_chunk(b"IEND", b"")])


def png_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` from a PNG's header, None if ``data`` is not a PNG."""
    if not data.startswith(_SIGNATURE) or len(data) < 24 or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return height, width


def decode_png(data: bytes) -> np.ndarray | None:
    """A uint8 ``HxWxC`` array of an 8-bit, non-interlaced, non-palette PNG; None for any other kind."""
    import numpy as np

    if not data.startswith(_SIGNATURE):
        return None
    pos, idat, header = len(_SIGNATURE), [], None
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if header is None:
        return None
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or interlace or colour not in _CHANNELS:
        return None
    channels = _CHANNELS[colour]
    stride = width * channels
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8)
    if raw.size != height * (stride + 1):
        return None
    rows = raw.reshape(height, stride + 1)
    filters = rows[:, 0]
    out = rows[:, 1:].copy()
    if filters.any():
        _unfilter(out, filters, channels)
    pixels: np.ndarray = out.reshape(height, width, channels)
    return pixels


def _unfilter(out: np.ndarray, filters: np.ndarray, bpp: int) -> None:
    """Undo PNG's per-row filters in place (Sub, Up, Average, Paeth)."""
    import numpy as np

    previous = np.zeros(out.shape[1], dtype=np.int32)
    for y in range(out.shape[0]):
        kind = int(filters[y])
        row = out[y].astype(np.int32)
        if kind == 1:  # Sub: a running sum per channel
            row = row.reshape(-1, bpp).cumsum(axis=0).reshape(-1) & 0xFF
        elif kind == 2:  # Up
            row = (row + previous) & 0xFF
        elif kind in (3, 4):  # Average and Paeth depend on the pixel just decoded: one pixel at a time
            for x in range(row.size):
                left = int(row[x - bpp]) if x >= bpp else 0
                up = int(previous[x])
                if kind == 3:
                    row[x] = (row[x] + ((left + up) >> 1)) & 0xFF
                else:
                    corner = int(previous[x - bpp]) if x >= bpp else 0
                    p = left + up - corner
                    pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                    pred = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                    row[x] = (row[x] + pred) & 0xFF
        out[y] = row
        previous = row
