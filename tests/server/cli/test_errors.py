"""The CLI's one-line errors and the ways it names a run (`cli.main` in this process; `serve` as
a real process)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.server.wire import batch, new_id, record
from tests.support.cli import cli, in_process
from tests.support.databases import migrated_sqlite
from tests.support.ingest import ingest_into

pytestmark = pytest.mark.slow


class TestDatabaseErrors:
    def test_an_unusable_url(self) -> None:
        for url in ("foo://bar", "not a url"):
            result = in_process("report", "x", "--db", url)
            assert result.returncode == 2
            assert result.stderr.startswith(f"ampscope: the database URL {url!r} is not one "
                                            "SQLAlchemy can use")
            assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1

    def test_an_unreachable_postgres(self) -> None:
        url = "postgresql+psycopg://postgres@127.0.0.1:1/nothing"
        for command in (["report", "x"], ["token", "list"], ["db", "upgrade"]):
            result = in_process(*command, "--db", url)
            assert result.returncode == 2, result.stderr
            assert result.stderr.startswith(
                "ampscope: cannot reach the database postgresql+psycopg://postgres@127.0.0.1:1/"
                "nothing: ")
            assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1

    def test_a_read_only_command_creates_nothing(self, tmp_path: Path) -> None:
        missing = tmp_path / "missing" / "dir" / "x.db"
        for command in (["report", "x"], ["token", "list"], ["runs", "delete", "x"]):
            result = in_process(*command, "--db", f"sqlite:///{missing}")
            assert result.returncode == 2
            assert result.stderr.endswith(
                f"no SQLite database at {missing} (`ampscope serve` or `ampscope db upgrade` "
                "creates one)\n")
        assert not (tmp_path / "missing").exists()

    @pytest.mark.parametrize("port", ["99999", "0", "http"])
    def test_serve_validates_the_port(self, port: str) -> None:
        result = cli("serve", "--port", port)
        assert result.returncode == 2
        assert "argument --port:" in result.stderr and "Traceback" not in result.stderr


def test_a_run_is_named_by_id_short_id_or_name(tmp_path: Path) -> None:
    url = migrated_sqlite(tmp_path)
    first, second, third = new_id(), new_id(), new_id()
    ingest_into(url, *(batch([record(0)], run_id=run_id, name=name)
                       for run_id, name in ((first, "alpha"), (second, "twin"), (third, "twin"))))
    for named in (first, first[:8], "alpha"):
        result = in_process("report", named, "--db", url)
        assert result.returncode == 0, result.stderr
    ambiguous = in_process("report", "twin", "--db", url)
    assert ambiguous.returncode == 2
    assert ambiguous.stderr == (
        "ampscope report: more than one run has the name 'twin'; give more of its id\n")
    short = in_process("report", first[:7], "--db", url)  # under 8 characters: not a prefix
    assert short.returncode == 2
    assert short.stderr == f"ampscope report: run '{first[:7]}' not found\n"
    deleted = in_process("runs", "delete", second[:8], "--db", url)
    assert deleted.returncode == 0
    assert deleted.stderr.startswith(f"ampscope: run {second} ")


def test_serve_on_a_port_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    """It printed six lines of uvicorn log and traceback (#31)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = cli("serve", "--host", "127.0.0.1", "--port", str(port),
                     "--db", f"sqlite:///{tmp_path / 'runs.db'}")
    assert result.returncode == 2
    assert result.stderr == (
        f"ampscope serve: cannot listen on 127.0.0.1:{port}: Address already in use (another "
        "server there? stop it, or pass --port N)\n")
    assert not (tmp_path / "runs.db").exists()  # nothing started
