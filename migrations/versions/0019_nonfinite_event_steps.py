"""The event steps' partial index holds the non-finite steps too: `ix_steps_run_key_event_step`.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04

Without a GradScaler (BF16 or FP32 training, issue #13) a step whose gradients held NaN or ±inf
is not skipped: the optimizer applies it. `/events` lists such steps (`nonfinite`), so the
event steps are now "skipped OR found_inf OR the scale changed" (with a scaler a `found_inf`
step is a skipped one: nothing changes for those runs). The index of revision 0014 is rebuilt
with that condition, frozen here as written in `models.STEP_IS_EVENT`, which the query repeats
(SQLite uses a partial index only for a query holding its condition as written). Nothing here
imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_steps_run_key_event_step"
IS_EVENT = ("skipped OR found_inf OR scale_before <> scale_after "
            "OR scale_before_class <> scale_after_class")
WAS_EVENT = "skipped OR scale_before <> scale_after OR scale_before_class <> scale_after_class"


def _rebuild(condition: str) -> None:
    op.drop_index(INDEX, table_name="steps")
    op.create_index(INDEX, "steps", ["run_key", "step"],
                    sqlite_where=sa.text(condition), postgresql_where=sa.text(condition))


def upgrade() -> None:
    _rebuild(IS_EVENT)


def downgrade() -> None:
    _rebuild(WAS_EVENT)
