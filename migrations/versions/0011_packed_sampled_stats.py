"""Packed sampled statistics: `activation_stats`, `histograms` and `swallowed_stats` one row
per step, with the run's key.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

Before, each held a row per module or layer per step, keyed by the step only: no run key (no
cheap per-run delete or partitioning), and a row header per value group (issue #11). After,
like `layer_stats` (revision 0006), one row per step: (step_id, run_key, length, data), `data`
packed in the `stat_packing` format (version 1, frozen below):

- `activation_stats.data`: the eight activation statistics of every module (float64 bits and
  int64; amax, amin_nz and l2 may be NaN or ±inf, kept as their bits; null in the mask);
  `modules` the module count. The old `_class` columns are what the float64 bits already say:
  the upgrade turns (value, class) into the float it stands for, the downgrade back;
- `histograms.data`: the counts of every layer, one int64 column of layers x bins values, layer
  after layer; `min_exp`, `max_exp` as before, `layers` the layer count;
- `swallowed_stats.data`: one float64 column, a fraction per layer (null: not measured).

Every value comes back as stored. The tables are leaves (no table points at them), so they
are rebuilt by rename, create, copy a chunk of steps per round trip, drop, on both dialects.
Nothing here imports application code.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STEP_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_CHUNK = 512  # steps per round trip
_STATS = ("amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac", "nan_count",
          "inf_count", "l2")
_KINDS = "dddddqqd"
_CLASSED = frozenset({"amax", "amin_nz", "l2"})


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


# --- frozen: ampscope_server.codec's storage classes --------------------------------------------

_FROM_CLASS = {1: math.nan, 2: math.inf, 3: -math.inf}


def _from_storage(value: float | None, cls: int) -> float | None:
    return _FROM_CLASS[cls] if cls else (None if value is None else float(value))


def _to_storage(value: float | None) -> tuple[float | None, int]:
    if value is None:
        return None, 0
    if math.isnan(value):
        return None, 1
    if math.isinf(value):
        return None, 2 if value > 0 else 3
    return value, 0


# --- the migration ------------------------------------------------------------------------------

def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _set_aside(table: str, suffix: str) -> None:
    op.rename_table(table, table + suffix)
    if _postgres():
        op.execute(f'ALTER TABLE {table}{suffix} RENAME CONSTRAINT "pk_{table}" '
                   f'TO "pk_{table}{suffix}"')


def _create_packed(table: str, length: str, *extra: sa.Column[Any]) -> sa.Table:
    created = op.create_table(
        table,
        sa.Column("step_id", STEP_ID, autoincrement=False, nullable=False),
        sa.Column("run_key", sa.Integer(), nullable=False),
        *extra,
        sa.Column(length, sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["run_key"], ["runs.key"], name=f"fk_{table}_run_key_runs",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["step_id"], ["steps.id"], name=f"fk_{table}_step_id_steps",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("step_id", name=f"pk_{table}"),
    )
    assert created is not None
    op.create_index(f"ix_{table}_run_key_step_id", table, ["run_key", "step_id"])
    if _postgres():
        # The blobs are compressed already (as `layer_stats.data`, revision 0006).
        op.execute(f"ALTER TABLE {table} ALTER COLUMN data SET STORAGE EXTERNAL")
    return created


def _create_rows(table: str, *columns: sa.Column[Any], key: Sequence[str]) -> sa.Table:
    created = op.create_table(
        table,
        sa.Column("step_id", STEP_ID, nullable=False),
        *columns,
        sa.ForeignKeyConstraint(["step_id"], ["steps.id"], name=f"fk_{table}_step_id_steps",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("step_id", *key, name=f"pk_{table}"),
    )
    assert created is not None
    return created


def _old_activation_columns() -> list[sa.Column[Any]]:
    out: list[sa.Column[Any]] = [sa.Column("module_index", sa.Integer(), nullable=False)]
    for name in _STATS:
        if name in _CLASSED:
            out += [sa.Column(name, sa.Double(), nullable=True),
                    sa.Column(f"{name}_class", sa.SmallInteger(), nullable=False)]
        elif name.endswith("_count"):
            out.append(sa.Column(name, sa.BigInteger(), nullable=False))
        else:
            out.append(sa.Column(name, sa.Double(), nullable=False))
    return out


def _chunks(connection: sa.Connection, table: str, columns: str, order: str
            ) -> Iterator[list[tuple[Any, ...]]]:
    """Rows of `table` grouped by step, `_CHUNK` steps per round trip, in step id order; each
    row is (step_id, run_key, *columns)."""
    after = -1
    while True:
        ids = [int(row[0]) for row in connection.execute(sa.text(
            f"SELECT DISTINCT step_id FROM {table} WHERE step_id > :after ORDER BY step_id "
            "LIMIT :n"), {"after": after, "n": _CHUNK})]
        if not ids:
            return
        after = ids[-1]
        yield [tuple(row) for row in connection.execute(
            sa.text(f"SELECT t.step_id, s.run_key, {columns} FROM {table} t JOIN steps s "
                    f"ON s.id = t.step_id WHERE t.step_id IN :ids ORDER BY t.step_id, {order}")
            .bindparams(sa.bindparam("ids", expanding=True)), {"ids": ids})]


def _by_step(rows: list[tuple[Any, ...]]) -> dict[int, tuple[int, list[tuple[Any, ...]]]]:
    """{step_id: (run_key, [row[2:] in order])}."""
    out: dict[int, tuple[int, list[tuple[Any, ...]]]] = {}
    for row in rows:
        out.setdefault(int(row[0]), (int(row[1]), []))[1].append(row[2:])
    return out


def _insert(connection: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    if rows:
        connection.execute(table.insert(), rows)


def _float(value: Any) -> float | None:
    """A stored float as the wire gave it (SQLite gives back an integral REAL as written)."""
    return None if value is None else float(value)


def upgrade() -> None:
    connection = op.get_bind()
    for table in ("activation_stats", "histograms", "swallowed_stats"):
        _set_aside(table, "_0010")
    activations = _create_packed("activation_stats", "modules")
    histograms = _create_packed("histograms", "layers",
                                sa.Column("min_exp", sa.Integer(), nullable=False),
                                sa.Column("max_exp", sa.Integer(), nullable=False))
    swallowed = _create_packed("swallowed_stats", "layers")

    stored = ", ".join(f"t.{name}, t.{name}_class" if name in _CLASSED else f"t.{name}"
                       for name in _STATS)
    for rows in _chunks(connection, "activation_stats_0010", stored, "t.module_index"):
        packed = []
        for step_id, (run_key, modules) in _by_step(rows).items():
            columns: list[list[Any]] = [[] for _ in _STATS]
            for module in modules:
                at = 0
                for index, name in enumerate(_STATS):
                    if name in _CLASSED:
                        columns[index].append(_from_storage(module[at], int(module[at + 1])))
                        at += 2
                    else:
                        value = module[at]
                        columns[index].append(int(value) if name.endswith("_count")
                                              else float(value))
                        at += 1
            packed.append({"step_id": step_id, "run_key": run_key, "modules": len(modules),
                           "data": _pack(columns, _KINDS)})
        _insert(connection, activations, packed)
    for rows in _chunks(connection, "histograms_0010", "t.min_exp, t.max_exp, t.counts",
                        "t.layer_index"):
        packed = []
        for step_id, (run_key, layers) in _by_step(rows).items():
            flat = [int(count) for _, _, counts in layers for count in _counts(counts)]
            packed.append({"step_id": step_id, "run_key": run_key, "min_exp": layers[0][0],
                           "max_exp": layers[0][1], "layers": len(layers),
                           "data": _pack([flat], "q")})
        _insert(connection, histograms, packed)
    for rows in _chunks(connection, "swallowed_stats_0010", "t.frac", "t.layer_index"):
        _insert(connection, swallowed, [
            {"step_id": step_id, "run_key": run_key, "layers": len(layers),
             "data": _pack([[_float(layer[0]) for layer in layers]], "d")}
            for step_id, (run_key, layers) in _by_step(rows).items()])
    for table in ("activation_stats", "histograms", "swallowed_stats"):
        op.drop_table(table + "_0010")


def _counts(stored: Any) -> list[int]:
    """A JSON column as a list: psycopg decodes it, SQLite's driver gives the text."""
    return list(json.loads(stored) if isinstance(stored, str) else stored)


def downgrade() -> None:
    connection = op.get_bind()
    for table in ("activation_stats", "histograms", "swallowed_stats"):
        _set_aside(table, "_0011")
        op.drop_index(f"ix_{table}_run_key_step_id", table_name=table + "_0011")
    activations = _create_rows("activation_stats", *_old_activation_columns(),
                               key=["module_index"])
    histograms = _create_rows(
        "histograms", sa.Column("layer_index", sa.Integer(), nullable=False),
        sa.Column("min_exp", sa.Integer(), nullable=False),
        sa.Column("max_exp", sa.Integer(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False), key=["layer_index"])
    swallowed = _create_rows(
        "swallowed_stats", sa.Column("layer_index", sa.Integer(), nullable=False),
        sa.Column("frac", sa.Double(), nullable=True), key=["layer_index"])

    for rows in _chunks(connection, "activation_stats_0011", "t.data", "t.step_id"):
        out = []
        for step_id, _, data in rows:
            columns = _unpack(data)
            for index, values in enumerate(zip(*columns, strict=True)):
                row: dict[str, Any] = {"step_id": step_id, "module_index": index}
                for name, value in zip(_STATS, values, strict=True):
                    if name in _CLASSED:
                        row[name], row[f"{name}_class"] = _to_storage(value)
                    else:
                        row[name] = value
                out.append(row)
        _insert(connection, activations, out)
    for rows in _chunks(connection, "histograms_0011", "t.min_exp, t.max_exp, t.layers, t.data",
                        "t.step_id"):
        out = []
        for step_id, _, min_exp, max_exp, layers, data in rows:
            flat = _unpack(data)[0]
            bins = len(flat) // int(layers) if layers else 0
            out.extend({"step_id": step_id, "layer_index": index, "min_exp": min_exp,
                        "max_exp": max_exp, "counts": flat[index * bins:(index + 1) * bins]}
                       for index in range(int(layers)))
        _insert(connection, histograms, out)
    for rows in _chunks(connection, "swallowed_stats_0011", "t.data", "t.step_id"):
        _insert(connection, swallowed, [
            {"step_id": step_id, "layer_index": index, "frac": frac}
            for step_id, _, data in rows for index, frac in enumerate(_unpack(data)[0])])
    for table in ("activation_stats", "histograms", "swallowed_stats"):
        op.drop_table(table + "_0011")
