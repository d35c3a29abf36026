"""Run notes (issue #31): `runs.notes`, free text a person writes on the run page.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05

A run's notes (and its tags, already stored) become editable through PATCH /api/runs/{id}.
Added in place (SQLite's native ADD COLUMN, `recreate="never"`: every table points at `runs`,
revision 0010 explains why it is not rebuilt), NOT NULL with a server default of the empty
text, which fills the existing rows. Nothing here imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.add_column(sa.Column("notes", sa.Text(), server_default=sa.text("''"),
                                   nullable=False))


def downgrade() -> None:
    """Drops the column: the notes written on runs are lost."""
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.drop_column("notes")
