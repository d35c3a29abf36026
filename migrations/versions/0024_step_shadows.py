"""The FP32 shadow step (issue #30): `step_shadows`.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06

Wire v6 `records[].shadow`: on a sampled applied step the hook re-ran the user's closure in
FP32 and compared each layer's gradient with the AMP one. One row per such step with the run's
key, like the other packed per-step tables (revision 0011): `data` is `stat_packing` of three
float64 columns, each layer's rel_err, cosine and FP32 gradient norm (null for a failed shadow
step, `detail` saying why), the FP32 loss as value + class like `step_rechecks.loss`. A new leaf
table: nothing stored before it changes. Nothing here imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STEP_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "step_shadows",
        sa.Column("step_id", STEP_ID, autoincrement=False, nullable=False),
        sa.Column("run_key", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("loss", sa.Double(), nullable=True),
        sa.Column("loss_class", sa.SmallInteger(), nullable=False),
        sa.Column("layers", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=True),
        sa.Column("detail", sa.String(length=1000), nullable=True),
        sa.ForeignKeyConstraint(["run_key"], ["runs.key"], name="fk_step_shadows_run_key_runs",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["step_id"], ["steps.id"],
                                name="fk_step_shadows_step_id_steps", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("step_id", name="pk_step_shadows"),
    )
    op.create_index("ix_step_shadows_run_key_step_id", "step_shadows", ["run_key", "step_id"])


def downgrade() -> None:
    """Drops the table: the shadow steps the hooks sent are lost (their steps stay)."""
    op.drop_index("ix_step_shadows_run_key_step_id", table_name="step_shadows")
    op.drop_table("step_shadows")
