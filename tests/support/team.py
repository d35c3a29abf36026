"""A real `ampscope serve --auth required` with tokens made by the real CLI, for team-mode tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.databases import postgres_database, sqlite_url
from tests.support.servers import ServerProcess

# Tokens every team server gets: (label, project or None for all, scope).
TOKENS = (
    ("alpha-read", "alpha", "read"),
    ("alpha-ingest", "alpha", "ingest"),
    ("alpha-admin", "alpha", "admin"),
    ("beta-read", "beta", "read"),
    ("beta-ingest", "beta", "ingest"),
    ("root", None, "admin"),
)


def cli(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ampscope_server.cli", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def create_token(db_url: str, project: str | None, scope: str, name: str = "") -> str:
    where = ["--all-projects"] if project is None else ["--project", project]
    result = cli("token", "create", *where, "--scope", scope, "--name", name, "--db", db_url)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@dataclass
class Team:
    server: ServerProcess
    db_url: str
    log_dir: Path
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {} if token is None else {"Authorization": f"Bearer {self.tokens[token]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0)


@contextmanager
def team_server(database: str, log_dir: Path, env: Mapping[str, str] | None = None,
                args: tuple[str, ...] = ("--auth", "required")) -> Iterator[Team]:
    """Migrate a fresh database ("sqlite", "postgres", or the URL of an empty one), make
    `TOKENS` with the CLI, then serve it with auth."""

    @contextmanager
    def database_url() -> Iterator[str]:
        if database == "sqlite":
            yield sqlite_url(log_dir)
        elif database == "postgres":
            with postgres_database() as url:
                yield url
        else:
            yield database

    log_dir.mkdir(parents=True, exist_ok=True)
    with database_url() as url:
        result = cli("db", "upgrade", "--db", url)
        assert result.returncode == 0, result.stderr
        team = Team(ServerProcess(url, log_dir, args=args, env=env), url, log_dir)
        for label, project, scope in TOKENS:
            team.tokens[label] = create_token(url, project, scope, label)
        team.server.start()
        try:
            yield team
        finally:
            team.server.stop()
