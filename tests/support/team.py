"""A real `ampscope serve --auth required` with `TOKENS` in its database, for team-mode tests."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast, get_args

import httpx

from ampscope_server.access import tokens
from ampscope_server.access.principal import Scope
from ampscope_server.store import db
from tests.support.databases import Dialect, migrated_database
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


def make_tokens(db_url: str,
                specs: tuple[tuple[str, str | None, str], ...] = TOKENS) -> dict[str, str]:
    """`TOKENS` (or `specs`: label, project, scope) made in this process, through the service
    the CLI calls (`test_cli_admin` runs the command itself): six interpreter boots fewer per
    team server."""
    engine = db.make_engine(db_url)
    try:
        with db.unit_of_work(db.make_session_factory(engine)) as session:
            return {label: tokens.create_token(session, Scope(scope), project, label).secret
                    for label, project, scope in specs}
    finally:
        engine.dispose()


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
    """A fresh migrated database ("sqlite", "postgres", or the URL of a migrated one) with
    `TOKENS` in it, served with auth."""

    @contextmanager
    def database_url() -> Iterator[str]:
        if database in get_args(Dialect):
            with migrated_database(cast(Dialect, database), log_dir) as url:
                yield url
        else:
            yield database

    log_dir.mkdir(parents=True, exist_ok=True)
    with database_url() as url:
        team = Team(ServerProcess(url, log_dir, args=args, env=env), url, log_dir,
                    make_tokens(url))
        team.server.start()
        try:
            yield team
        finally:
            team.server.stop()
