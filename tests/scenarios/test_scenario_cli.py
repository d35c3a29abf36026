"""A scenario script sends to a team server (`--auth required`) with `--token` and `--project`
(#31: the scripts took no token, so a team server refused them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.team import team_server

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "healthy.py"


def test_a_scenario_streams_to_a_team_server_with_its_token(tmp_path: Path) -> None:
    with team_server("sqlite", tmp_path) as team:
        result = subprocess.run(
            [sys.executable, str(SCRIPT), "--server", team.url, "--project", "alpha",
             "--token", team.tokens["alpha-ingest"], "--run", "team-healthy"],
            capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        run_id = result.stdout.split(": run ", 1)[1].split(" ", 1)[0]
        assert result.stdout == f"healthy: run {run_id} -> {team.url}/runs/{run_id}\n"
        with team.client("alpha-read") as client:
            run = client.get(f"/api/runs/{run_id}").json()
        assert (run["name"], run["project"], run["num_steps"] > 0) == (
            "team-healthy", "alpha", True)
