"""Wire v3: the FP32 re-check of overflow steps and the swallowed-update fractions.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29

Two new children of `steps`, cascading with their step: `step_rechecks` (one row per
re-checked step: status, the FP32 loss as value + class, the non-finite layers as a JSON list,
the closure's error) and `swallowed_stats` (one row per layer of a step that carried
`swallowed`, the fraction NULL where not measured). No existing table changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STEP_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _step_id(table: str) -> list[sa.Column[object] | sa.ForeignKeyConstraint]:
    return [
        sa.Column("step_id", STEP_ID, nullable=False),
        sa.ForeignKeyConstraint(
            ["step_id"], ["steps.id"], name=op.f(f"fk_{table}_step_id_steps"),
            ondelete="CASCADE",
        ),
    ]


def upgrade() -> None:
    op.create_table(
        "step_rechecks",
        *_step_id("step_rechecks"),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("loss", sa.Double(), nullable=True),
        sa.Column("loss_class", sa.SmallInteger(), nullable=False),
        sa.Column("layers", sa.JSON(), nullable=False),
        sa.Column("detail", sa.String(length=1000), nullable=True),
        sa.PrimaryKeyConstraint("step_id", name=op.f("pk_step_rechecks")),
    )
    op.create_table(
        "swallowed_stats",
        *_step_id("swallowed_stats"),
        sa.Column("layer_index", sa.Integer(), nullable=False),
        sa.Column("frac", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("step_id", "layer_index", name=op.f("pk_swallowed_stats")),
    )


def downgrade() -> None:
    """Drops both tables: the re-checks and swallowed fractions of all runs are lost."""
    op.drop_table("swallowed_stats")
    op.drop_table("step_rechecks")
