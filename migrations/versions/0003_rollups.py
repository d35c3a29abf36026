"""Rollups: per-run min/max/last buckets of 4, 16, … 65536 steps for bounded chart queries.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

One new table, `rollups`, keyed by (run_id, level, bucket), cascading with its run. The upgrade
backfills it from the stored steps and layer statistics, run by run in step order, with the
same pure functions ingest uses (`ampscope_server.rollups`), so an upgraded database charts
exactly as one that ingested with rollups from the start. The backfill reads every stored step
once; on a large database it takes about as long as reading the data. Downgrade drops the table
(its content is derived: nothing is lost).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from ampscope_server import rollups

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CHUNK = 4096  # steps per backfill round trip
_STORED = ("amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac", "nan_count",
           "inf_count", "l2")


def upgrade() -> None:
    table = op.create_table(
        "rollups",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("series", sa.LargeBinary(), nullable=False),
        *[sa.Column(name, sa.LargeBinary(), nullable=True) for name in rollups.ROLLUP_STATS],
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_rollups_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "level", "bucket", name=op.f("pk_rollups")),
    )
    assert table is not None
    _backfill(op.get_bind(), table)


def _value(value: float | None, cls: int) -> float | None:
    return {1: float("nan"), 2: float("inf"), 3: float("-inf")}.get(cls, value)


def _backfill(connection: sa.Connection, table: sa.Table) -> None:
    run_ids = [row[0] for row in connection.execute(sa.text("SELECT id FROM runs"))]
    columns = ", ".join(f"{name}, {name}_class" for name in rollups.SERIES)
    for run_id in run_ids:
        buckets: dict[tuple[int, int], rollups.Bucket] = {}
        after: tuple[int, int] = (-1, -1)
        while True:
            steps = connection.execute(sa.text(
                f"SELECT id, step, {columns} FROM steps WHERE run_id = :run AND "
                "(step > :step OR (step = :step AND id > :id)) ORDER BY step, id LIMIT :n"
            ), {"run": run_id, "step": after[0], "id": after[1], "n": _CHUNK}).all()
            if not steps:
                break
            after = (int(steps[-1][1]), int(steps[-1][0]))
            layers: dict[int, dict[str, list[float | None]]] = {}
            stats = connection.execute(
                sa.text(f"SELECT step_id, {', '.join(_STORED)} FROM layer_stats "
                        "WHERE step_id IN :ids ORDER BY step_id, layer_index")
                .bindparams(sa.bindparam("ids", expanding=True)),
                {"ids": [int(row[0]) for row in steps]},
            )
            for step_id, *values in stats:
                entry = layers.setdefault(int(step_id), {name: [] for name in _STORED})
                for name, value in zip(_STORED, values, strict=True):
                    entry[name].append(value)
            inputs = [
                rollups.StepInput(
                    step=int(row[1]),
                    series=[_value(row[2 + 2 * i], row[3 + 2 * i])
                            for i in range(len(rollups.SERIES))],
                    layers=layers.get(int(row[0])),
                )
                for row in steps
            ]
            for key, bucket in rollups.accumulate(inputs).items():
                if key in buckets:
                    buckets[key].merge(bucket)
                else:
                    buckets[key] = bucket
            # Buckets that end before the last step read are complete: write them out.
            done = [key for key in buckets if ((key[1] + 1) << key[0]) <= after[0]]
            _write(connection, table, run_id, {key: buckets.pop(key) for key in done})
        _write(connection, table, run_id, buckets)


def _write(connection: sa.Connection, table: sa.Table, run_id: str,
           buckets: dict[tuple[int, int], rollups.Bucket]) -> None:
    rows = [rollups.to_row(run_id, key, bucket) for key, bucket in buckets.items()]
    for start in range(0, len(rows), 1000):
        connection.execute(table.insert(), rows[start:start + 1000])


def downgrade() -> None:
    op.drop_table("rollups")
