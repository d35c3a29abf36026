"""Per-layer rollups with each statistic compressed apart (packed array version 2).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03

A heatmap or a layer's line reads one statistic of each `layer_rollups` row, but a version 1
blob is one zlib stream over all ten: a read inflated ten times what it used (a layer's line
over a 1M-step x 500-layer run: ~1,000 rows, 40 KB inflated each). Version 2 keeps the same
byte planes cut by column, each column with its mask in a stream of its own (issue #11).

Both ways rewrite only the bytes' order and framing, never a value: a column's slice of every
byte plane, and its mask, move as they are, so every value (NaN, ±inf, -0.0, None) comes back
bit for bit. Nothing here imports application code: the two layouts are frozen below.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HEAD = struct.Struct("<BIB")  # version, n, k; then k kinds, k mask flags
_BATCH = 500  # rows per round trip


def _compress(data: bytes) -> bytes:
    compressor = zlib.compressobj(1, zlib.DEFLATED, 15, 8, zlib.Z_RLE)
    return compressor.compress(data) + compressor.flush()


def _apart(blob: bytes) -> bytes:
    """Version 1 -> 2: column c's slice of each of the 8 byte planes, then its mask."""
    _, n, k = _HEAD.unpack_from(blob)
    head = blob[:_HEAD.size + 2 * k]
    flags = head[_HEAD.size + k:]
    body = zlib.decompress(blob[len(head):])
    plane = k * n
    mask_at = 8 * plane
    segments = []
    for c in range(k):
        parts = [body[i * plane + c * n:i * plane + (c + 1) * n] for i in range(8)]
        if flags[c]:
            parts.append(body[mask_at:mask_at + n])
            mask_at += n
        segments.append(_compress(b"".join(parts)))
    return (bytes([2]) + head[1:] + struct.pack(f"<{k}I", *map(len, segments))
            + b"".join(segments))


def _together(blob: bytes) -> bytes:
    """Version 2 -> 1: the columns' slices joined plane by plane, then the masks in order."""
    _, n, k = _HEAD.unpack_from(blob)
    head = blob[:_HEAD.size + 2 * k]
    flags = head[_HEAD.size + k:]
    sizes = struct.unpack_from(f"<{k}I", blob, len(head))
    at = len(head) + 4 * k
    columns = []
    for size in sizes:
        columns.append(zlib.decompress(blob[at:at + size]))
        at += size
    planes = b"".join(column[i * n:(i + 1) * n] for i in range(8) for column in columns)
    masks = b"".join(column[8 * n:8 * n + n] for c, column in enumerate(columns) if flags[c])
    return bytes([1]) + head[1:] + _compress(planes + masks)


def _rewrite(convert_from: int, convert: Callable[[bytes], bytes]) -> None:
    """Every `layer_rollups` blob of version `convert_from` rewritten by `convert`, in key
    order, _BATCH rows a round trip."""
    bind = op.get_bind()
    table = sa.table("layer_rollups", sa.column("run_key", sa.BigInteger),
                     sa.column("level", sa.Integer), sa.column("bucket", sa.BigInteger),
                     sa.column("data", sa.LargeBinary))
    key = (table.c.run_key, table.c.level, table.c.bucket)
    after: tuple[int, int, int] | None = None
    while True:
        query = sa.select(*key, table.c.data).order_by(*key).limit(_BATCH)
        if after is not None:
            query = query.where(sa.tuple_(*key) > sa.tuple_(*map(sa.literal, after)))
        rows = bind.execute(query).all()
        if not rows:
            return
        after = (int(rows[-1][0]), int(rows[-1][1]), int(rows[-1][2]))
        changed = [{"k": run_key, "l": level, "b": bucket, "d": convert(bytes(data))}
                   for run_key, level, bucket, data in rows if data[0] == convert_from]
        if changed:
            bind.execute(
                table.update().where(table.c.run_key == sa.bindparam("k"),
                                     table.c.level == sa.bindparam("l"),
                                     table.c.bucket == sa.bindparam("b"))
                .values(data=sa.bindparam("d")), changed)


def upgrade() -> None:
    _rewrite(1, _apart)


def downgrade() -> None:
    _rewrite(2, _together)
