"""The block scales' exponents of the formats probe (issue #33): `step_formats.scales`.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07

Wire v8 `records[].formats.scales`: per layer, operand and recipe, the greatest exponent of the
blocks' scales and their counts by binades below it (`format_packing.SCALE_WIDTH` float64
values), little-endian as sent, like `data`. Added in place, nullable: samples stored before it,
and clients before v8, have none. Nothing here imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("step_formats", recreate="never") as batch:
        batch.add_column(sa.Column("scales", sa.LargeBinary(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        # As `data` (0025): uncompressed, so that a trend's substr reads only its slice's chunks.
        op.execute("ALTER TABLE step_formats ALTER COLUMN scales SET STORAGE EXTERNAL")


def downgrade() -> None:
    """Drops the column: the exponents the hooks sent are lost (the samples stay)."""
    with op.batch_alter_table("step_formats", recreate="never") as batch:
        batch.drop_column("scales")
