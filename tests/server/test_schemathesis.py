"""Schemathesis against the live OpenAPI document of a real `--auth required` server, with an
all-projects admin token, positive and negative data, on both dialects: no response is a 5xx.

Bounded: a fixed seed and `MAX_EXAMPLES` per operation (about 1,300 requests, ~20 s a dialect).
Only `not_a_server_error` is asserted: other checks report semantic limits the schema cannot
express (a v1 batch refusing v2 fields) and Starlette's `Allow` header on OPTIONS.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.team import Team, team_server

MAX_EXAMPLES = 30
SEED = 1


@pytest.fixture(params=["sqlite", "postgres"])
def team(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Team]:
    with team_server(request.param, tmp_path) as team:
        yield team


def test_no_input_is_a_server_error(team: Team, tmp_path: Path) -> None:
    cli = Path(sys.executable).with_name("schemathesis")
    result = subprocess.run(
        [str(cli), "run", f"{team.url}/openapi.json", "--checks", "not_a_server_error",
         "--mode", "all", "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED),
         "--header", f"Authorization: Bearer {team.tokens['root']}",
         "--report", "ndjson", "--report-dir", str(tmp_path / "report")],
        capture_output=True, text=True, timeout=600)
    summary = result.stdout[-3000:]
    assert result.returncode == 0, summary
    tested = re.search(r"Tested: (\d+)", result.stdout)
    generated = re.search(r"(\d+) generated", result.stdout)
    assert tested is not None and int(tested.group(1)) >= 16, summary
    assert generated is not None and int(generated.group(1)) >= 500, summary
    assert "Traceback" not in team.server.log()
