"""Scaled low-precision recipes' what-ifs (issue #33): `step_formats`.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07

Wire v7 `records[].formats`: on a sampled step the hook measured what FP8/MX/NVFP4 recipes
would do to each Linear/Conv module's three GEMM operands. One row per such step with the run's
key, like the other per-step tables (revision 0011): `data` is the wire's `values` then
`operands`, little-endian float64 as sent (not `stat_packing`: uncompressed, so a read cuts one
layer's statistics out of it by offset), `layers` and `recipes` comma-joined text, `step` the
step's number (index (run_key, step, step_id): thinning and "the sampled step at or before N"
read the index, not `steps`). `trained` names, per listed layer, the recipe its module really
trains in (comma-joined, empty for none; null: none does) and `trained_data` holds the amax
and the scale that recipe used per layer and operand (float64, as `data`). A new leaf table:
nothing stored before it changes. Nothing here imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STEP_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
RECIPES_LENGTH = 527
"""16 recipe names of at most 32 characters, comma-joined (frozen here: `format_packing`)."""


def upgrade() -> None:
    op.create_table(
        "step_formats",
        sa.Column("step_id", STEP_ID, autoincrement=False, nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("run_key", sa.Integer(), nullable=False),
        sa.Column("recipes", sa.String(length=RECIPES_LENGTH), nullable=False),
        sa.Column("layers", sa.Text(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("trained", sa.Text(), nullable=True),
        sa.Column("trained_data", sa.LargeBinary(), nullable=True),
        sa.ForeignKeyConstraint(["run_key"], ["runs.key"], name="fk_step_formats_run_key_runs",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["step_id"], ["steps.id"],
                                name="fk_step_formats_step_id_steps", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("step_id", name="pk_step_formats"),
    )
    op.create_index("ix_step_formats_run_key_step", "step_formats",
                    ["run_key", "step", "step_id"])
    if op.get_bind().dialect.name == "postgresql":
        # Not compressed (float64 mantissas do not compress), and read by slices: EXTERNAL lets
        # substr fetch only the TOAST chunks of the slice a trend asks for.
        op.execute("ALTER TABLE step_formats ALTER COLUMN data SET STORAGE EXTERNAL")


def downgrade() -> None:
    """Drops the table: the format what-ifs the hooks sent are lost (their steps stay)."""
    op.drop_index("ix_step_formats_run_key_step", table_name="step_formats")
    op.drop_table("step_formats")
