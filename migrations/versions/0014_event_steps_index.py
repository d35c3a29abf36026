"""A partial index of the event steps: `ix_steps_run_key_event_step`.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03

The first page of `/events` (issue #11) asked for the first 1,000 steps of a run that were
skipped or changed its scale, in step order, and the database found them by scanning the run's
steps from its start: 330 ms at 1M steps. After, an index on (run_key, step) of those steps
only (about one in 500 at the hook's usual skip rate). The condition is frozen here as written
in `models.STEP_IS_EVENT`, which the query repeats (SQLite uses a partial index only for a
query holding its condition as written). Nothing here imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IS_EVENT = "skipped OR scale_before <> scale_after OR scale_before_class <> scale_after_class"


def upgrade() -> None:
    op.create_index("ix_steps_run_key_event_step", "steps", ["run_key", "step"],
                    sqlite_where=sa.text(IS_EVENT), postgresql_where=sa.text(IS_EVENT))


def downgrade() -> None:
    op.drop_index("ix_steps_run_key_event_step", table_name="steps")
