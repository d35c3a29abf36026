"""Integer run keys in the rollups: `rollups.run_key` and `layer_rollups.run_key`.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03

Revision 0010 gave `runs` an integer `key` and moved `steps` and `layer_stats` to it; the two
rollup tables still carried the run's 36-character id in every row and in their primary key
(run_id, level, bucket). After: `run_key` (`runs.key`, ON DELETE CASCADE) instead, primary key
(run_key, level, bucket). The columns go widest first (bucket, run_key, level), so Postgres
pads nothing between them.

Both tables are leaves (no table points at them), so they are rebuilt by rename, create,
INSERT … SELECT, drop on both dialects, as revision 0011 did its tables: the database copies
every blob itself, bit for bit. The downgrade rebuilds the 0011 layout the same way. Nothing
here imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = {"rollups": "series", "layer_rollups": "data"}
"""Each rollup table and its blob column."""


def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _create(table: str, blob: str, keyed: bool) -> None:
    run = "run_key" if keyed else "run_id"
    run_column = (sa.Column("run_key", sa.Integer(), nullable=False) if keyed
                  else sa.Column("run_id", sa.String(length=64), nullable=False))
    key_columns = ([sa.Column("bucket", sa.BigInteger(), nullable=False), run_column,
                    sa.Column("level", sa.SmallInteger(), nullable=False)] if keyed
                   else [run_column, sa.Column("level", sa.SmallInteger(), nullable=False),
                         sa.Column("bucket", sa.BigInteger(), nullable=False)])
    op.create_table(
        table,
        *key_columns,
        sa.Column(blob, sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint([run], ["runs.key" if keyed else "runs.id"],
                                name=f"fk_{table}_{run}_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint(run, "level", "bucket", name=f"pk_{table}"),
    )
    if _postgres() and table == "layer_rollups":
        # The blobs are compressed already (revision 0006).
        op.execute("ALTER TABLE layer_rollups ALTER COLUMN data SET STORAGE EXTERNAL")


def _rebuild(keyed: bool) -> None:
    """Replace both tables by the `keyed` (0012) or the 0011 layout, keeping every row."""
    suffix = "_0011" if keyed else "_0012"
    for table, blob in _TABLES.items():
        op.rename_table(table, table + suffix)
        if _postgres():
            # The primary key's index name is schema-wide: out of the successor's way.
            op.execute(f'ALTER TABLE {table}{suffix} RENAME CONSTRAINT "pk_{table}" '
                       f'TO "pk_{table}{suffix}"')
        _create(table, blob, keyed)
        if keyed:
            op.execute(f'INSERT INTO {table} (bucket, run_key, level, {blob}) SELECT o.bucket, '
                       f'r."key", o.level, o.{blob} FROM {table}{suffix} o JOIN runs r '
                       "ON r.id = o.run_id")
        else:
            op.execute(f"INSERT INTO {table} (run_id, level, bucket, {blob}) SELECT r.id, "
                       f"o.level, o.bucket, o.{blob} FROM {table}{suffix} o JOIN runs r "
                       'ON r."key" = o.run_key')
        op.drop_table(table + suffix)


def upgrade() -> None:
    _rebuild(keyed=True)


def downgrade() -> None:
    _rebuild(keyed=False)
