"""Run counters: each run's summary kept at ingest, so the runs list never reads steps.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

One new table, `run_counters` (one row per run with steps, cascading with its run). The upgrade
backfills the counters from the stored steps in one aggregate statement (it reads every stored
step once). The cached summary block (`summary_*`, top finding, worst layers) is left empty, so
it reads as stale and the server computes it on first read: the analysis is application code,
which a migration never imports. Self-contained: plain SQL on tables this history created.
Downgrade drops the table (its content is derived from the steps: nothing is lost).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BACKFILL = """
INSERT INTO run_counters (
    run_id, version, num_steps, skipped_steps, nonfinite_steps, last_step, last_id,
    last_scale, last_scale_class, last_loss, last_loss_class, headroom_bits_class)
SELECT a.run_id, 1, a.num_steps, a.skipped_steps, a.nonfinite_steps, a.last_step, a.last_id,
       l.scale_after, l.scale_after_class, l.loss, l.loss_class, 0
FROM (
    SELECT run_id, COUNT(*) AS num_steps,
           SUM(CASE WHEN skipped THEN 1 ELSE 0 END) AS skipped_steps,
           SUM(CASE WHEN found_inf THEN 1 ELSE 0 END) AS nonfinite_steps,
           MAX(step) AS last_step, MAX(id) AS last_id
    FROM steps GROUP BY run_id
) AS a
JOIN steps AS l ON l.id = a.last_id
"""


def upgrade() -> None:
    op.create_table(
        "run_counters",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("num_steps", sa.BigInteger(), nullable=False),
        sa.Column("skipped_steps", sa.BigInteger(), nullable=False),
        sa.Column("nonfinite_steps", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=True),
        sa.Column("last_id", sa.BigInteger(), nullable=True),
        sa.Column("last_scale", sa.Double(), nullable=True),
        sa.Column("last_scale_class", sa.SmallInteger(), nullable=False),
        sa.Column("last_loss", sa.Double(), nullable=True),
        sa.Column("last_loss_class", sa.SmallInteger(), nullable=False),
        sa.Column("summary_version", sa.BigInteger(), nullable=True),
        sa.Column("summary_step", sa.BigInteger(), nullable=True),
        sa.Column("finding_kind", sa.String(length=64), nullable=True),
        sa.Column("finding_severity", sa.String(length=16), nullable=True),
        sa.Column("finding_title", sa.String(length=1000), nullable=True),
        sa.Column("underflow_layer", sa.String(length=500), nullable=True),
        sa.Column("underflow_frac", sa.Double(), nullable=True),
        sa.Column("headroom_layer", sa.String(length=500), nullable=True),
        sa.Column("headroom_bits", sa.Double(), nullable=True),
        sa.Column("headroom_bits_class", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_counters_run_id_runs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_run_counters")),
    )
    op.execute(_BACKFILL)


def downgrade() -> None:
    op.drop_table("run_counters")
