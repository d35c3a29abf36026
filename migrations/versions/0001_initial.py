"""Initial schema: runs, attempts, layers, steps, layer_stats.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Every step float that may be non-finite has a `<name>_class` column (0 finite or null, 1 NaN,
2 +inf, 3 -inf): SQLite stores NaN as NULL. Constraint names follow models.NAMING_CONVENTION.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STEP_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _classed(name: str) -> list[sa.Column[object]]:
    return [
        sa.Column(name, sa.Double(), nullable=True),
        sa.Column(f"{name}_class", sa.SmallInteger(), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("project", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("target_format", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_table(
        "attempts",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_attempts_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("run_id", "ordinal", name=op.f("uq_attempts_run_id_ordinal")),
    )
    op.create_table(
        "layers",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=500), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("dtype", sa.String(length=32), nullable=False),
        sa.Column("numel", sa.BigInteger(), nullable=False),
        sa.Column("module_type", sa.String(length=200), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_layers_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "index", name=op.f("pk_layers")),
    )
    op.create_table(
        "steps",
        sa.Column("id", STEP_ID, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("attempt_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("wall_time", sa.Double(), nullable=False),
        *_classed("loss"),
        *_classed("scale_before"),
        *_classed("scale_after"),
        sa.Column("growth_tracker", sa.BigInteger(), nullable=True),
        sa.Column("found_inf", sa.Boolean(), nullable=False),
        sa.Column("skipped", sa.Boolean(), nullable=False),
        *_classed("grad_norm"),
        *_classed("lr"),
        *_classed("duration"),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.id"], name=op.f("fk_steps_attempt_id_attempts"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_steps_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_steps")),
        sa.UniqueConstraint(
            "run_id", "attempt_id", "seq", name=op.f("uq_steps_run_id_attempt_id_seq")
        ),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_steps_run_id_id", "steps", ["run_id", "id"])
    op.create_index("ix_steps_run_id_step", "steps", ["run_id", "step"])
    op.create_table(
        "layer_stats",
        sa.Column("step_id", STEP_ID, nullable=False),
        sa.Column("layer_index", sa.Integer(), nullable=False),
        sa.Column("amax", sa.Double(), nullable=True),
        sa.Column("amin_nz", sa.Double(), nullable=True),
        sa.Column("zero_frac", sa.Double(), nullable=False),
        sa.Column("subnormal_frac", sa.Double(), nullable=False),
        sa.Column("underflow_frac", sa.Double(), nullable=False),
        sa.Column("nan_count", sa.BigInteger(), nullable=False),
        sa.Column("inf_count", sa.BigInteger(), nullable=False),
        sa.Column("l2", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["step_id"], ["steps.id"], name=op.f("fk_layer_stats_step_id_steps"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("step_id", "layer_index", name=op.f("pk_layer_stats")),
    )


def downgrade() -> None:
    """Drops every table: all stored runs are lost."""
    op.drop_table("layer_stats")
    op.drop_index("ix_steps_run_id_step", table_name="steps")
    op.drop_index("ix_steps_run_id_id", table_name="steps")
    op.drop_table("steps")
    op.drop_table("layers")
    op.drop_table("attempts")
    op.drop_table("runs")
