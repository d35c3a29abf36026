"""`ampscope report RUN [--baseline RUN] [--db URL] [--html PATH]` on a real SQLite file and on
Postgres (runs ingested by the ingest service): the installed console script as a process, and
`cli.main` (the function it calls) in-process for the other cases."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.cli import main as cli
from tests.server.findings.conftest import Database
from tests.server.findings.payloads import healthy_batch, troubled_batch
from tests.server.wire import new_id
from tests.support.ingest import ingest_payload

AMPSCOPE = Path(sys.executable).parent / "ampscope"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(AMPSCOPE), *args], capture_output=True, text=True, timeout=120)


def _seed(sessions: sessionmaker[Session]) -> tuple[str, str]:
    troubled, healthy = troubled_batch(new_id()), healthy_batch(new_id())
    for payload in (troubled, healthy):
        ingest_payload(sessions, payload)
    return troubled["run"]["id"], healthy["run"]["id"]


def test_markdown_post_mortem(database: Database,
                              capsys: pytest.CaptureFixture[str]) -> None:
    # In-process through `cli.main` (the console script's function); test_baseline_and_html
    # runs the installed script itself.
    troubled, _ = _seed(database.sessions)
    assert cli.main(["report", troubled, "--db", database.url]) == 0
    text = capsys.readouterr().out
    assert text.startswith(
        f"# ampscope post-mortem: `troubled`\n\n- run `{troubled}`, target format `fp16`, "
        "2 layer(s)\n- findings: 2 error(s), 2 warning(s), 2 info\n\n## Findings\n\n"
        "### [ERROR] Overflow storm: 6 optimizer steps skipped between steps 200 and 250\n\n"
        "Steps 200-250.\n")
    assert "Layers, most responsible first: `fc1.bias`, `fc1.weight`\n" in text
    assert "| skipped_steps | 6 |\n" in text
    assert "### [WARNING] Gradients clipped while still scaled (2 step(s))\n" in text
    assert "- start 65536 (2^16), end 8 (2^3), min 8 (2^3), max 65536 (2^16)\n" in text
    assert "- 13 of 400 steps skipped (3.25%); 6 of them calibration\n" in text
    assert "| 160-239 | 4 | 5.00% |\n" in text
    assert "### Worst layers (step 390)\n" in text
    # 12.5 % zeros (beside subnormal values: flushed) + 3.125 % that flush; log2(65504 /
    # (0.25 * 8)) = 14.9991 bits.
    assert "| `fc1.bias` | 15.62% | 0.00% | 15 |\n" in text
    recommendations = text.split("## Recommendations\n\n")[1].splitlines()
    assert [line.split("]")[0] for line in recommendations] == [
        "1. [ERROR", "2. [ERROR", "3. [WARNING", "4. [info"]  # root causes only


@pytest.mark.slow
def test_baseline_and_html(database: Database,
                           tmp_path: Path) -> None:
    troubled, healthy = _seed(database.sessions)
    page = tmp_path / "out" / "report.html"
    page.parent.mkdir()
    result = _cli("report", troubled, "--baseline", healthy, "--db", database.url,
                  "--html", str(page))
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"ampscope report: wrote {page}\n"
    assert f"- compared with baseline `{healthy}`\n" in result.stdout
    assert "### [WARNING] Departs from the baseline at step 200 (grad_norm)\n" in result.stdout
    html = page.read_text(encoding="utf-8")
    match = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html,
                      re.S)
    assert match is not None
    findings = json.loads(match.group(1))["findings"]
    assert [f["kind"] for f in findings][:3] == [
        "overflow_storm", "scale_collapse", "forward_overflow"]
    divergence = [f for f in findings if f["kind"] == "baseline_divergence"]
    assert divergence[0]["evidence"]["relative"] == "inf"
    assert 'id="findings"' in html


# Error paths are the same on both dialects: called in-process through `cli.main`, the
# function behind the console script, to keep the suite fast.

def test_unknown_run_and_baseline(database: Database,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    troubled, _ = _seed(database.sessions)
    assert cli.main(["report", "nope", "--db", database.url]) == 2
    assert capsys.readouterr() == ("", "ampscope report: run 'nope' not found\n")
    assert cli.main(["report", troubled, "--baseline", troubled, "--db", database.url]) == 2
    assert capsys.readouterr().err == (
        "ampscope report: baseline: must be another run than the one analysed\n")


def test_unmigrated_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.db").touch()  # an empty SQLite file: a database without the schema
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert cli.main(["report", "x", "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ampscope report: the database ")
    assert "run `ampscope db upgrade --db " in err


def test_unwritable_html_path(database: Database,
                              tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    troubled, _ = _seed(database.sessions)
    missing = tmp_path / "no" / "such" / "dir.html"
    assert cli.main(["report", troubled, "--db", database.url, "--html", str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"ampscope report: cannot write {missing}: No such file or directory\n")
