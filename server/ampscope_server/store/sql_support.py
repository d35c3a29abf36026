"""Repository support shared by every `*_repository` module: the dialect test, the dialect's
INSERT (which knows ON CONFLICT), the IN-list bound and an IN over ids, a run's integer key and
its step range."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, ScalarSelect, Table, any_, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import InstrumentedAttribute, Session

from ampscope_server.store.models import Base, Run, Step

KEYS_PER_STATEMENT = 1000
"""The longest IN list one statement carries (SQLite's default limit is 32,766 variables)."""


def is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def in_ids(session: Session, column: ColumnElement[int] | InstrumentedAttribute[int],
           ids: Sequence[int]) -> ColumnElement[bool]:
    """`column IN (ids)`, at most KEYS_PER_STATEMENT of them. On Postgres one array parameter
    (`= ANY(%s)`): an IN list is one placeholder per id, whose statement text psycopg parses in
    Python (docs/storage.md#postgres-statements-arrays-copy-no-jit); an array is adapted in C."""
    if is_postgres(session):
        return column == any_(bindparam(None, list(ids), type_=postgresql.ARRAY(BigInteger)))
    return column.in_(list(ids))


def table_of(model: type[Base]) -> Table:
    return Base.metadata.tables[model.__tablename__]


def dialect_insert(session: Session, model: type[Any] | Table) -> Any:
    """The dialect's INSERT, which knows ON CONFLICT."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(model)
    return sqlite.insert(model)


def run_key(run_id: str) -> ScalarSelect[int]:
    """The run's `runs.key` as an uncorrelated scalar subquery: both dialects evaluate it once
    per statement (an InitPlan on Postgres, a constant on SQLite) and then probe the integer
    indexes of `steps` and `layer_stats` with it, so a read that is given the public id needs
    no extra round trip."""
    return select(Run.key).where(Run.id == run_id).scalar_subquery()


def step_range(run_id: str, start: int | None, end: int | None) -> list[ColumnElement[bool]]:
    """The WHERE clauses of a run's steps in [start, end] (either bound optional)."""
    clauses: list[ColumnElement[bool]] = [Step.run_key == run_key(run_id)]
    if start is not None:
        clauses.append(Step.step >= start)
    if end is not None:
        clauses.append(Step.step <= end)
    return clauses
