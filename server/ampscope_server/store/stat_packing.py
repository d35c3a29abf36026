"""Pure codec of packed per-layer arrays: several equally long columns in one compact blob.

No I/O. A step's layer statistics (`layer_stats.data`) and a bucket's per-layer rollup
(`layer_rollups.data`) are each one blob, so a step costs one row whatever its layer count and
the bytes per value stay near what the values carry (DESIGN.md §8: ≤ 8 bytes per value).

Exactness: every float column is stored as its IEEE-754 float64 bits and every int column as
int64, so each value comes back bit for bit as it was packed, NaN and ±inf included, on every
dialect (a blob is opaque bytes to the database: SQLite never sees a NaN to turn into NULL).
`None` ("not measured", e.g. amax of a layer without a finite element) is kept apart in a mask,
so it is never confused with any number.

Layout (version 1), all little-endian:

    u8 version | u32 length n | u8 column count k | k bytes: kind (b"d" float64, b"q" int64)
    | k bytes: has-mask flag | zlib( shuffle(k·n values of 8 bytes) ++ masks of flagged columns )

Version 2 (`pack(..., apart=True)`) compresses each column on its own, so a read of one column
inflates that column only (a heatmap or a layer's line reads one statistic of each per-layer
rollup, a tenth of the blob):

    u8 version | u32 n | u8 k | k bytes: kind | k bytes: has-mask flag | k x u32: segment size
    | k segments: zlib( shuffle(n values of 8 bytes) ++ the column's mask when flagged )

The head (everything before the first segment, `apart_head_size`) says where each segment
lies (its size at `apart_size_at`), so a database can cut one segment out of a stored blob and
send that alone (`unpack_segment` decodes it with the head).

`shuffle` regroups the 8-byte values byte plane by byte plane (all first bytes, then all second
bytes, …): sign/exponent bytes and the zero bytes of small ints and of exact zeros then sit next to
each other, which is what lets zlib shrink them; mantissa noise stays as it is. A mask is n bytes,
1 where the value is None (the value slot holds 0). Everything runs in C (array, bytes slicing,
zlib); only columns that hold a None take a per-value Python pass.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Iterable, Sequence
from typing import cast

VERSION = 1
APART = 2
"""The version whose columns are compressed apart."""
FLOAT = "d"
INT = "q"
_HEAD = struct.Struct("<BIB")
_WIDTH = 8
_LEVEL = 1
_STRATEGY = zlib.Z_RLE
"""zlib level 1 with run-length matching only: the planes that compress are runs (zero bytes)
and skewed bytes (exponents), which RLE + Huffman catch at about half the time of the default
match search, within 1 % of its size; mantissa bytes do not compress at any level."""

Column = Sequence[float | int | None]


class PackingError(ValueError):
    """A blob that is not a packed array of this version."""


def pack(columns: Sequence[Column], kinds: str, *, apart: bool = False) -> bytes:
    """Pack equally long columns; `kinds[i]` is FLOAT or INT for column i. `apart`: each column
    compressed on its own (version 2), for blobs read a column at a time."""
    if len(columns) != len(kinds):
        raise ValueError(f"{len(columns)} columns but {len(kinds)} kinds")
    n = len(columns[0]) if columns else 0
    typed: list[tuple[bytes, bytes]] = []  # per column: its values' bytes, its mask or b""
    for column, kind in zip(columns, kinds, strict=True):
        if len(column) != n:
            raise ValueError(f"columns differ in length: {len(column)} and {n}")
        typed.append(_typed(column, kind))
    flags = bytes(1 if mask else 0 for _, mask in typed)
    head = _HEAD.pack(APART if apart else VERSION, n, len(kinds)) + kinds.encode("ascii") + flags
    if apart:
        segments = [_compress(_shuffle(values) + mask) for values, mask in typed]
        return (head + struct.pack(f"<{len(segments)}I", *map(len, segments))
                + b"".join(segments))
    return head + _compress(_shuffle(b"".join(values for values, _ in typed))
                            + b"".join(mask for _, mask in typed))


def _typed(column: Column, kind: str) -> tuple[bytes, bytes]:
    """(the column's values as 8-byte machine values, its None mask or b"" without None)."""
    try:  # most columns hold no None: one conversion in C, no scan for None first
        return array(kind, cast(Sequence[float], column)).tobytes(), b""  # None: TypeError
    except TypeError:
        if None not in column:
            raise
        filled = [0 if value is None else value for value in column]
        return array(kind, filled).tobytes(), bytes(value is None for value in column)


def _shuffle(values: bytes) -> bytes:
    return b"".join(values[i::_WIDTH] for i in range(_WIDTH))


def _compress(data: bytes) -> bytes:
    compressor = zlib.compressobj(_LEVEL, zlib.DEFLATED, 15, 8, _STRATEGY)
    return compressor.compress(data) + compressor.flush()


def unpack(blob: bytes) -> list[list[float | int | None]]:
    """The columns of a packed blob, each value as packed (floats as float, ints as int)."""
    columns = unpack_columns(blob)
    return [columns[index] for index in range(len(columns))]


def unpack_columns(blob: bytes, indices: Iterable[int] | None = None,
                   positions: Sequence[int] | None = None
                   ) -> dict[int, list[float | int | None]]:
    """{index: column} of the columns at `indices` (all when None): each is put back together
    from its own slice of every byte plane, so a read that needs one column of many pays the
    decompression but not the others' conversion to Python values. `positions`: only the
    values at those positions of each column, in that order (None past the column's end)."""
    try:
        version, n, k = _HEAD.unpack_from(blob)
    except struct.error:
        raise PackingError("a packed array is at least 6 bytes long") from None
    if version == APART:
        return _unpack_apart(blob, n, k, indices, positions)
    if positions is not None:
        return {index: [column[p] if p < n else None for p in positions]
                for index, column in unpack_columns(blob, indices).items()}
    if version != VERSION:
        raise PackingError(f"packed array version {version}, expected {VERSION} or {APART}")
    start = _HEAD.size
    kinds = bytes(blob[start:start + k]).decode("ascii")
    flags = blob[start + k:start + 2 * k]
    body = zlib.decompress(blob[start + 2 * k:])
    plane = k * n
    masks: dict[int, int] = {}  # column index -> offset of its mask in the body
    at = plane * _WIDTH
    for index in range(k):
        if flags[index]:
            masks[index] = at
            at += n
    whole = bytearray()
    if indices is None:  # every column (ingest's read-modify-write): one pass per byte plane
        whole = bytearray(plane * _WIDTH)
        for i in range(_WIDTH):
            whole[i::_WIDTH] = body[i * plane:(i + 1) * plane]
    columns: dict[int, list[float | int | None]] = {}
    for index in range(k) if indices is None else indices:
        if not 0 <= index < k:
            raise IndexError(f"column {index} of a packed array of {k}")
        if indices is None:
            values = whole[index * n * _WIDTH:(index + 1) * n * _WIDTH]
        else:
            values = bytearray(n * _WIDTH)
            for i in range(_WIDTH):
                values[i::_WIDTH] = body[i * plane + index * n:i * plane + (index + 1) * n]
        typed = array(kinds[index])
        typed.frombytes(values)
        column: list[float | int | None] = []
        column.extend(typed.tolist())
        if index in masks:
            mask = body[masks[index]:masks[index] + n]
            column = [None if missing else value for value, missing in zip(column, mask,
                                                                           strict=True)]
        columns[index] = column
    return columns


def _unpack_apart(blob: bytes, n: int, k: int, indices: Iterable[int] | None,
                  positions: Sequence[int] | None) -> dict[int, list[float | int | None]]:
    """`unpack_columns` of a version 2 blob: only the asked columns' segments inflated."""
    start = _HEAD.size
    kinds = bytes(blob[start:start + k]).decode("ascii")
    flags = blob[start + k:start + 2 * k]
    sizes = struct.unpack_from(f"<{k}I", blob, start + 2 * k)
    offsets = [apart_head_size(k)]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    columns: dict[int, list[float | int | None]] = {}
    for index in range(k) if indices is None else indices:
        if not 0 <= index < k:
            raise IndexError(f"column {index} of a packed array of {k}")
        columns[index] = _segment_column(kinds[index], flags[index], n,
                                         blob[offsets[index]:offsets[index + 1]], positions)
    return columns


def apart_head_size(k: int) -> int:
    """Bytes before the first segment of a version 2 blob of k columns: the header, the kinds,
    the mask flags and the k segment sizes (each a u32 at `apart_size_at(k, index)`)."""
    return _HEAD.size + 6 * k


def apart_size_at(k: int, index: int) -> int:
    """Byte offset, in a version 2 blob of k columns, of column `index`'s segment size (u32 LE):
    what a database reads to cut one segment out of a stored blob (`rollups_repository`)."""
    return _HEAD.size + 2 * k + 4 * index


def unpack_segment(head: bytes, index: int, segment: bytes,
                   positions: Sequence[int] | None = None) -> list[float | int | None]:
    """Column `index` of a version 2 blob given only its head (`apart_head_size` bytes) and that
    column's segment: a database that cuts the segment out sends a tenth of the blob.
    `positions` as in `unpack_columns`."""
    try:
        version, n, k = _HEAD.unpack_from(head)
    except struct.error:
        raise PackingError("a packed array is at least 6 bytes long") from None
    if version != APART:
        raise PackingError(f"packed array version {version}: only version {APART} has segments")
    if not 0 <= index < k:
        raise IndexError(f"column {index} of a packed array of {k}")
    if len(head) < apart_head_size(k):
        raise PackingError(f"a head of {len(head)} bytes, {apart_head_size(k)} expected")
    (size,) = struct.unpack_from("<I", head, apart_size_at(k, index))
    if len(segment) != size:
        raise PackingError(f"column {index}'s segment is {len(segment)} bytes, the head says "
                           f"{size}")
    start = _HEAD.size
    return _segment_column(chr(head[start + index]), head[start + k + index], n, segment,
                           positions)


def _segment_column(kind: str, flagged: int, n: int, segment: bytes,
                    positions: Sequence[int] | None = None) -> list[float | int | None]:
    """One column from its compressed segment (shuffled values, then its mask when flagged);
    with `positions`, only those values are put back together from the byte planes (a layer's
    line needs one value of each 500-layer rollup)."""
    body = zlib.decompress(segment)
    at = range(n) if positions is None else [p for p in positions if p < n]
    if positions is None:
        values = bytearray(n * _WIDTH)
        for i in range(_WIDTH):
            values[i::_WIDTH] = body[i * n:(i + 1) * n]
    else:  # a value's 8 bytes are one in each plane, n apart: one strided slice per value
        values = bytearray(b"".join(body[p::n][:_WIDTH] for p in at))
    typed = array(kind)
    typed.frombytes(values)
    column: list[float | int | None] = []
    column.extend(typed.tolist())
    if flagged:
        mask = body[n * _WIDTH:n * _WIDTH + n]
        column = [None if mask[p] else value for value, p in zip(column, at, strict=True)]
    if positions is not None and len(at) < len(positions):  # past the end: None, in order
        found = iter(column)
        column = [next(found) if p < n else None for p in positions]
    return column


def length(blob: bytes) -> int:
    """The column length n of a packed blob, without unpacking it."""
    return int(_HEAD.unpack_from(blob)[1])
