"""Raw layer names: `layers.raw_name`, the parameter's name with its wrappers' components.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04

The hook now sends each layer's canonical name as `name` (wrapper components such as `module.`
or `_orig_mod.` removed, so wrapped and plain runs of one model compare layer for layer) and the
name the model gave as `raw_name` (issue #13). Before, clients sent the raw name as `name`, so
every stored row is backfilled with `raw_name = name`: what those clients would have sent. The
column stays nullable so that it is added in place (SQLite's native ADD COLUMN, `recreate=
"never"`, never a copy of the table, as revision 0002 explains); ingest always writes it.
Nothing here imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("layers", recreate="never") as batch:
        batch.add_column(sa.Column("raw_name", sa.String(length=500), nullable=True))
    op.execute("UPDATE layers SET raw_name = name")


def downgrade() -> None:
    """Drops the column: the raw names of runs whose client sent them are lost (`name` keeps
    the canonical names those clients sent)."""
    with op.batch_alter_table("layers", recreate="never") as batch:
        batch.drop_column("raw_name")
