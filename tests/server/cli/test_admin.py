"""`ampscope token …`, `ampscope runs …` and `serve`'s auth flags: the commands through `cli.main`
in this process, the secret's stream and `serve` as real processes."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from ampscope_server.store import db
from tests.server.wire import batch, new_id, record
from tests.support.app import app_client
from tests.support.cli import cli, in_process
from tests.support.ingest import post_batch
from tests.support.servers import free_port

pytestmark = pytest.mark.slow

SECRET = re.compile(r"^amps_[A-Za-z0-9_-]{43}$")


class TestToken:
    def test_create_prints_the_secret_alone_once(self, migrated_url: str) -> None:
        result = cli("token", "create", "--project", "vision", "--scope", "ingest",
                     "--name", "ci job", "--db", migrated_url)
        assert result.returncode == 0, result.stderr
        assert SECRET.match(result.stdout.removesuffix("\n"))
        assert result.stdout.count("\n") == 1
        assert re.fullmatch(r"ampscope: token [0-9a-f]{12} \(ingest, project vision\) created; "
                            r"its secret is shown once, below\n", result.stderr)
        listed = cli("token", "list", "--db", migrated_url)
        assert listed.returncode == 0
        assert result.stdout.strip() not in listed.stdout + listed.stderr
        header, row = listed.stdout.splitlines()
        assert header.split() == ["ID", "NAME", "PROJECT", "SCOPE", "CREATED", "LAST", "USED",
                                  "REVOKED"]
        assert row.split()[1:5] == ["ci", "job", "vision", "ingest"] and row.endswith("-")

    def test_all_projects_and_the_choices(self, migrated_url: str) -> None:
        result = in_process("token", "create", "--all-projects", "--scope", "admin",
                            "--db", migrated_url)
        assert result.returncode == 0
        assert "(admin, every project)" in result.stderr
        both = in_process("token", "create", "--all-projects", "--project", "p", "--scope", "read",
                   "--db", migrated_url)
        assert both.returncode == 2 and "not allowed with argument" in both.stderr
        scope = in_process("token", "create", "--project", "p", "--scope", "write",
                           "--db", migrated_url)
        assert scope.returncode == 2 and "invalid choice: 'write'" in scope.stderr
        name = in_process("token", "create", "--project", "a b", "--scope", "read",
                          "--db", migrated_url)
        assert name.returncode == 2
        assert name.stderr.startswith("ampscope token create: project name 'a b' is not valid")

    def test_revoke(self, migrated_url: str) -> None:
        in_process("token", "create", "--project", "p", "--scope", "read", "--name", "old",
            "--db", migrated_url)
        listed = in_process("token", "list", "--db", migrated_url).stdout
        token_id = listed.splitlines()[1].split()[0]
        revoked = in_process("token", "revoke", token_id, "--db", migrated_url)
        assert revoked.returncode == 0 and revoked.stderr == f"ampscope: token {token_id} revoked\n"
        row = in_process("token", "list", "--db", migrated_url).stdout.splitlines()[1]
        assert not row.endswith(" -")
        unknown = in_process("token", "revoke", "ffffffffffff", "--db", migrated_url)
        assert unknown.returncode == 2
        assert unknown.stderr == "ampscope token revoke: token 'ffffffffffff' not found\n"

    def test_an_unmigrated_database(self, tmp_path: Path) -> None:
        (tmp_path / "empty.db").touch()
        url = f"sqlite:///{tmp_path / 'empty.db'}"
        result = in_process("token", "list", "--db", url)
        assert result.returncode == 2
        assert "has no ampscope schema" in result.stderr and "ampscope db upgrade" in result.stderr


class TestRuns:
    def test_delete_and_prune(self, migrated_url: str) -> None:
        """The commands on a database the app (in process) serves meanwhile."""
        old, new = new_id(), new_id()
        with app_client(migrated_url) as api:
            for run_id in (old, new, new_id()):
                post_batch(api, batch([record(0), record(1)], run_id=run_id, project="p"))
            _age_runs(migrated_url, 7200.0)  # every run's last ingest two hours ago...
            post_batch(api, batch(  # ...but `new` sends again
                [record(2)], run_id=new, project="p", layers=None))
            dry = in_process("runs", "prune", "--project", "p", "--older-than", "1h", "--dry-run",
                      "--db", migrated_url)
            assert dry.returncode == 0
            assert dry.stderr == "ampscope: 2 runs would be deleted (dry run)\n"
            assert old in dry.stdout and new not in dry.stdout
            assert len(api.get("/api/runs").json()) == 3
            pruned = in_process("runs", "prune", "--project", "p", "--older-than", "1h",
                         "--db", migrated_url)
            assert pruned.returncode == 0, pruned.stderr
            assert pruned.stderr == "ampscope: 2 runs of project p deleted\n"
            assert [run["id"] for run in api.get("/api/runs").json()] == [new]
            deleted = in_process("runs", "delete", new, "--db", migrated_url)
            assert deleted.returncode == 0
            assert deleted.stderr == f"ampscope: run {new} (project p, 3 steps) deleted\n"
            assert api.get("/api/runs").json() == []
            post_batch(api, batch([record(3)], run_id=new, project="p"), status=410)
        again = in_process("runs", "delete", new, "--db", migrated_url)
        assert again.returncode == 2 and again.stderr == (
            f"ampscope runs delete: run '{new}' not found\n")
        bad = in_process("runs", "prune", "--project", "p", "--older-than", "30 days",
                  "--db", migrated_url)
        assert bad.returncode == 2 and bad.stderr == (
            "ampscope runs prune: age '30 days' is not a whole number followed by d, h, m or s "
            "(e.g. 30d)\n")


def _age_runs(url: str, seconds: float) -> None:
    engine = db.make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE runs SET updated_at = updated_at - :s"),
                               {"s": seconds})
    finally:
        engine.dispose()


def _serve(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    return subprocess.Popen([sys.executable, "-m", "ampscope_server.cli", "serve", "--db", url,
                             "--port", str(free_port()), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class TestServeAuthFlags:
    def test_contradictory_flags(self, tmp_path: Path) -> None:
        proc = _serve(tmp_path, "--auth", "required", "--insecure-no-auth")
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2
        assert err == ("ampscope serve: --auth required and --insecure-no-auth contradict each "
                       "other\n")

    def test_beyond_loopback_auth_is_on_unless_waived_loudly(self, tmp_path: Path) -> None:
        port = free_port()
        url = f"sqlite:///{tmp_path / 'b.db'}"
        base = [sys.executable, "-m", "ampscope_server.cli", "serve", "--db", url,
                "--host", "0.0.0.0", "--port", str(port)]
        for extra, expected in (([], 401), (["--insecure-no-auth"], 200)):
            proc = subprocess.Popen(base + extra, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            try:
                status = _status_when_up(f"http://127.0.0.1:{port}/api/runs")
            finally:
                proc.terminate()
                _, err = proc.communicate(timeout=30)
            assert status == expected, err
            warned = "WARNING: serving 0.0.0.0" in err and "NO access control" in err
            assert warned == bool(extra)


def _status_when_up(url: str, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return httpx.get(url, timeout=1.0).status_code
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"{url} never answered")
