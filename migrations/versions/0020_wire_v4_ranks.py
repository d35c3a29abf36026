"""Wire v4 (issue #13): `runs.world_size`, `step_ranks` and `step_optimizers`.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05

A distributed job's run records its world size (every run stored before is 1: a single
process, which is what those clients recorded) and, per step, each rank's loss and count of
layers with a non-finite gradient and each watched optimizer's skip flag and learning rates.
Both are one row per step whatever the number of ranks or optimizers, packed like
`swallowed_stats` (revision 0011), so a 64-rank job does not add 64 rows a step. `step_ranks`
repeats the step's number and counts its non-finite ranks, with a partial index on those, so
the first step where a rank went non-finite is one index probe; the index's condition is
frozen here as written in `models.RANKS_NONFINITE`, which the query repeats (SQLite uses a
partial index only for a query holding its condition as written).

`world_size` is added in place (SQLite's native ADD COLUMN, `recreate="never"`: every table
points at `runs`, revision 0010 explains why it is not rebuilt), NOT NULL with a server default
of 1, which fills the existing rows. Nothing here imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STEP_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
RANKS_NONFINITE = "nonfinite_ranks > 0"


def _keys(table: str) -> list[sa.Constraint]:
    return [
        sa.ForeignKeyConstraint(["run_key"], ["runs.key"], name=f"fk_{table}_run_key_runs",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["step_id"], ["steps.id"], name=f"fk_{table}_step_id_steps",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("step_id", name=f"pk_{table}"),
    ]


def upgrade() -> None:
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.add_column(sa.Column("world_size", sa.Integer(), server_default=sa.text("1"),
                                   nullable=False))
    op.create_table(
        "step_ranks",
        sa.Column("step_id", STEP_ID, autoincrement=False, nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("run_key", sa.Integer(), nullable=False),
        sa.Column("ranks", sa.Integer(), nullable=False),
        sa.Column("nonfinite_ranks", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        *_keys("step_ranks"),
    )
    op.create_index("ix_step_ranks_run_key_step_id", "step_ranks", ["run_key", "step_id"])
    op.create_index("ix_step_ranks_run_key_nonfinite_step", "step_ranks", ["run_key", "step"],
                    sqlite_where=sa.text(RANKS_NONFINITE),
                    postgresql_where=sa.text(RANKS_NONFINITE))
    op.create_table(
        "step_optimizers",
        sa.Column("step_id", STEP_ID, autoincrement=False, nullable=False),
        sa.Column("run_key", sa.Integer(), nullable=False),
        sa.Column("optimizers", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("lr", sa.LargeBinary(), nullable=False),
        *_keys("step_optimizers"),
    )
    op.create_index("ix_step_optimizers_run_key_step_id", "step_optimizers",
                    ["run_key", "step_id"])


def downgrade() -> None:
    """Drops the two tables and the column: the per-rank and per-optimizer values and the
    world sizes of distributed runs are lost (their steps' v1 fields stay)."""
    op.drop_table("step_optimizers")
    op.drop_table("step_ranks")
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.drop_column("world_size")
