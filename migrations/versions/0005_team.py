"""Team mode: projects, API tokens, browser sessions, deleted-run tombstones.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

`projects` is backfilled with every project name the stored runs already use. No existing table
changes: a run keeps naming its project in `runs.project`.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_projects")),
    )
    op.execute(
        "INSERT INTO projects (name, created_at) "
        "SELECT project, MIN(created_at) FROM runs GROUP BY project"
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("project", sa.String(length=200), nullable=True),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("revoked_at", sa.Double(), nullable=True),
        sa.Column("last_used_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("secret_hash", name=op.f("uq_api_tokens_secret_hash")),
    )
    op.create_table(
        "browser_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.String(length=32), nullable=False),
        sa.Column("csrf", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["token_id"], ["api_tokens.id"], name=op.f("fk_browser_sessions_token_id_api_tokens"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_browser_sessions")),
    )
    op.create_table(
        "deleted_runs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("project", sa.String(length=200), nullable=False),
        sa.Column("deleted_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deleted_runs")),
    )


def downgrade() -> None:
    """Drops the four tables: every token, session and tombstone is lost (runs are kept)."""
    op.drop_table("deleted_runs")
    op.drop_table("browser_sessions")
    op.drop_table("api_tokens")
    op.drop_table("projects")
