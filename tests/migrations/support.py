"""What the migration tests share: reading a database's rows with plain SQL and its tables
(`tests.support.ingest.ingest_into` writes a wire batch through the server's own code)."""

from __future__ import annotations

import struct
from typing import Any

from sqlalchemy import inspect, text

from ampscope_server.store import db, stat_packing


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Every row of `sql` on the database at `url`, blobs as bytes (Postgres hands memoryviews)."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                    for row in connection.execute(text(sql))]
    finally:
        engine.dispose()


def delete_run(url: str, run_id: str) -> None:
    """Delete one run by its public id, as a user would (its rows go by the key's cascade)."""
    engine = db.make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM runs WHERE id = :id"), {"id": run_id})
    finally:
        engine.dispose()


def decoded(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows whose last column is a packed array, that column as its values (floats by their
    bits, so NaN equals NaN): equal whatever the layout version of the blobs."""
    return [(*row[:-1], [[struct.pack("<d", v) if isinstance(v, float) else v for v in column]
                         for column in stat_packing.unpack(row[-1])]) for row in rows]


def tables(url: str) -> set[str]:
    """The names of the tables of the database at `url`."""
    engine = db.make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def columns(url: str, table: str) -> set[str]:
    """The names of the columns of `table` in the database at `url`."""
    engine = db.make_engine(url)
    try:
        return {column["name"] for column in inspect(engine).get_columns(table)}
    finally:
        engine.dispose()
