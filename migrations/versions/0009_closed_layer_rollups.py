"""Per-layer rollups of closed buckets only, a sparse 64-step bucket and the 4-step series
buckets folded when read.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

Before, ingest rewrote the per-layer rollup row of every open bucket (the one holding the run's
last step, at each of the levels 64 … 65536 steps) with every batch: on Postgres each rewrite
of a 16 KB row left a dead version (issue #11). And at the hook's default cadence (layer
statistics every 10th step) a 64-step row summarises 6 or 7 steps: it cost about as much as
them. After (no table changes, only which rows exist):

- a `layer_rollups` row exists only for a closed bucket, one with a stored step past its end;
  a read folds the open one from its children (at most 4 rows per level, and the raw steps of
  one 64-step bucket);
- a 64-step bucket keeps its row only with more than 16 steps of layer statistics; a read folds
  a sparser one from its raw steps;
- `rollups` (series) keeps the levels from 16 steps: three quarters of its rows were 4-step
  buckets, which a read now folds from their (at most 4) raw steps.

The upgrade deletes the other rows: every value stays in `steps` and `layer_stats`, and the
reads return what they returned. The downgrade stores them again, folded from the raw values
with the rollup math and packing format of revisions 0003 and 0006, frozen below (a migration
never imports live application code).
"""

from __future__ import annotations

import math
import struct
import zlib
from array import array
from collections.abc import Iterator, Sequence
from itertools import pairwise
from operator import add
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATS = ("amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac", "nan_count",
          "inf_count", "l2")
_ROLLUP_STATS = ("amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac",
                 "lost_frac", "nan_count", "inf_count", "l2", "amax_scaled")
_INT_STATS = frozenset({"nan_count", "inf_count"})
_ROLLUP_KINDS = "".join("q" if name in _INT_STATS else "d" for name in _ROLLUP_STATS)
_MIN_STATS = frozenset({"amin_nz"})
_LAYER_LEVELS = (6, 8, 10, 12, 14, 16)
_FINEST = _LAYER_LEVELS[0]
_DENSE_STEPS = 16
_SERIES = ("scale_before", "loss", "grad_norm", "lr", "duration")
_SERIES_LEVEL = 2
_SERIES_ROW = struct.Struct("<qdddq")  # count, min, max, last, last step
_CHUNK = 1 << 13  # steps per round trip of the downgrade's series fold
_LAST_STEP = "(SELECT MAX(s.step) FROM steps s WHERE s.run_id = layer_rollups.run_id)"


# --- frozen: ampscope_server.stat_packing, version 1 (as in revision 0006) ----------------------

_HEAD = struct.Struct("<BIB")


def _pack(columns: Sequence[Sequence[Any]], kinds: str) -> bytes:
    n = len(columns[0]) if columns else 0
    values = bytearray()
    masks: list[bytes] = []
    flags = bytearray()
    for column, kind in zip(columns, kinds, strict=True):
        if None in column:
            masks.append(bytes(value is None for value in column))
            column = [0 if value is None else value for value in column]
            flags.append(1)
        else:
            flags.append(0)
        values += array(kind, column).tobytes()
    planes = b"".join(bytes(values[i::8]) for i in range(8))
    compressor = zlib.compressobj(1, zlib.DEFLATED, 15, 8, zlib.Z_RLE)
    body = compressor.compress(planes + b"".join(masks)) + compressor.flush()
    return _HEAD.pack(1, n, len(kinds)) + kinds.encode("ascii") + bytes(flags) + body


def _unpack(blob: bytes) -> list[list[Any]]:
    version, n, k = _HEAD.unpack_from(blob)
    assert version == 1, f"packed array version {version}"
    start = _HEAD.size
    kinds = bytes(blob[start:start + k]).decode("ascii")
    flags = blob[start + k:start + 2 * k]
    body = zlib.decompress(blob[start + 2 * k:])
    size = k * n * 8
    values = bytearray(size)
    for i in range(8):
        values[i::8] = body[i * k * n:(i + 1) * k * n]
    columns: list[list[Any]] = []
    mask_at = size
    for index, kind in enumerate(kinds):
        typed = array(kind)
        typed.frombytes(values[index * n * 8:(index + 1) * n * 8])
        column: list[Any] = typed.tolist()
        if flags[index]:
            mask = body[mask_at:mask_at + n]
            mask_at += n
            column = [None if missing else value for value, missing in zip(column, mask,
                                                                           strict=True)]
        columns.append(column)
    return columns


# --- frozen: the per-layer rollup math (ampscope_server.rollups, as in revision 0006) -----------

def _missing(name: str) -> float:
    if name in _INT_STATS:
        return -1
    return math.inf if name in _MIN_STATS else -math.inf


def _step_layers(stats: dict[str, list[Any]], scale: float | None) -> dict[str, list[Any]]:
    out = {name: [_missing(name) if v is None else v for v in stats[name]] for name in _STATS}
    out["lost_frac"] = list(map(add, out["zero_frac"], out["underflow_frac"]))
    effective = 1.0 if scale is None else scale
    if math.isfinite(effective) and effective > 0:
        out["amax_scaled"] = [a * effective if a >= 0 else a for a in out["amax"]]
    else:
        out["amax_scaled"] = [-math.inf] * len(out["amax"])
    return out


def _reduce(arrays: Sequence[dict[str, list[Any]]]) -> dict[str, list[Any]]:
    if len(arrays) == 1:
        return arrays[0]
    return {name: list(map(min if name in _MIN_STATS else max, *(a[name] for a in arrays)))
            for name in _ROLLUP_STATS}


# --- frozen: the series rollup (ampscope_server.rollups.SeriesAcc and pack_series) -------------

class _Series:
    def __init__(self) -> None:
        self.n, self.lo, self.hi, self.last, self.last_step = 0, math.nan, math.nan, math.nan, -1

    def add(self, step: int, value: float) -> None:
        self.n += 1
        if not math.isnan(value):
            self.lo = value if math.isnan(self.lo) else min(self.lo, value)
            self.hi = value if math.isnan(self.hi) else max(self.hi, value)
        self.last, self.last_step = value, step


def _from_storage(value: float | None, cls: int) -> float | None:
    return {1: math.nan, 2: math.inf, 3: -math.inf}.get(int(cls), value)


# --- the migration ------------------------------------------------------------------------------

def upgrade() -> None:
    for level in _LAYER_LEVELS:  # open buckets: no stored step past their end
        op.execute(sa.text(
            f"DELETE FROM layer_rollups WHERE level = :level "
            f"AND (bucket + 1) * :width > COALESCE({_LAST_STEP}, -1)"
        ).bindparams(level=level, width=1 << level))
    op.execute(sa.text(  # sparse 64-step buckets
        "DELETE FROM layer_rollups WHERE level = :level AND (SELECT COUNT(*) FROM steps s "
        "JOIN layer_stats l ON l.step_id = s.id WHERE s.run_id = layer_rollups.run_id "
        "AND s.step >= bucket * :width AND s.step < (bucket + 1) * :width) <= :dense"
    ).bindparams(level=_FINEST, width=1 << _FINEST, dense=_DENSE_STEPS))
    op.execute(sa.text("DELETE FROM rollups WHERE level = :level").bindparams(
        level=_SERIES_LEVEL))


def _fold(connection: sa.Connection, run_id: str, bucket: int) -> dict[str, list[Any]] | None:
    """The per-layer worst of one 64-step bucket, from its raw steps."""
    rows = connection.execute(sa.text(
        "SELECT s.scale_before, s.scale_before_class, l.data FROM steps s "
        "JOIN layer_stats l ON l.step_id = s.id WHERE s.run_id = :run "
        "AND s.step >= :first AND s.step < :end ORDER BY s.step, s.id"
    ), {"run": run_id, "first": bucket << _FINEST, "end": (bucket + 1) << _FINEST}).all()
    arrays = []
    for scale, scale_class, data in rows:
        arrays.append(_step_layers(dict(zip(_STATS, _unpack(data), strict=True)),
                                   _from_storage(scale, scale_class)))
    return _reduce(arrays) if arrays else None


def _series_rows(connection: sa.Connection, run_id: str) -> Iterator[list[dict[str, Any]]]:
    """The run's 4-step series rollup rows, folded from its steps, a chunk at a time."""
    columns = ", ".join(f"{name}, {name}_class" for name in _SERIES)
    start: Any = connection.execute(sa.text("SELECT MIN(step) FROM steps WHERE run_id = :run"),
                                    {"run": run_id}).scalar()
    while start is not None:
        first = int(start) >> _SERIES_LEVEL << _SERIES_LEVEL
        end = first + _CHUNK  # a multiple of the bucket width: no bucket is cut
        buckets: dict[int, list[_Series]] = {}
        for row in connection.execute(sa.text(
            f"SELECT step, {columns} FROM steps WHERE run_id = :run AND step >= :first "
            "AND step < :end ORDER BY step, id"
        ), {"run": run_id, "first": first, "end": end}):
            step = int(row[0])
            accs = buckets.setdefault(step >> _SERIES_LEVEL, [_Series() for _ in _SERIES])
            for index, acc in enumerate(accs):
                value = _from_storage(row[1 + 2 * index], row[2 + 2 * index])
                if value is not None:
                    acc.add(step, value)
        yield [{"run_id": run_id, "level": _SERIES_LEVEL, "bucket": bucket,
                    "series": b"".join(_SERIES_ROW.pack(a.n, a.lo, a.hi, a.last, a.last_step)
                                       for a in accs)}
               for bucket, accs in sorted(buckets.items())]
        start = connection.execute(sa.text(
            "SELECT MIN(step) FROM steps WHERE run_id = :run AND step >= :end"
        ), {"run": run_id, "end": end}).scalar()


def downgrade() -> None:
    """Store again the rows revision 0008 kept: every bucket with layer statistics, every
    4-step series bucket."""
    connection = op.get_bind()
    series = sa.table("rollups", sa.column("run_id"), sa.column("level"), sa.column("bucket"),
                      sa.column("series"))
    table = sa.table("layer_rollups", sa.column("run_id"), sa.column("level"),
                     sa.column("bucket"), sa.column("data"))
    for (run_id,) in connection.execute(sa.text("SELECT id FROM runs ORDER BY id")).all():
        last = connection.execute(sa.text("SELECT MAX(step) FROM steps WHERE run_id = :run"),
                                  {"run": run_id}).scalar()
        if last is None:
            continue
        for rows in _series_rows(connection, run_id):
            if rows:
                connection.execute(series.insert(), rows)
        stored = {(int(level), int(bucket)) for level, bucket in connection.execute(sa.text(
            "SELECT level, bucket FROM layer_rollups WHERE run_id = :run"), {"run": run_id})}
        buckets = [int(bucket) for (bucket,) in connection.execute(sa.text(
            "SELECT DISTINCT s.step / :width FROM steps s JOIN layer_stats l "
            "ON l.step_id = s.id WHERE s.run_id = :run"
        ), {"run": run_id, "width": 1 << _FINEST})]
        for bucket in sorted(set(buckets)):
            if (_FINEST, bucket) in stored:
                continue
            arrays = _fold(connection, run_id, bucket)
            if arrays is not None:
                connection.execute(table.insert(), [{
                    "run_id": run_id, "level": _FINEST, "bucket": bucket,
                    "data": _pack([arrays[name] for name in _ROLLUP_STATS], _ROLLUP_KINDS)}])
        for finer, level in pairwise(_LAYER_LEVELS):
            bucket = int(last) >> level  # the open bucket, from its children's rows
            fanout = 1 << (level - finer)
            children = [dict(zip(_ROLLUP_STATS, _unpack(data), strict=True))
                        for (data,) in connection.execute(sa.text(
                            "SELECT data FROM layer_rollups WHERE run_id = :run AND level = :level "
                            "AND bucket >= :first AND bucket < :end ORDER BY bucket"
                        ), {"run": run_id, "level": finer, "first": bucket * fanout,
                            "end": (bucket + 1) * fanout})]
            if children:
                arrays = _reduce(children)
                connection.execute(table.insert(), [{
                    "run_id": run_id, "level": level, "bucket": bucket,
                    "data": _pack([arrays[name] for name in _ROLLUP_STATS], _ROLLUP_KINDS)}])
