"""Skip counts in the series rollups: `rollups.step_count` and `rollups.skip_count`.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03

The run page's skip rate (the share of skipped steps among the last `window` step numbers)
read every step's flag of the range: ~1 s at 100k steps (issue #11). After, each series rollup
(levels from 16 steps) holds the bucket's stored step numbers, each once, and how many of them
were skipped, and a long range's rate is read from those (`skip_rates.blocks`). A step number
counts once, with the flag of its first stored row (the lowest id): a resumed attempt that
re-sends steps stores them again, and the rolling rate ignores a step number it has seen.

`rollups` is a leaf, so it is rebuilt (rename, create, INSERT … SELECT with the counts
computed by the database from `steps`, drop), the columns widest first (bucket, run_key, the
two counts, level), as revision 0012 did; every `series` blob is copied as stored. On SQLite
the new table is WITHOUT ROWID (clustered by its primary key). The downgrade rebuilds the 0012
layout the same way. Nothing here imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _create(counted: bool) -> None:
    counts = [sa.Column("step_count", sa.Integer(), nullable=False),
              sa.Column("skip_count", sa.Integer(), nullable=False)] if counted else []
    op.create_table(
        "rollups",
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("run_key", sa.Integer(), nullable=False),
        *counts,
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("series", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["run_key"], ["runs.key"], name="fk_rollups_run_key_runs",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_key", "level", "bucket", name="pk_rollups"),
        # SQLite: rows clustered by the primary key, so a read of a level's buckets (the skip
        # rate's sliding sums) scans them in order rather than probing the table per row, and
        # the key is stored once rather than in the table and again in its index.
        sqlite_with_rowid=not counted,
    )


def _set_aside(suffix: str) -> None:
    op.rename_table("rollups", "rollups" + suffix)
    if _postgres():
        # The primary key's index name is schema-wide: out of the successor's way.
        op.execute(f'ALTER TABLE rollups{suffix} RENAME CONSTRAINT "pk_rollups" '
                   f'TO "pk_rollups{suffix}"')


def upgrade() -> None:
    levels = [int(level) for level in op.get_bind().execute(
        sa.text("SELECT DISTINCT level FROM rollups ORDER BY level")).scalars()]
    _set_aside("_0012")
    _create(counted=True)
    # Each (run, step number) once, with its first stored row's flag, then its counts per
    # level, both as tables: a CTE referenced once per level is evaluated once per level on
    # SQLite, and joining an unindexed UNION of them to every rollup row took 8 minutes on a
    # run of 1M steps (the tables: seconds).
    op.execute("CREATE TABLE firsts_0013 AS SELECT s.run_key, s.step, s.skipped FROM steps s "
               "WHERE s.id IN (SELECT min(id) FROM steps GROUP BY run_key, step)")
    op.create_table(
        "counts_0013",
        sa.Column("run_key", sa.Integer(), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("k", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("run_key", "level", "bucket", name="pk_counts_0013"),
    )
    for level in levels:
        op.execute(
            f"INSERT INTO counts_0013 (run_key, level, bucket, n, k) SELECT run_key, {level}, "
            f"step >> {level}, count(*), sum(CASE WHEN skipped THEN 1 ELSE 0 END) "
            f"FROM firsts_0013 GROUP BY run_key, step >> {level}")
    op.execute(
        "INSERT INTO rollups (bucket, run_key, step_count, skip_count, level, series) "
        "SELECT o.bucket, o.run_key, coalesce(c.n, 0), coalesce(c.k, 0), o.level, o.series "
        "FROM rollups_0012 o LEFT JOIN counts_0013 c ON c.run_key = o.run_key "
        "AND c.level = o.level AND c.bucket = o.bucket")
    op.drop_table("counts_0013")
    op.drop_table("firsts_0013")
    op.drop_table("rollups_0012")


def downgrade() -> None:
    _set_aside("_0013")
    _create(counted=False)
    op.execute("INSERT INTO rollups (bucket, run_key, level, series) SELECT bucket, run_key, "
               "level, series FROM rollups_0013")
    op.drop_table("rollups_0013")
