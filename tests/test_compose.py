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
        "AMPSCOPE_DB_URL": "postgresql+psycopg://ampscope:ampscope@postgres:5432/ampscope"}
    assert server["command"] == [
        "sh", "-c", "ampscope db upgrade && ampscope serve --host 0.0.0.0 --port 8765"]
    assert server["ports"] == ["8765:8765"]


def test_dockerfile_installs_the_server_extra_with_its_package_folders() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    assert lines[0].startswith("#") and "FROM python:3.11-slim" in lines
    copies = {line.split()[1] for line in lines if line.startswith("COPY ")}
    assert {"client_hook", "server", "web", "migrations"} <= copies
    assert 'RUN pip install --no-cache-dir ".[server]"' in lines
    assert all((ROOT / folder).is_dir() for folder in ("client_hook", "server", "web",
                                                       "migrations"))
