"""Alerts: rules and destinations per project, episodes, the alert history and its outbox.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

New tables only; nothing stored before changes. A project gets its default rules from the
server the first time it evaluates the project (`alert_defaults` remembers that it did).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "alert_defaults",
        sa.Column("project", sa.String(length=200), nullable=False),
        sa.Column("seeded_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["project"],
            ["projects.name"],
            name=op.f("fk_alert_defaults_project_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("project", name=op.f("pk_alert_defaults")),
    )
    op.create_table(
        "alert_destinations",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("project", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("url", sa.String(length=2000), nullable=False),
        sa.Column("signing_secret", sa.String(length=128), nullable=True),
        sa.Column("min_severity", sa.String(length=8), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["project"],
            ["projects.name"],
            name=op.f("fk_alert_destinations_project_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_destinations")),
    )
    op.create_table(
        "alert_rules",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("project", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("severity", sa.String(length=8), nullable=False),
        sa.Column("cooldown_s", sa.Double(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("builtin", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["project"],
            ["projects.name"],
            name=op.f("fk_alert_rules_project_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_rules")),
    )
    op.create_table(
        "alert_episodes",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("rule_id", sa.String(length=32), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=300), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("opened_at", sa.Double(), nullable=False),
        sa.Column("closed_at", sa.Double(), nullable=True),
        sa.Column("alerted", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["rule_id"],
            ["alert_rules.id"],
            name=op.f("fk_alert_episodes_rule_id_alert_rules"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_alert_episodes_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_episodes")),
        sa.UniqueConstraint(
            "rule_id",
            "run_id",
            "key",
            "ordinal",
            name=op.f("uq_alert_episodes_rule_id_run_id_key_ordinal"),
        ),
    )
    op.create_table(
        "alerts",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("dedup_key", sa.String(length=400), nullable=False),
        sa.Column("rule_id", sa.String(length=32), nullable=True),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("project", sa.String(length=200), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("severity", sa.String(length=8), nullable=False),
        sa.Column("title", sa.String(length=500), nullable=False),
        sa.Column("explanation", sa.String(length=4000), nullable=False),
        sa.Column("recommendation", sa.String(length=4000), nullable=False),
        sa.Column("step_start", sa.BigInteger(), nullable=True),
        sa.Column("step_end", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["rule_id"],
            ["alert_rules.id"],
            name=op.f("fk_alerts_rule_id_alert_rules"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_alerts_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
        sa.UniqueConstraint("dedup_key", name=op.f("uq_alerts_dedup_key")),
    )
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.create_index("ix_alerts_project_id", ["project", "id"], unique=False)
        batch_op.create_index("ix_alerts_rule_id_run_id", ["rule_id", "run_id"], unique=False)
        batch_op.create_index("ix_alerts_run_id_id", ["run_id", "id"], unique=False)

    op.create_table(
        "alert_deliveries",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("alert_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("destination_id", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Double(), nullable=False),
        sa.Column("last_error", sa.String(length=500), nullable=True),
        sa.Column("delivered_at", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["alert_id"],
            ["alerts.id"],
            name=op.f("fk_alert_deliveries_alert_id_alerts"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["destination_id"],
            ["alert_destinations.id"],
            name=op.f("fk_alert_deliveries_destination_id_alert_destinations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_deliveries")),
        sa.UniqueConstraint(
            "alert_id", "destination_id", name=op.f("uq_alert_deliveries_alert_id_destination_id")
        ),
    )
    with op.batch_alter_table("alert_deliveries", schema=None) as batch_op:
        batch_op.create_index(
            "ix_alert_deliveries_status_next_attempt_at",
            ["status", "next_attempt_at"],
            unique=False,
        )


def downgrade() -> None:
    """Drops the alert tables: rules, destinations and the alert history are lost."""
    with op.batch_alter_table("alert_deliveries", schema=None) as batch_op:
        batch_op.drop_index("ix_alert_deliveries_status_next_attempt_at")

    op.drop_table("alert_deliveries")
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_index("ix_alerts_run_id_id")
        batch_op.drop_index("ix_alerts_rule_id_run_id")
        batch_op.drop_index("ix_alerts_project_id")

    op.drop_table("alerts")
    op.drop_table("alert_episodes")
    op.drop_table("alert_rules")
    op.drop_table("alert_destinations")
    op.drop_table("alert_defaults")
