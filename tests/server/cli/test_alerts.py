"""`ampscope alerts …` (`cli.main` in this process) on a real SQLite database, then the app it
configured (in process) sending."""

from __future__ import annotations

import hashlib
import hmac
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.app import app_client
from tests.support.cli import in_process
from tests.support.databases import migrated_sqlite
from tests.support.webhooks import receiver

pytestmark = pytest.mark.slow


def _cli_stdin(stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ampscope_server.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_configure_alerts_from_the_shell(tmp_path: Path) -> None:
    url = migrated_sqlite(tmp_path)
    with receiver() as hook:
        made = _cli_stdin(f"{hook.url}/hooks/s3cr3t\n", "alerts", "add-destination",
                          "--project", "vision", "--name", "ops", "--kind", "webhook",
                          "--url-file", "-", "--min-severity", "info", "--db", url)
        assert made.returncode == 0, made.stderr
        secret = made.stdout.strip()
        assert len(secret) == 43 and "signing secret is shown once" in made.stderr
        listed = in_process("alerts", "destinations", "--db", url)
        assert listed.returncode == 0
        [header, row] = listed.stdout.splitlines()
        assert header.split() == ["ID", "PROJECT", "NAME", "KIND", "TARGET", "FLOOR", "ON"]
        dest_id, *cells = row.split()
        assert cells == ["vision", "ops", "webhook", f"{hook.url}/…", "info", "yes"]
        assert "s3cr3t" not in listed.stdout + listed.stderr
        rule = in_process("alerts", "add-rule", "--project", "vision", "--name", "skips",
                          "--series", "skip_rate", "--threshold", "0.2", "--window", "50",
                          "--severity", "warning", "--db", url)
        assert rule.returncode == 0, rule.stderr
        rule_id = rule.stdout.strip()
        assert in_process("alerts", "disable", rule_id, "--db", url).returncode == 0
        rules = in_process("alerts", "rules", "--project", "vision",
                           "--db", url).stdout.splitlines()
        assert [line.split()[-1] for line in rules if line.startswith(rule_id)] == ["no"]
        assert sorted(line.split("  ")[2].strip() for line in rules[1:]) == [
            "Any error finding", "Run crashed", "Run stalled", "skips"]
        bad = in_process("alerts", "add-rule", "--project", "vision", "--name", "x", "--finding",
                  "nope", "--db", url)
        assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
        assert bad.stderr.startswith("ampscope alerts add-rule: finding.finding_kind: ")
        missing = in_process("alerts", "test", "nope", "--db", url)
        assert missing.stderr == "ampscope alerts test: alert destination 'nope' not found\n"
        queued = in_process("alerts", "test", dest_id, "--db", url)
        assert queued.returncode == 0 and "queued" in queued.stderr
        # The app on that database (in process: its lifespan runs the alerts worker) sends
        # it, signed with the secret printed above.
        with app_client(url, alert_interval_s=0.2):
            [got] = hook.wait_for(lambda got: len(got) >= 1)
        signed = hmac.new(secret.encode(), got.body, hashlib.sha256).hexdigest()
        assert got.headers["X-Ampscope-Signature-256"] == f"sha256={signed}"
        assert got.path == "/hooks/s3cr3t" and got.json()["alert"]["event"] == "test"
        history = in_process("alerts", "history", "--project", "vision", "--db", url).stdout
        assert history.splitlines()[1].endswith("ops: delivered")
