"""Every SQL statement of team mode: projects, API tokens, browser sessions, run deletion.

Functions take a Session and never commit (the caller's unit of work does).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from ampscope_server.store.models import ApiToken, BrowserSession, DeletedRun, Project, Run
from ampscope_server.store.sql_support import dialect_insert

# --- projects ------------------------------------------------------------------------------------


def ensure_project(session: Session, name: str, now: float) -> None:
    session.execute(
        dialect_insert(session, Project).values(name=name, created_at=now)
        .on_conflict_do_nothing(index_elements=[Project.name])
    )


def project_exists(session: Session, name: str) -> bool:
    return session.get(Project, name) is not None


# --- tokens --------------------------------------------------------------------------------------


def insert_token(session: Session, token: ApiToken) -> None:
    session.add(token)
    session.flush()


def token_by_hash(session: Session, secret_hash: str) -> ApiToken | None:
    return session.scalars(select(ApiToken).where(ApiToken.secret_hash == secret_hash)).first()


def get_token(session: Session, token_id: str) -> ApiToken | None:
    return session.get(ApiToken, token_id)


def list_tokens(session: Session) -> Sequence[ApiToken]:
    return session.scalars(select(ApiToken).order_by(ApiToken.created_at, ApiToken.id)).all()


def revoke_token(session: Session, token_id: str, now: float) -> None:
    session.execute(update(ApiToken).where(ApiToken.id == token_id).values(revoked_at=now))
    session.execute(delete(BrowserSession).where(BrowserSession.token_id == token_id))


def mark_token_used(session: Session, token_id: str, now: float) -> None:
    session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=now))


# --- browser sessions ----------------------------------------------------------------------------


def insert_session(session: Session, row: BrowserSession) -> None:
    session.add(row)
    session.flush()


def session_with_token(
    session: Session, session_hash: str, now: float
) -> tuple[BrowserSession, ApiToken] | None:
    """The unexpired session and its token, when the token is not revoked."""
    row = session.execute(
        select(BrowserSession, ApiToken)
        .join(ApiToken, ApiToken.id == BrowserSession.token_id)
        .where(BrowserSession.id == session_hash, BrowserSession.expires_at > now,
               ApiToken.revoked_at.is_(None))
    ).first()
    return None if row is None else (row[0], row[1])


def delete_session(session: Session, session_hash: str) -> None:
    session.execute(delete(BrowserSession).where(BrowserSession.id == session_hash))


def delete_expired_sessions(session: Session, now: float) -> None:
    session.execute(delete(BrowserSession).where(BrowserSession.expires_at <= now))


# --- run deletion --------------------------------------------------------------------------------


def tombstone(session: Session, run_id: str) -> DeletedRun | None:
    return session.get(DeletedRun, run_id)


def delete_run(session: Session, run: Run, now: float) -> None:
    """Delete the run (its attempts, steps and every child cascade) and leave a tombstone."""
    session.execute(
        dialect_insert(session, DeletedRun).values(id=run.id, project=run.project, deleted_at=now)
        .on_conflict_do_nothing(index_elements=[DeletedRun.id])
    )
    session.execute(delete(Run).where(Run.id == run.id))


def runs_older_than(session: Session, project: str, before: float) -> Sequence[Run]:
    """The project's runs whose last ingest is older than `before` (unix seconds)."""
    return session.scalars(
        select(Run).where(Run.project == project, Run.updated_at < before)
        .order_by(Run.updated_at, Run.id)
    ).all()
