"""Repository support shared by every `*_repository` module: the dialect test, the dialect's
INSERT (which knows ON CONFLICT), the IN-list bound and a run's step range."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from ampscope_server.models import Base, Step

KEYS_PER_STATEMENT = 1000
"""The longest IN list one statement carries (SQLite's default limit is 32,766 variables)."""


def is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def table_of(model: type[Base]) -> Table:
    return Base.metadata.tables[model.__tablename__]


def dialect_insert(session: Session, model: type[Any]) -> Any:
    """The dialect's INSERT, which knows ON CONFLICT."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(model)
    return sqlite.insert(model)



def step_range(run_id: str, start: int | None, end: int | None) -> list[ColumnElement[bool]]:
    """The WHERE clauses of a run's steps in [start, end] (either bound optional)."""
    clauses: list[ColumnElement[bool]] = [Step.run_id == run_id]
    if start is not None:
        clauses.append(Step.step >= start)
    if end is not None:
        clauses.append(Step.step <= end)
    return clauses
