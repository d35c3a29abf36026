"""Wire v2: module table, non-finite layers, misuse, activation stats, histograms, accounting.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

New tables (children of `steps` cascade with their step, `modules` with its run):
`modules`, `step_nonfinite`, `misuse_events`, `activation_stats`, `histograms`.
New nullable columns: `steps.captured`, `steps.nonfinite_count`, `steps.misuse_count` (NULL =
not measured; the count tells `[]` from absent) and the client's accounting on `attempts`.

Columns are added with `recreate="never"`: SQLite's native ADD/DROP COLUMN, never a table copy.
A copy would drop and re-create `steps`, and with foreign keys on the DROP cascades to every
`layer_stats` row; it would also lose `steps`' AUTOINCREMENT. (SQLite ≥ 3.35 drops columns
natively; none of these is in an index or a constraint.)
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STEP_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
CLIENT_COLUMNS = ("produced", "acknowledged", "spooled", "dropped", "replayed")


def _step_child(table: str, *columns: sa.Column[object], key: Sequence[str]) -> None:
    op.create_table(
        table,
        sa.Column("step_id", STEP_ID, nullable=False),
        *columns,
        sa.ForeignKeyConstraint(
            ["step_id"], ["steps.id"], name=op.f(f"fk_{table}_step_id_steps"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("step_id", *key, name=op.f(f"pk_{table}")),
    )


def _classed(name: str) -> list[sa.Column[object]]:
    return [
        sa.Column(name, sa.Double(), nullable=True),
        sa.Column(f"{name}_class", sa.SmallInteger(), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "modules",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=500), nullable=False),
        sa.Column("module_type", sa.String(length=200), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_modules_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "index", name=op.f("pk_modules")),
    )
    _step_child(
        "step_nonfinite",
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("layer_index", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        key=["position"],
    )
    _step_child(
        "misuse_events",
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.String(length=1000), nullable=False),
        key=["position"],
    )
    _step_child(
        "activation_stats",
        sa.Column("module_index", sa.Integer(), nullable=False),
        *_classed("amax"),
        *_classed("amin_nz"),
        sa.Column("zero_frac", sa.Double(), nullable=False),
        sa.Column("subnormal_frac", sa.Double(), nullable=False),
        sa.Column("underflow_frac", sa.Double(), nullable=False),
        sa.Column("nan_count", sa.BigInteger(), nullable=False),
        sa.Column("inf_count", sa.BigInteger(), nullable=False),
        *_classed("l2"),
        key=["module_index"],
    )
    _step_child(
        "histograms",
        sa.Column("layer_index", sa.Integer(), nullable=False),
        sa.Column("min_exp", sa.Integer(), nullable=False),
        sa.Column("max_exp", sa.Integer(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False),
        key=["layer_index"],
    )
    with op.batch_alter_table("steps", recreate="never") as batch:
        batch.add_column(sa.Column("captured", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("nonfinite_count", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("misuse_count", sa.Integer(), nullable=True))
    with op.batch_alter_table("attempts", recreate="never") as batch:
        for name in CLIENT_COLUMNS:
            batch.add_column(sa.Column(f"client_{name}", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    """Drops every wire v2 table and column: the v2 data of all runs is lost (v1 data stays)."""
    with op.batch_alter_table("attempts", recreate="never") as batch:
        for name in reversed(CLIENT_COLUMNS):
            batch.drop_column(f"client_{name}")
    with op.batch_alter_table("steps", recreate="never") as batch:
        batch.drop_column("misuse_count")
        batch.drop_column("nonfinite_count")
        batch.drop_column("captured")
    op.drop_table("histograms")
    op.drop_table("activation_stats")
    op.drop_table("misuse_events")
    op.drop_table("step_nonfinite")
    op.drop_table("modules")
