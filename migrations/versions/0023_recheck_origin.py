"""Where a forward overflow began (issue #30): `step_rechecks.origin`.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-09

The hook's FP32 re-check names the first module in forward order whose output overflowed
(wire v5 `recheck.origin`, `{"module", "input_finite", "format"}`), kept as one JSON value
like the row's `layers`: always read whole with its step, never queried by module. Added in
place, nullable: re-checks stored before it, and clients before it, have no origin. Nothing
here imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("step_rechecks", recreate="never") as batch:
        batch.add_column(sa.Column("origin", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drops the column: the origins the hooks sent are lost (the re-checks stay)."""
    with op.batch_alter_table("step_rechecks", recreate="never") as batch:
        batch.drop_column("origin")
