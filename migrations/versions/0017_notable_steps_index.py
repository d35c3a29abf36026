"""A partial index of the steps the findings read: `ix_steps_run_key_notable_step`.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03

The live findings (the run page, and the alert worker every 2 s for each active run) read a
run's notable steps: skipped or `found_inf`, scale changed, loss or grad norm non-finite. The
rows are O(events), but the database found them by filtering every step of the run: at 1M
steps a scan of a million rows per analysis, half a core of Postgres while one client ingested
(issue #11). After, an index on (run_key, step) of those steps. The condition is frozen here as
written in `models.STEP_IS_NOTABLE`, which the query repeats (SQLite uses a partial index only
for a query holding its condition as written). Nothing here imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IS_NOTABLE = ("skipped OR found_inf OR scale_before <> scale_after "
              "OR scale_before_class <> scale_after_class OR loss_class <> 0 "
              "OR grad_norm_class <> 0")


def upgrade() -> None:
    op.create_index("ix_steps_run_key_notable_step", "steps", ["run_key", "step"],
                    sqlite_where=sa.text(IS_NOTABLE), postgresql_where=sa.text(IS_NOTABLE))


def downgrade() -> None:
    op.drop_index("ix_steps_run_key_notable_step", table_name="steps")
