"""Bulk inserts on Postgres: a batch's rows in one statement, not one per row.

SQLAlchemy's executemany on psycopg either sends a statement per row (pipelined) or renders one
INSERT with a VALUES tuple per row, whose text psycopg then parses in Python (`_split_query`:
docs/storage.md#postgres-statements-arrays-copy-no-jit). Two ways instead:

- `insert` (ON CONFLICT, RETURNING): every column travels as one array parameter of a statement
  whose text depends only on the table and the columns, so psycopg adapts the arrays in C:
  `INSERT INTO t (a, b) SELECT * FROM unnest(%s::T[], %s::U[])`. Not for blobs: Postgres
  unnests a bytea[] of a batch's packed statistics slowly.
- `copy` (plain inserts of new rows, blobs included): `COPY … FROM STDIN (FORMAT BINARY)`,
  about twice as fast as executemany for a batch of 50 packed layer-stat rows.

Only for tables whose columns map to Postgres types one to one (numbers, text, booleans,
bytea): JSON columns (histograms, re-checks) keep the ORM executemany.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import JSON, Table
from sqlalchemy.orm import Session


def supported(table: Table, names: Sequence[str]) -> bool:
    """Whether rows of these columns can go through `copy`."""
    return not any(isinstance(table.c[name].type, JSON) for name in names)


def _type_name(session: Session, table: Table, name: str) -> str:
    """The column's Postgres type as psycopg's registry names it ("varchar", "bigint", …)."""
    compiled = table.c[name].type.compile(dialect=session.get_bind().dialect)
    return compiled.split("(")[0].strip().lower()


def copy(session: Session, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    """COPY `rows` (all with the same keys, none already stored) into `table`, binary."""
    if not rows:
        return
    names = list(rows[0])
    quote = session.get_bind().dialect.identifier_preparer.quote
    raw = session.connection().connection.driver_connection
    assert raw is not None
    with raw.cursor() as cursor, cursor.copy(
        f"COPY {quote(table.name)} ({', '.join(map(quote, names))}) FROM STDIN (FORMAT BINARY)"
    ) as out:
        out.set_types([_type_name(session, table, name) for name in names])
        for row in rows:
            out.write_row([row[name] for name in names])


def _sql(session: Session, table: Table, names: Sequence[str]) -> tuple[str, str]:
    """(quoted column list, the unnest(...) select of one array per column)."""
    dialect = session.get_bind().dialect
    quote = dialect.identifier_preparer.quote
    arrays = ", ".join(f"%s::{table.c[name].type.compile(dialect=dialect)}[]" for name in names)
    return ", ".join(map(quote, names)), f"SELECT * FROM unnest({arrays})"


def _columns(rows: Sequence[dict[str, Any]], names: Sequence[str]) -> tuple[list[Any], ...]:
    return tuple([row[name] for row in rows] for name in names)


def insert(session: Session, table: Table, rows: Sequence[dict[str, Any]], *,
           conflict: Sequence[str] = (), update: Sequence[str] = (),
           returning: Sequence[str] = ()) -> list[tuple[Any, ...]]:
    """Insert `rows` (all with the same keys) in one statement. With `conflict` columns: ON
    CONFLICT DO NOTHING, or DO UPDATE SET the `update` columns to the new values. Returns the
    `returning` columns of the rows written."""
    if not rows:
        return []
    names = list(rows[0])
    quote = session.get_bind().dialect.identifier_preparer.quote
    columns, select = _sql(session, table, names)
    sql = f"INSERT INTO {quote(table.name)} ({columns}) {select}"
    if conflict:
        target = ", ".join(map(quote, conflict))
        if update:
            sets = ", ".join(f"{quote(name)} = EXCLUDED.{quote(name)}" for name in update)
            sql += f" ON CONFLICT ({target}) DO UPDATE SET {sets}"
        else:
            sql += f" ON CONFLICT ({target}) DO NOTHING"
    if returning:
        sql += f" RETURNING {', '.join(map(quote, returning))}"
    result = session.connection().exec_driver_sql(sql, _columns(rows, names))
    return [tuple(row) for row in result] if returning else []
