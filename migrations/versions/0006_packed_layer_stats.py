"""Packed layer statistics: one `layer_stats` row per step, per-layer rollups from 64 steps.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

Before: `layer_stats` held a row per layer per step (eight float/int columns, no run id) and
`rollups` ten per-layer statistic columns beside `series` at every level from 4 steps: more
bytes of rollups than of data (issue #11). After:

- `layer_stats` (step_id, run_id, layers, data): the eight statistics of every layer of a step
  packed in one blob (float64 bits and int64, so every value comes back as stored, NaN and
  ±inf included; None kept in a mask), `run_id` indexed with the step id;
- `rollups` keeps `series` only (every level, from 4 steps);
- `layer_rollups` (run_id, level, bucket, data): the per-layer worst arrays, packed, at the
  levels from 64 steps (6, 8, … 16), copied from the old `rollups` rows of those levels.

The packing format (version 1) and the rollup math are frozen below: a migration never
imports live application code. The upgrade rewrites every layer statistic once, a chunk of
steps per round trip. The downgrade restores the old layout exactly: rows per layer, and the
old per-layer rollup columns (levels 64 steps and up from `layer_rollups`, the 4- and 16-step
levels folded again from the raw statistics, as revision 0003 did).
"""

from __future__ import annotations

import math
import struct
import zlib
from array import array
from collections.abc import Iterable, Sequence
from operator import add
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CHUNK = 2048  # steps per round trip
_STATS = ("amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac", "nan_count",
          "inf_count", "l2")
_STAT_KINDS = "dddddqqd"
_ROLLUP_STATS = ("amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac",
                 "lost_frac", "nan_count", "inf_count", "l2", "amax_scaled")
_INT_STATS = frozenset({"nan_count", "inf_count"})
_ROLLUP_KINDS = "".join("q" if name in _INT_STATS else "d" for name in _ROLLUP_STATS)
_MIN_STATS = frozenset({"amin_nz"})
_LAYER_LEVELS = (6, 8, 10, 12, 14, 16)
_FINE_LEVELS = (2, 4)


# --- frozen: ampscope_server.stat_packing, version 1 -------------------------------------------

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


# --- frozen: the old rollups' per-layer columns (ampscope_server.rollups at 0003-0005) ----------

def _old_stat(name: str, values: Sequence[float]) -> bytes:
    if name in _INT_STATS:
        return array("q", [int(v) for v in values]).tobytes()
    return array("d", values).tobytes()


def _old_unstat(name: str, blob: bytes) -> list[Any]:
    typed = array("q" if name in _INT_STATS else "d")
    typed.frombytes(blob)
    return typed.tolist()


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


# --- the migration ------------------------------------------------------------------------------

def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _rename(old: str, new: str, constraints: Sequence[tuple[str, str]]) -> None:
    """Rename a table; on Postgres its constraints too (their indexes' names are schema-wide, and
    the new table takes the naming convention's names)."""
    op.rename_table(old, new)
    if _postgres():
        for before, after in constraints:
            op.execute(f'ALTER TABLE {new} RENAME CONSTRAINT "{before}" TO "{after}"')


def _run_ids(connection: sa.Connection) -> list[str]:
    return [row[0] for row in connection.execute(sa.text("SELECT id FROM runs ORDER BY id"))]


def _step_chunks(connection: sa.Connection, run_id: str, table: str
                 ) -> Iterable[list[tuple[Any, ...]]]:
    """(id, step, scale_before, scale_before_class) of the run's steps that have a row in
    `table`, by id, a chunk at a time."""
    after = -1
    while True:
        result = connection.execute(sa.text(
            "SELECT s.id, s.step, s.scale_before, s.scale_before_class FROM steps s "
            f"WHERE s.run_id = :run AND s.id > :after AND EXISTS (SELECT 1 FROM {table} t "
            "WHERE t.step_id = s.id) ORDER BY s.id LIMIT :n"
        ), {"run": run_id, "after": after, "n": _CHUNK})
        rows = [tuple(row) for row in result]
        if not rows:
            return
        after = int(rows[-1][0])
        yield rows


def _insert(connection: sa.Connection, table: sa.TableClause, rows: list[dict[str, Any]]) -> None:
    for start in range(0, len(rows), 1000):
        connection.execute(table.insert(), rows[start:start + 1000])


def _layer_stats_table(name: str) -> sa.TableClause:
    return sa.table(name, sa.column("step_id"), sa.column("run_id"), sa.column("layers"),
                    sa.column("data"))


def upgrade() -> None:
    connection = op.get_bind()
    _rename("layer_stats", "layer_stats_0005", [
        ("pk_layer_stats", "pk_layer_stats_0005"),
        ("fk_layer_stats_step_id_steps", "fk_layer_stats_0005_step_id_steps"),
    ])
    step_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "layer_stats",
        sa.Column("step_id", step_id, autoincrement=False, nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("layers", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_layer_stats_run_id_runs"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["step_id"], ["steps.id"],
                                name=op.f("fk_layer_stats_step_id_steps"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("step_id", name=op.f("pk_layer_stats")),
    )
    op.create_index(op.f("ix_layer_stats_run_id_step_id"), "layer_stats", ["run_id", "step_id"])
    if _postgres():
        # The blobs are compressed already: pglz would only spend time failing to shrink them.
        op.execute("ALTER TABLE layer_stats ALTER COLUMN data SET STORAGE EXTERNAL")
    op.create_table(
        "layer_rollups",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"],
                                name=op.f("fk_layer_rollups_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "level", "bucket", name=op.f("pk_layer_rollups")),
    )
    if _postgres():
        op.execute("ALTER TABLE layer_rollups ALTER COLUMN data SET STORAGE EXTERNAL")
    new_stats = _layer_stats_table("layer_stats")
    for run_id in _run_ids(connection):
        for steps in _step_chunks(connection, run_id, "layer_stats_0005"):
            by_step: dict[int, list[list[Any]]] = {}
            for row in connection.execute(
                sa.text(f"SELECT step_id, {', '.join(_STATS)} FROM layer_stats_0005 "
                        "WHERE step_id IN :ids ORDER BY step_id, layer_index")
                .bindparams(sa.bindparam("ids", expanding=True)),
                {"ids": [int(step[0]) for step in steps]},
            ):
                columns = by_step.setdefault(int(row[0]), [[] for _ in _STATS])
                for column, value in zip(columns, row[1:], strict=True):
                    column.append(value)
            _insert(connection, new_stats, [
                {"step_id": step, "run_id": run_id, "layers": len(columns[0]),
                 "data": _pack([_floats(c, kind) for c, kind in zip(columns, _STAT_KINDS,
                                                                    strict=True)], _STAT_KINDS)}
                for step, columns in by_step.items()
            ])
    _copy_layer_rollups(connection)
    op.drop_table("layer_stats_0005")
    with op.batch_alter_table("rollups") as batch:
        for name in _ROLLUP_STATS:
            batch.drop_column(name)


def _floats(column: list[Any], kind: str) -> list[Any]:
    """A stored column as the wire gave it: a float column's values as floats (SQLite gives back
    an integral REAL as written), counts as ints."""
    if kind == "q":
        return [int(v) for v in column]
    return [None if v is None else float(v) for v in column]


def _copy_layer_rollups(connection: sa.Connection) -> None:
    target = sa.table("layer_rollups", sa.column("run_id"), sa.column("level"),
                      sa.column("bucket"), sa.column("data"))
    levels = ", ".join(str(level) for level in _LAYER_LEVELS)
    for run_id in _run_ids(connection):
        rows = connection.execute(sa.text(
            f"SELECT level, bucket, {', '.join(_ROLLUP_STATS)} FROM rollups WHERE run_id = :run "
            f"AND level IN ({levels}) AND amax IS NOT NULL ORDER BY level, bucket"
        ), {"run": run_id})
        _insert(connection, target, [
            {"run_id": run_id, "level": level, "bucket": bucket, "data": _pack(
                [_old_unstat(name, blob) for name, blob in zip(_ROLLUP_STATS, blobs, strict=True)],
                _ROLLUP_KINDS)}
            for level, bucket, *blobs in rows
        ])


def downgrade() -> None:
    connection = op.get_bind()
    with op.batch_alter_table("rollups") as batch:
        for name in _ROLLUP_STATS:
            batch.add_column(sa.Column(name, sa.LargeBinary(), nullable=True))
    _rename("layer_stats", "layer_stats_0006", [
        ("pk_layer_stats", "pk_layer_stats_0006"),
        ("fk_layer_stats_step_id_steps", "fk_layer_stats_0006_step_id_steps"),
        ("fk_layer_stats_run_id_runs", "fk_layer_stats_0006_run_id_runs"),
    ])
    op.drop_index("ix_layer_stats_run_id_step_id", table_name="layer_stats_0006")
    step_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    old = op.create_table(
        "layer_stats",
        sa.Column("step_id", step_id, nullable=False),
        sa.Column("layer_index", sa.Integer(), nullable=False),
        sa.Column("amax", sa.Double(), nullable=True),
        sa.Column("amin_nz", sa.Double(), nullable=True),
        sa.Column("zero_frac", sa.Double(), nullable=False),
        sa.Column("subnormal_frac", sa.Double(), nullable=False),
        sa.Column("underflow_frac", sa.Double(), nullable=False),
        sa.Column("nan_count", sa.BigInteger(), nullable=False),
        sa.Column("inf_count", sa.BigInteger(), nullable=False),
        sa.Column("l2", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["step_id"], ["steps.id"],
                                name=op.f("fk_layer_stats_step_id_steps"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("step_id", "layer_index", name=op.f("pk_layer_stats")),
    )
    assert old is not None
    rollups = sa.table("rollups", sa.column("run_id"), sa.column("level"), sa.column("bucket"),
                       *[sa.column(name) for name in _ROLLUP_STATS])
    for run_id in _run_ids(connection):
        fine: dict[tuple[int, int], list[dict[str, list[Any]]]] = {}
        for steps in _step_chunks(connection, run_id, "layer_stats_0006"):
            blobs: dict[int, bytes] = {
                int(row[0]): row[1] for row in connection.execute(
                    sa.text("SELECT step_id, data FROM layer_stats_0006 WHERE step_id IN :ids")
                    .bindparams(sa.bindparam("ids", expanding=True)),
                    {"ids": [int(step[0]) for step in steps]},
                )
            }
            rows: list[dict[str, Any]] = []
            for step_row in steps:
                step_id_value, step, scale, scale_class = (int(step_row[0]), int(step_row[1]),
                                                           step_row[2], int(step_row[3]))
                stats = dict(zip(_STATS, _unpack(blobs[step_id_value]), strict=True))
                rows.extend(
                    {"step_id": step_id_value, "layer_index": index,
                     **dict(zip(_STATS, values, strict=True))}
                    for index, values in enumerate(zip(*stats.values(), strict=True)))
                effective = {1: math.nan, 2: math.inf, 3: -math.inf}.get(scale_class, scale)
                arrays = _step_layers(stats, effective)
                for level in _FINE_LEVELS:
                    fine.setdefault((level, int(step) >> level), []).append(arrays)
            _insert(connection, old, rows)
        for (level, bucket), group in fine.items():
            worst = _reduce(group)
            connection.execute(
                rollups.update()
                .where(rollups.c.run_id == run_id, rollups.c.level == level,
                       rollups.c.bucket == bucket)
                .values({name: _old_stat(name, worst[name]) for name in _ROLLUP_STATS}))
        for level, bucket, data in connection.execute(sa.text(
            "SELECT level, bucket, data FROM layer_rollups WHERE run_id = :run"
        ), {"run": run_id}):
            columns = _unpack(data)
            connection.execute(
                rollups.update()
                .where(rollups.c.run_id == run_id, rollups.c.level == level,
                       rollups.c.bucket == bucket)
                .values({name: _old_stat(name, column)
                         for name, column in zip(_ROLLUP_STATS, columns, strict=True)}))
    op.drop_table("layer_stats_0006")
    op.drop_table("layer_rollups")
