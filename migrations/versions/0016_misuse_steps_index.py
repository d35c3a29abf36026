"""A partial index of the steps that reported misuse: `ix_steps_run_key_misuse_step`.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03

An events page reads the misuse events of its step range (issue #11). The database found them
by joining every step of the range to `misuse_events`: ~500,000 steps for the first page of a
1M-step run, which had none (120 ms on SQLite). After, an index on (run_key, step) of the steps
with a misuse count (wire v2; rare: a training loop's bug). The condition is frozen here as
written in `models.STEP_HAS_MISUSE`, which the query repeats (SQLite uses a partial index only
for a query holding its condition as written). Nothing here imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

HAS_MISUSE = "misuse_count > 0"


def upgrade() -> None:
    op.create_index("ix_steps_run_key_misuse_step", "steps", ["run_key", "step"],
                    sqlite_where=sa.text(HAS_MISUSE), postgresql_where=sa.text(HAS_MISUSE))


def downgrade() -> None:
    op.drop_index("ix_steps_run_key_misuse_step", table_name="steps")
