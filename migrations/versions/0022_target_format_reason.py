"""Why a run's target format (issue #30): `runs.target_format_reason`.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-09

The hook infers the format it judges gradients against from the model (FP16/BF16 parameters,
a loss scale) and says why; the run header shows it. Added in place (SQLite's native ADD
COLUMN, `recreate="never"`: every table points at `runs`, revision 0010 explains why it is not
rebuilt), nullable: runs stored before it, and clients before it, have no reason. Nothing here
imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.add_column(sa.Column("target_format_reason", sa.String(200), nullable=True))


def downgrade() -> None:
    """Drops the column: the reasons the hooks sent are lost (the formats stay)."""
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.drop_column("target_format_reason")
