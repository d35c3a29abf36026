"""docker-compose.yml and its Dockerfile, checked as data (no Docker engine here)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

yaml = importlib.import_module("yaml")  # no type stubs installed

ROOT = Path(__file__).resolve().parents[1]


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_services() -> None:
    assert set(_compose()["services"]) == {"postgres", "server"}


def test_postgres_has_a_healthcheck_and_a_volume() -> None:
    compose = _compose()
    postgres = compose["services"]["postgres"]
    assert postgres["image"] == "postgres:15"
    assert postgres["healthcheck"]["test"] == ["CMD-SHELL", "pg_isready -U ampscope -d ampscope"]
    assert postgres["volumes"] == ["pgdata:/var/lib/postgresql/data"]
    assert "pgdata" in compose["volumes"]
    env = postgres["environment"]
    assert (env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"]) == (
        "ampscope", "ampscope", "ampscope")


def test_server_waits_for_a_healthy_postgres_and_migrates_first() -> None:
    server = _compose()["services"]["server"]
    assert server["build"] == "."
    assert server["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert server["environment"] == {
        "AMPSCOPE_DB_URL": "postgresql+psycopg://ampscope:ampscope@postgres:5432/ampscope",
        "AMPSCOPE_AUTH": "required",
        "AMPSCOPE_ALLOWED_HOSTS": "${AMPSCOPE_ALLOWED_HOSTS:-localhost,127.0.0.1}"}
    assert server["command"] == [
        "sh", "-c", "ampscope db upgrade && ampscope serve --host 0.0.0.0 --port 8765 "
        "--workers 2"]
    assert server["ports"] == ["8765:8765"]


def test_dockerfile_installs_the_server_extra_with_its_package_folders() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    assert lines[0].startswith("#") and "FROM python:3.11-slim" in lines
    copies = {line.split()[1] for line in lines if line.startswith("COPY ")}
    assert {"client_hook", "server", "web", "migrations"} <= copies
    assert 'RUN pip install --no-cache-dir ".[server]"' in lines
    assert all((ROOT / folder).is_dir() for folder in ("client_hook", "server", "web",
                                                       "migrations"))


def test_the_server_runs_with_auth_and_says_how_to_make_the_first_token() -> None:
    """Auth is on (and would be anyway: it binds beyond loopback); the first admin token is made
    with the CLI the image ships, which the compose file's header spells out, and the README's
    team section shows the same command."""
    from ampscope_server.config import Settings, auth_required

    server = _compose()["services"]["server"]
    env = server["environment"]
    settings = Settings(host="0.0.0.0", auth=env["AMPSCOPE_AUTH"])
    assert auth_required(settings)
    command = ("docker compose run --rm server ampscope token create --all-projects "
               "--scope admin --name first-admin")
    header = (ROOT / "docker-compose.yml").read_text().split("services:")[0]
    assert command in header
    assert command in (ROOT / "README.md").read_text()
    # The command the header names is one this CLI takes.
    from ampscope_server.cli.main import _parser

    args = _parser().parse_args(command.split("ampscope ", 1)[1].split())
    assert (args.command, args.token_command, args.all_projects, args.scope) == (
        "token", "create", True, "admin")
