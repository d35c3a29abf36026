"""`ampscope db upgrade` and `ampscope serve`'s schema check, as real processes."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect

from ampscope_server.cli import main as cli
from ampscope_server.config import DEFAULT_DB_URL, Settings
from ampscope_server.errors import SchemaNotCurrent
from ampscope_server.store import db
from ampscope_server.store.models import Base
from tests.support.servers import free_port

pytestmark = pytest.mark.slow


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ampscope_server.cli", *args],
                          capture_output=True, text=True, timeout=60, cwd=cwd)


def test_db_upgrade_creates_the_schema(db_url: str) -> None:
    result = _cli("db", "upgrade", "--db", db_url)
    assert result.returncode == 0, result.stderr
    head = db.head_revision()
    assert head is not None and head >= "0004"
    assert result.stderr.endswith(f"{db.safe_url(db_url)} is at revision {head}\n")
    engine = db.make_engine(db_url)
    try:
        # Every table of the models (tests/migrations checks the columns match).
        assert set(inspect(engine).get_table_names()) == {"alembic_version",
                                                          *Base.metadata.tables}
        db.verify_schema(engine)
    finally:
        engine.dispose()


def test_serve_refuses_an_unmigrated_postgres(postgres_url: str) -> None:
    result = _cli("serve", "--port", str(free_port()), "--db", postgres_url)
    assert result.returncode == 2
    assert result.stderr == (
        f"ampscope: the database {postgres_url} has no ampscope schema, but this server needs "
        f"revision {db.head_revision()}; run `ampscope db upgrade --db {postgres_url}`\n")


def test_verify_schema_message(postgres_url: str) -> None:
    engine = db.make_engine(postgres_url)
    try:
        with pytest.raises(SchemaNotCurrent) as info:
            db.verify_schema(engine)
    finally:
        engine.dispose()
    assert info.value.status_code == 503
    assert "run `ampscope db upgrade --db " in info.value.message


def test_default_sqlite_folder_is_created(tmp_path: Path) -> None:
    result = _cli("db", "upgrade", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / ".ampscope" / "ampscope.db").is_file()


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPSCOPE_DB_URL", "sqlite:///x.db")
    monkeypatch.setenv("AMPSCOPE_CRASH_TIMEOUT_S", "12.5")
    settings = Settings()
    assert (settings.db_url, settings.crash_timeout_s, settings.host, settings.port) == (
        "sqlite:///x.db", 12.5, "127.0.0.1", 8765)
    monkeypatch.delenv("AMPSCOPE_DB_URL")
    assert Settings().db_url == DEFAULT_DB_URL == "sqlite:///./.ampscope/ampscope.db"


def test_sqlite_pragmas(tmp_path: Path) -> None:
    engine = db.make_engine(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
    finally:
        engine.dispose()


def _every_parser(parser: argparse.ArgumentParser, path: str = "ampscope"
                  ) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _every_parser(sub, f"{path} {name}")
    return found


def test_every_option_says_what_it_does() -> None:
    """`ampscope … --help` explains every option and argument (#31: `--project`,
    `--threshold`, `--severity`, … had none), and `--db` names its default."""
    parsers = _every_parser(cli._parser())
    silent = [f"{path} {action.dest}" for path, parser in parsers for action in parser._actions
              if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
              and not action.help]
    assert silent == []
    db_helps = {action.help for _, parser in parsers for action in parser._actions
                if "--db" in action.option_strings}
    assert db_helps == {
        f"SQLAlchemy database URL (default: $AMPSCOPE_DB_URL, else {DEFAULT_DB_URL})"}
    assert len(parsers) > 15  # every command of every group was walked
