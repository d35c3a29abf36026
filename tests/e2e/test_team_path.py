"""Team mode end to end: a real CPU AMP loop under `ampscope.watch(token=…)` streams into
`ampscope serve --auth required`; the secret never lands in the database, the access log or the
server's log; a refused token stops the sending at once and every record reaches the spool,
from which `ampscope sync` delivers them once given a valid token."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import ampscope
from ampscope.spool import spool_files
from tests.support.team import Team, team_server

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo_model import make_training, train_step

pytestmark = pytest.mark.slow

STEPS = 30


def _train(team: Team, token: str | None, tmp_path: Path) -> ampscope.Monitor:
    model, scaler, optimizer, gen = make_training()
    mon = ampscope.watch(model, scaler, optimizer, run="team", project="alpha",
                         server=team.url, token=token, spool_dir=tmp_path / "spool",
                         layer_every=5)
    for _ in range(STEPS):
        train_step(model, scaler, optimizer, gen)
    mon.close(5.0)
    return mon


def _stored_steps(team: Team, run_id: str) -> list[int]:
    with team.client("root") as client:
        body = client.get(f"/api/runs/{run_id}/steps").json()
    return [step["seq"] for step in body["steps"]]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def team_per_dialect(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    """One team server per dialect for the module: each test trains its own run, and the log
    assertions hold for the whole log (a refusal counted once, no secret in it)."""
    with team_server(request.param, tmp_path_factory.mktemp("server")) as team:
        yield team


@pytest.fixture
def team(team_per_dialect: Team) -> Team:
    if team_per_dialect.server.pid is None:  # a test before stopped it to read its log
        team_per_dialect.server.start()
    return team_per_dialect


def test_a_token_streams_and_is_never_written_down(team: Team, tmp_path: Path) -> None:
    secret = team.tokens["alpha-ingest"]
    mon = _train(team, secret, tmp_path)
    stats = mon.stats()
    assert (stats.produced, stats.acknowledged, stats.spooled, stats.dropped) == (
        STEPS, STEPS, 0, 0)
    assert _stored_steps(team, mon.run_id) == list(range(STEPS))
    # A browser-ish read with the query string a careless user might paste.
    with httpx.Client(base_url=team.url, timeout=30.0) as client:
        assert client.get(f"/api/runs?token={secret}").status_code == 400
    team.server.stop()
    logs = team.server.log()
    assert "POST /api/ingest HTTP/1.1\" 200" in logs  # the access log is on, and is read here
    assert "GET /api/runs HTTP/1.1\" 400" in logs  # logged without its query string
    assert secret not in logs
    assert "amps_" not in logs
    if team.db_url.startswith("sqlite"):
        files = [Path(team.db_url.removeprefix("sqlite:///")), *team.log_dir.glob("*.db-*")]
        for file in files:
            assert secret.encode() not in file.read_bytes()
    else:
        dump = subprocess.run(["pg_dump", "-h", "127.0.0.1", "-U", "postgres",
                               team.db_url.rsplit("/", 1)[1]],
                              capture_output=True, text=True, timeout=120, check=True)
        assert "api_tokens" in dump.stdout and secret not in dump.stdout


def test_a_refused_token_stops_sending_and_spools_everything(
    team: Team, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ampscope")
    wrong = team.tokens["beta-ingest"]  # valid, but for another project: 403
    mon = _train(team, wrong, tmp_path)
    stats = mon.stats()
    assert (stats.produced, stats.acknowledged, stats.dropped) == (STEPS, 0, 0)
    assert stats.spooled == STEPS
    warnings = [r.getMessage() for r in caplog.records if r.name == "ampscope"]
    refused = [m for m in warnings if "refused this client with HTTP 403" in m]
    assert len(refused) == 1, warnings
    assert "sending stopped, records go to the spool" in refused[0]
    assert wrong not in "\n".join(warnings)
    team.server.stop()
    denied = team.server.log().count('POST /api/ingest HTTP/1.1" 403')
    assert denied == 1  # no retry storm: one refusal, then never again
    team.server.start()

    files = spool_files(tmp_path / "spool")
    assert files
    env = {**os.environ, "AMPSCOPE_TOKEN": team.tokens["alpha-ingest"]}
    result = subprocess.run([sys.executable, "-m", "ampscope_server.cli", "sync",
                             str(tmp_path / "spool"), "--server", team.url],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{STEPS} records accepted, 0 duplicates" in result.stdout
    assert _stored_steps(team, mon.run_id) == list(range(STEPS))


def test_sync_without_a_token_is_refused_once(team: Team, tmp_path: Path) -> None:
    mon = _train(team, None, tmp_path)
    assert mon.stats().spooled == STEPS
    env = {key: value for key, value in os.environ.items() if key != "AMPSCOPE_TOKEN"}
    result = subprocess.run([sys.executable, "-m", "ampscope_server.cli", "sync",
                             str(tmp_path / "spool"), "--server", team.url],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1
    assert "refused, HTTP 401: " in result.stdout
    token_file = tmp_path / "token"
    token_file.write_text(team.tokens["alpha-ingest"] + "\n")
    result = subprocess.run([sys.executable, "-m", "ampscope_server.cli", "sync",
                             str(tmp_path / "spool"), "--server", team.url, "--token-file",
                             str(token_file)], capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode == 0, result.stdout
    assert _stored_steps(team, mon.run_id) == list(range(STEPS))


def test_deleting_a_live_run_stops_its_hook_with_a_clear_warning(
    team: Team, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ampscope")
    model, scaler, optimizer, gen = make_training()
    mon = ampscope.watch(model, scaler, optimizer, run="doomed", project="alpha",
                         server=team.url, token=team.tokens["alpha-ingest"],
                         spool_dir=tmp_path / "spool", flush_interval=0.05)
    for _ in range(10):
        train_step(model, scaler, optimizer, gen)
    deadline = time.monotonic() + 30
    while mon.stats().acknowledged < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mon.stats().acknowledged == 10
    with team.client("alpha-admin") as admin:
        assert admin.delete(f"/api/runs/{mon.run_id}").status_code == 200
    for _ in range(20):
        train_step(model, scaler, optimizer, gen)
    mon.close(5.0)
    stats = mon.stats()
    assert (stats.produced, stats.acknowledged, stats.spooled, stats.dropped) == (30, 10, 20, 0)
    refused = [r.getMessage() for r in caplog.records
               if r.name == "ampscope" and "HTTP 410" in r.getMessage()]
    assert refused == [
        f"ampscope server refused this client with HTTP 410: {{\"detail\":\"run '{mon.run_id}' "
        "was deleted by an admin; it takes no more data (start a new run)\"}; sending stopped, "
        f"records go to the spool ({tmp_path / 'spool'})"]
    with team.client("root") as root:
        assert root.get(f"/api/runs/{mon.run_id}").status_code == 404
