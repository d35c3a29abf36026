"""Alerts end to end: a real webhook receiver on 127.0.0.1 and runs ingested over HTTP, to the app
in process (its lifespan runs the alerts worker, as one `ampscope serve` does) or, where the
process is the subject, to real servers: killed mid-delivery, several workers, a leader
killed, and a real training process stopped for the stall. Each test has a project of its own,
so its rules and destinations are its own."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from tests.faults.support import wait_until
from tests.server.findings.payloads import healthy_batch, records, troubled_batch
from tests.server.findings.synthetic import scaler_steps
from tests.server.wire import batch, batch_v2, new_id, record
from tests.support.app import BASE_URL, app_client
from tests.support.databases import migrated_database, migrated_sqlite
from tests.support.ingest import post_batch
from tests.support.servers import ServerProcess, free_port
from tests.support.webhooks import Received, Receiver, receiver

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
FAST = {"AMPSCOPE_ALERT_INTERVAL_S": "0.2"}
SETTLE_S = 2.0  # ten evaluation passes: long enough for a duplicate to show up


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[TestClient]:
    tmp = tmp_path_factory.mktemp("alerts")
    with migrated_database(request.param, tmp) as url, \
            app_client(url, alert_interval_s=float(FAST["AMPSCOPE_ALERT_INTERVAL_S"])) as client:
        yield client


@pytest.fixture()
def hook() -> Iterator[Receiver]:
    with receiver() as got:
        yield got


Target = ServerProcess | TestClient
"""A real server, or a client of the app in process."""


@contextmanager
def _client(target: Target) -> Iterator[httpx.Client | TestClient]:
    """The app's client, or a client of a real server for one call (the server may be killed
    and started again between two calls)."""
    if isinstance(target, TestClient):
        yield target
        return
    with httpx.Client(base_url=target.url, timeout=30.0) as client:
        yield client


def _destination(target: Target, project: str, url: str, kind: str = "webhook",
                 min_severity: str = "info") -> dict[str, Any]:
    with _client(target) as client:
        response = client.post("/api/alerts/destinations", json={
            "project": project, "name": f"{kind} of {project}", "kind": kind, "url": url,
            "min_severity": min_severity})
    assert response.status_code == 201, response.text
    made: dict[str, Any] = response.json()
    return made


def _rule(target: Target, project: str, condition: dict[str, Any],
          severity: str = "warning", cooldown_s: float = 600.0) -> str:
    with _client(target) as client:
        response = client.post("/api/alerts/rules", json={
            "project": project, "name": condition.get("metric", condition.get("state", "r")),
            "condition": condition, "severity": severity, "cooldown_s": cooldown_s})
    assert response.status_code == 201, response.text
    rule_id: str = response.json()["id"]
    return rule_id


def _ingest(target: Target, payload: dict[str, Any], project: str) -> None:
    payload["run"]["project"] = project
    with _client(target) as client:
        post_batch(client, payload)


def _root_causes_with_an_error(target: Target, run_id: str) -> dict[str, str]:
    """{root identity: its title} of the run's findings, for the groups holding an error."""
    with _client(target) as client:
        findings = client.get(f"/api/runs/{run_id}/findings").json()["findings"]
    titles = {f["identity"]: f["title"] for f in findings}
    return {f["cause"] or f["identity"]: titles[f["cause"] or f["identity"]]
            for f in findings if f["severity"] == "error"}


def _history(target: Target, run_id: str) -> list[dict[str, Any]]:
    with _client(target) as client:
        alerts: list[dict[str, Any]] = client.get(f"/api/runs/{run_id}/alerts").json()["alerts"]
    return alerts


def _of_run(got: list[Received], run_id: str) -> list[Received]:
    return [r for r in got if r.json()["alert"]["run_id"] == run_id]


def test_a_run_of_a_project_alerts_cannot_name_still_has_its_history(app: TestClient) -> None:
    """The wire takes any project name up to 200 characters; the alert settings only
    `[A-Za-z0-9._-]` names. The run's own history is the run's, whatever its project."""
    run_id = new_id()
    _ingest(app, healthy_batch(run_id), "a b")
    response = app.get(f"/api/runs/{run_id}/alerts")
    assert (response.status_code, response.json()) == (200, {"alerts": [], "next_before": None})


def test_a_run_gets_exactly_the_alerts_its_findings_imply(app: TestClient,
                                                          hook: Receiver) -> None:
    project = f"implied-{new_id()[:8]}"
    dest = _destination(app, project, f"{hook.url}/ampscope")
    troubled, healthy = new_id(), new_id()
    _ingest(app, troubled_batch(troubled), project)
    _ingest(app, healthy_batch(healthy), project)
    expected = _root_causes_with_an_error(app, troubled)
    assert set(expected) == {"overflow_storm", "forward_overflow"}  # the payloads' two errors
    hook.wait_for(lambda got: len(got) >= len(expected))
    time.sleep(SETTLE_S)
    got = hook.received
    assert _of_run(got, healthy) == []  # the healthy run: no alert at all
    assert sorted(r.json()["alert"]["title"] for r in got) == sorted(expected.values())
    assert len({r.headers["X-Ampscope-Delivery"] for r in got}) == len(got) == len(expected)
    for request in got:
        signed = hmac.new(dest["signing_secret"].encode(), request.body,
                          hashlib.sha256).hexdigest()
        assert request.headers["X-Ampscope-Signature-256"] == f"sha256={signed}"
        alert = request.json()["alert"]
        assert (alert["project"], alert["run_id"], alert["event"], alert["severity"]) == (
            project, troubled, "fired", "error")
        assert alert["link"] == (f"{BASE_URL}/runs/{troubled}?start="
                                 f"{max(0, alert['step_start'] - 10)}&end={alert['step_end'] + 10}")
    history = _history(app, troubled)
    assert sorted(a["title"] for a in history) == sorted(expected.values())
    assert all([(d["status"], d["attempts"], d["destination_id"]) for d in a["deliveries"]]
               == [("delivered", 1, dest["id"])] for a in history)
    assert _history(app, healthy) == []


def test_a_root_cause_found_later_does_not_alert_again(app: TestClient, hook: Receiver) -> None:
    """One cause, one alert (#30): a storm alerts as the root cause; the next batch shows the
    loss diverging, so the divergence becomes the root and the storm follows from it. Before,
    the default rule alerted a second time (for the divergence)."""
    project = f"reroot-{new_id()[:8]}"
    _destination(app, project, f"{hook.url}/reroot")
    run_id = new_id()
    points = scaler_steps(200, lambda s, scale: s % 4 == 0,
                          loss=lambda s: 1.0 if s < 100 else 10.0 ** ((s - 100) / 20))
    payload = batch_v2(records(points), run_id=run_id)
    _ingest(app, dict(payload, records=payload["records"][:100]), project)
    hook.wait_for(lambda got: len(_of_run(got, run_id)) >= 1)
    first = _root_causes_with_an_error(app, run_id)
    assert list(first) == ["overflow_storm"]
    _ingest(app, dict(payload, records=payload["records"][100:], final=True), project)
    wait_until(lambda: "divergence" in _root_causes_with_an_error(app, run_id), 30.0)
    assert list(_root_causes_with_an_error(app, run_id)) == ["divergence"]
    time.sleep(SETTLE_S)
    got = _of_run(hook.received, run_id)
    assert [r.json()["alert"]["title"] for r in got] == list(first.values())
    assert len(_history(app, run_id)) == 1


def _storm(step: int) -> bool:
    return step < 1000 or step >= 1500


def test_a_long_storm_is_one_alert_per_cooldown(app: TestClient, hook: Receiver) -> None:
    """2,000 steps: a storm (every 4th step overflows), a calm stretch, the storm again, sent
    in 20 batches while the server evaluates five times a second."""
    project = f"storm-{new_id()[:8]}"
    _destination(app, project, f"{hook.url}/storm")
    skip_rule = _rule(app, project, {"kind": "series", "metric": "skip_rate",
                                        "threshold": 0.1, "window": 50})
    run_id = new_id()
    for first in range(0, 2000, 100):
        records = [record(s, found_inf=_storm(s) and s % 4 == 0,
                          skipped=_storm(s) and s % 4 == 0) for s in range(first, first + 100)]
        _ingest(app, batch(records, run_id=run_id, final=first == 1900), project)
        time.sleep(0.25)
    time.sleep(SETTLE_S)
    history = _history(app, run_id)
    by_rule = Counter(a["rule_id"] for a in history)
    assert by_rule[skip_rule] == 1  # two storm episodes, the second within the cooldown
    got = _of_run(hook.received, run_id)
    assert len(got) == len(history)  # every alert delivered, none twice
    assert len({r.headers["X-Ampscope-Delivery"] for r in got}) == len(got)
    [skip] = [a for a in history if a["rule_id"] == skip_rule]
    assert skip["title"].startswith("Skip rate 2") and skip["severity"] == "warning"


def test_an_unreachable_webhook_is_retried_with_backoff(
        app: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ampscope_server")  # what `serve` logs
    project = f"away-{new_id()[:8]}"
    secret_path = "/services/T000/B000/s3cr3t-path"
    _destination(app, project, f"http://127.0.0.1:{free_port()}{secret_path}")
    run_id = new_id()
    _ingest(app, troubled_batch(run_id), project)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        history = _history(app, run_id)
        if history and all(d["attempts"] >= 2 for a in history for d in a["deliveries"]):
            break
        time.sleep(0.2)
    assert history
    for alert in history:
        [delivery] = alert["deliveries"]
        assert delivery["status"] == "pending"
        assert delivery["last_error"].startswith("ConnectionRefusedError")
        assert delivery["delivered_at"] is None
        # The third attempt waits 4 s after the second (2 s after the first).
        assert delivery["next_attempt_at"] > time.time()
    _ingest(app, healthy_batch(new_id()), project)  # ingest is not held up by it
    with _client(app) as client:
        listed = client.get("/api/alerts/destinations", params={"project": project}).text
    assert "s3cr3t" not in listed and "s3cr3t" not in caplog.text
    assert "alert delivery" in caplog.text  # the failures were logged, without the URL


def test_a_test_alert_reaches_slack_and_discord(app: TestClient, hook: Receiver) -> None:
    project = f"test-{new_id()[:8]}"
    slack = _destination(app, project, f"{hook.url}/slack", kind="slack")
    discord = _destination(app, project, f"{hook.url}/discord", kind="discord")
    assert slack["signing_secret"] is None and discord["signing_secret"] is None
    with _client(app) as client:
        for dest in (slack, discord):
            answer = client.post(f"/api/alerts/destinations/{dest['id']}/test")
            assert answer.status_code == 202, answer.text
            assert answer.json()["event"] == "test"
    got = {r.path: r.json() for r in hook.wait_for(lambda got: len(got) >= 2)}
    assert got["/slack"]["blocks"][0]["text"]["text"] == (
        f"🔵 INFO: Test alert from ampscope to “slack of {project}”")
    assert got["/discord"]["embeds"][0]["color"] == 0x2563EB

    def statuses() -> list[str]:
        with _client(app) as client:
            history = client.get("/api/alerts", params={"project": project}).json()["alerts"]
        return sorted(d["status"] for a in history for d in a["deliveries"])

    # The receiver has a request before the server has its answer and records the delivery
    # (a fresh-clone run read one still pending here).
    wait_until(lambda: "pending" not in statuses(), 30.0)
    assert statuses() == ["delivered", "delivered"]


def test_bad_destinations_and_rules_are_refused(app: TestClient) -> None:
    project = f"bad-{new_id()[:8]}"
    with _client(app) as client:
        for url, why in (("ftp://example.com/x", "must be an http:// or https:// URL"),
                         ("https://user:pw@example.com/x", "credentials in the URL"),
                         ("https://example.com/a b", "spaces or control characters"),
                         ("https://example.com:99999/x", "not a valid URL")):
            answer = client.post("/api/alerts/destinations", json={
                "project": project, "name": "x", "kind": "webhook", "url": url})
            assert answer.status_code == 422 and why in answer.json()["detail"], answer.text
        for name in ("nul\x00here", "lone \ud800 surrogate"):
            answer = client.post("/api/alerts/rules", content=json.dumps({
                "project": project, "name": name,
                "condition": {"kind": "state", "state": "finished"}}),
                headers={"Content-Type": "application/json"})
            assert answer.status_code == 422, answer.text
        answer = client.post("/api/alerts/destinations", json={
            "project": project, "name": "x", "kind": "slack", "url": "https://hooks.slack.com/x",
            "signing_secret": "0123456789abcdef"})
        assert answer.status_code == 422
        for condition in ({"kind": "sometimes"}, {"kind": "series", "metric": "skip_rate",
                                                  "threshold": "nan"},
                          {"kind": "finding", "finding_kind": "not_a_kind"}):
            answer = client.post("/api/alerts/rules", json={
                "project": project, "name": "x", "condition": condition})
            assert answer.status_code == 422, (condition, answer.text)
        # No project yet: nothing refused above made one, so it has no rules.
        assert client.get("/api/alerts/rules", params={"project": project}).json() == []
        # The defaults, made with the project, can be turned off and stay off.
        _ingest(app, healthy_batch(new_id()), project)
        rules = client.get("/api/alerts/rules", params={"project": project}).json()
        assert sorted(r["builtin"] for r in rules) == ["crashed", "errors", "stalled"]
        errors = next(r for r in rules if r["builtin"] == "errors")
        off = client.patch(f"/api/alerts/rules/{errors['id']}", json={"enabled": False})
        assert off.status_code == 200 and off.json()["enabled"] is False
        assert client.delete(f"/api/alerts/rules/{errors['id']}").status_code == 200
        again = client.get("/api/alerts/rules", params={"project": project}).json()
        assert sorted(r["builtin"] for r in again) == ["crashed", "stalled"]
        assert client.get("/api/alerts/rules/nope").status_code == 405
        assert client.patch("/api/alerts/rules/0ace", json={}).status_code == 404
        assert client.patch("/api/alerts/rules/nope", json={}).status_code == 422


def test_a_server_killed_mid_delivery_delivers_after_restart(tmp_path: Path,
                                                             hook: Receiver) -> None:
    server = ServerProcess(migrated_sqlite(tmp_path), tmp_path, env=FAST).start()
    try:
        project = "killed"
        _destination(server, project, f"{hook.url}/slow")
        hook.delay_s = 30.0  # the webhook holds the first request: the server waits on it
        run_id = new_id()
        _ingest(server, troubled_batch(run_id), project)
        [first] = hook.wait_for(lambda got: len(got) >= 1)
        server.kill()
        hook.delay_s = 0.0
        server.start()
        got = hook.wait_for(lambda got: len(got) >= 3)
        time.sleep(SETTLE_S)
        got = hook.received
        ids = Counter(r.headers["X-Ampscope-Delivery"] for r in got)
        # The interrupted one is sent again (same delivery id: a receiver drops the repeat);
        # each alert is delivered once after the restart.
        assert ids == {first.headers["X-Ampscope-Delivery"]: 2, **{
            i: 1 for i in ids if i != first.headers["X-Ampscope-Delivery"]}}
        assert len(ids) == 2
        history = _history(server, run_id)
        assert [(d["status"], d["attempts"]) for a in history for d in a["deliveries"]] == [
            ("delivered", 1), ("delivered", 1)]
    finally:
        server.stop()


def test_several_workers_deliver_each_alert_once(tmp_path: Path, hook: Receiver) -> None:
    with migrated_database("postgres", tmp_path) as url:
        server = ServerProcess(url, tmp_path, args=["--workers", "2"], env=FAST).start()
        try:
            project = "workers"
            _destination(server, project, f"{hook.url}/workers")
            run_id = new_id()
            _ingest(server, troubled_batch(run_id), project)
            hook.wait_for(lambda got: len(got) >= 2)
            time.sleep(SETTLE_S)
            ids = Counter(r.headers["X-Ampscope-Delivery"] for r in hook.received)
            assert sorted(ids.values()) == [1, 1]
        finally:
            server.stop()


TRAINING = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, "examples")
    import ampscope
    from demo_model import make_training, train_step
    model, scaler, optimizer, gen = make_training()
    mon = ampscope.watch(model, scaler, optimizer, run="stall", project=sys.argv[2],
                         server=sys.argv[1], layer_every=0)
    print(mon.run_id, flush=True)
    while True:
        train_step(model, scaler, optimizer, gen)
        time.sleep(0.05)
""")


def test_a_stalled_run_alerts_once_and_recovers(tmp_path: Path, hook: Receiver) -> None:
    """The training process is stopped (SIGSTOP) for a while, then continued."""
    server = ServerProcess(migrated_sqlite(tmp_path), tmp_path, env=FAST).start()
    training = None
    try:
        project = "stall"
        _destination(server, project, f"{hook.url}/stall")
        rule = _rule(server, project, {"kind": "state", "state": "stalled", "stall_factor": 10,
                                       "stall_min_s": 3})
        training = subprocess.Popen([sys.executable, "-c", TRAINING, server.url, project],
                                    cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                    env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert training.stdout is not None
        run_id = training.stdout.readline().strip()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with _client(server) as client:
                summary = client.get(f"/api/runs/{run_id}")
            if summary.status_code == 200 and summary.json()["num_steps"] >= 20:
                break
            time.sleep(0.2)
        training.send_signal(signal.SIGSTOP)
        [stall] = hook.wait_for(lambda got: len(got) >= 1)
        alert = stall.json()["alert"]
        assert alert["event"] == "fired"
        assert alert["title"].startswith("Run stalled: no record for")
        with _client(server) as client:
            last_ingest = client.get(f"/api/runs/{run_id}").json()["updated_at"]
        assert alert["created_at"] - last_ingest >= 3.0  # never before the rule's floor
        training.send_signal(signal.SIGCONT)
        got = hook.wait_for(lambda got: len(got) >= 2)
        assert got[1].json()["alert"]["event"] == "recovered"
        time.sleep(SETTLE_S)
        history = _history(server, run_id)
        assert sorted((a["rule_id"], a["event"]) for a in history) == [
            (rule, "fired"), (rule, "recovered")]
        assert len(hook.received) == 2
    finally:
        if training is not None:
            training.send_signal(signal.SIGCONT)
            training.kill()
            training.wait()
            if training.stdout is not None:
                training.stdout.close()
        server.stop()


def test_another_instance_takes_over_when_the_leader_dies(tmp_path: Path,
                                                          hook: Receiver) -> None:
    """Two instances on one Postgres: one delivers; SIGKILLed, the other takes the lock."""
    with migrated_database("postgres", tmp_path) as url:
        first = ServerProcess(url, tmp_path, env=FAST).start()
        second = ServerProcess(url, tmp_path, env=FAST).start()
        try:
            project = "takeover"
            _destination(first, project, f"{hook.url}/takeover")
            first_run = new_id()
            _ingest(second, troubled_batch(first_run), project)
            hook.wait_for(lambda got: len(got) >= 2)
            # Killed between a webhook's answer and its "delivered" commit, the leader's last
            # alert is rightly sent again (the mid-delivery test above covers that): this test
            # kills it once both are recorded, so any repeat is the takeover's fault.
            wait_until(lambda: [d["status"] for a in _history(first, first_run)
                                 for d in a["deliveries"]] == ["delivered", "delivered"], 30.0)
            leader = next(s for s in (first, second) if "this process delivers" in s.log())
            follower = second if leader is first else first
            leader.kill()
            _ingest(follower, troubled_batch(new_id()), project)
            hook.wait_for(lambda got: len(got) >= 4)
            time.sleep(SETTLE_S)
            ids = Counter(r.headers["X-Ampscope-Delivery"] for r in hook.received)
            assert sorted(ids.values()) == [1, 1, 1, 1]
            assert "this process delivers" in follower.log()
        finally:
            first.stop()
            second.stop()
