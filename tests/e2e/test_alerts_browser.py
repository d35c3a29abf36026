"""The alert settings page and the run page's alert history in real Chromium, against a real
server and a real webhook receiver."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.server.findings.payloads import troubled_batch
from tests.server.wire import new_id
from tests.support.browser import Watched, artifact
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess
from tests.support.webhooks import receiver

pytestmark = pytest.mark.browser

WAIT_MS = 15_000


def test_settings_and_history(tmp_path: Path, watched: Watched) -> None:
    server = ServerProcess(migrated_sqlite(tmp_path), tmp_path,
                           env={"AMPSCOPE_ALERT_INTERVAL_S": "0.2"}).start()
    api = httpx.Client(base_url=server.url, timeout=30)
    try:
        with receiver() as hook:
            run_id = new_id()
            assert api.post("/api/ingest", json=troubled_batch(run_id)).status_code == 200
            pg = watched.page
            pg.goto(f"{server.url}/settings?project=default")
            pg.wait_for_selector("body[data-ready]", timeout=WAIT_MS)
            names = pg.locator("#rules-body tr td:nth-child(2)").all_inner_texts()
            assert sorted(names) == ["Any error finding (default)", "Run crashed (default)",
                                     "Run stalled (default)"]
            # A signed webhook: its secret is shown once, its URL never again.
            form = pg.locator("#destination-form")
            form.locator("input[name=name]").fill("ops <b>hook</b>")
            form.locator("select[name=kind]").select_option("webhook")
            form.locator("input[name=url]").fill(f"{hook.url}/secret-path")
            form.locator("select[name=min_severity]").select_option("info")
            form.locator("button[type=submit]").click()
            pg.locator("#secret").wait_for(state="visible", timeout=WAIT_MS)
            secret = pg.locator("#secret").inner_text().rsplit(": ", 1)[1]
            assert len(secret) == 43
            row = pg.locator("#destinations-body tr[data-destination-id]")
            row.wait_for(timeout=WAIT_MS)
            assert row.locator("td").nth(0).inner_text() == "ops <b>hook</b>"  # text, not HTML
            assert row.locator("td").nth(2).inner_text() == f"{hook.url}/…"
            assert "secret-path" not in pg.content()
            row.get_by_role("button", name="Send test alert").click()
            [got] = hook.wait_for(lambda got: len(got) >= 1)
            assert got.json()["alert"]["event"] == "test" and got.path == "/secret-path"
            pg.wait_for_function("() => [...document.querySelectorAll('#history-body td')]"
                                 ".some((td) => td.textContent === 'ops <b>hook</b>: delivered')",
                                 timeout=WAIT_MS)
            # Turn the stalled rule off; add a "finished" rule.
            pg.locator("#rules-body tr", has_text="Run stalled").locator("input").uncheck()
            rules = pg.locator("#rule-form")
            rules.locator("input[name=name]").fill("done")
            rules.locator("select[name=when]").select_option("finished")
            rules.locator("select[name=severity]").select_option("info")
            rules.locator("button[type=submit]").click()
            pg.locator("#rules-body tr", has_text="done").wait_for(timeout=WAIT_MS)
            stored = {r["name"]: r for r in api.get("/api/alerts/rules").json()}
            assert stored["Run stalled"]["enabled"] is False
            assert stored["done"]["condition"]["state"] == "finished"
            assert stored["done"]["severity"] == "info"
            watched.screenshot("alert-settings.png")
            # The new rule fires for the run (finished less than a minute ago), to the new
            # destination; the two errors were decided before any destination existed.
            [_, done] = hook.wait_for(lambda got: len(got) >= 2)
            assert done.json()["alert"]["title"] == "Run finished at step 399"
            alerts = api.get(f"/api/runs/{run_id}/alerts").json()["alerts"]
            expected = [a["title"] for a in alerts]
            assert len(expected) == 3
            pg.goto(f"{server.url}/runs/{run_id}")
            pg.wait_for_function("(n) => document.querySelectorAll("
                                 "'#alerts-body tr[data-alert-id]').length === n",
                                 arg=len(expected), timeout=WAIT_MS)
            assert pg.locator("#alerts-body .alert-title").all_inner_texts() == expected
            pg.wait_for_function("() => document.querySelector('#alerts-body .alert-delivery')"
                                 ".textContent === 'ops <b>hook</b>: delivered'", timeout=WAIT_MS)
            assert pg.locator("#alerts-body .alert-delivery").all_inner_texts() == [
                "ops <b>hook</b>: delivered", "no destination", "no destination"]
            pg.locator("#alerts-panel").screenshot(path=str(artifact("run-alerts.png")))
            # The alert's link opens the run zoomed to its steps, every step chart alike.
            link = done.json()["alert"]["link"]
            assert link == f"{server.url}/runs/{run_id}?start=389&end=409"
            pg.goto(link)
            pg.wait_for_function("() => ['scale-chart', 'loss-chart', 'heatmap'].every((id) => {"
                                 " const l = document.getElementById(id).layout;"
                                 " const r = l && l.xaxis && l.xaxis.range;"
                                 " return r && r[0] === 389 && r[1] === 409; })",
                                 timeout=WAIT_MS)
            watched.assert_clean()
    finally:
        api.close()
        server.stop()


def test_the_alert_history_refreshes_while_the_run_is_live(
        tmp_path: Path, watched: Watched) -> None:
    """An alert decided while the run still trains reaches its run page while the page says
    `live` (it used to refresh only once the run had ended: `connected`)."""
    server = ServerProcess(migrated_sqlite(tmp_path), tmp_path,
                           env={"AMPSCOPE_ALERT_INTERVAL_S": "0.2"}).start()
    api = httpx.Client(base_url=server.url, timeout=30)
    try:
        run_id = new_id()
        payload = troubled_batch(run_id)
        records = payload["records"]
        # The first 100 steps: overflows while calibrating, no error yet; the run stays active.
        assert api.post("/api/ingest", json={**payload, "records": records[:100],
                                              "final": False}).status_code == 200
        pg = watched.page
        pg.goto(f"{server.url}/runs/{run_id}")
        pg.wait_for_function("() => document.getElementById('live').dataset.state === 'live'",
                             timeout=WAIT_MS)
        assert api.get(f"/api/runs/{run_id}/alerts").json()["alerts"] == []
        assert pg.locator("#alerts-body tr[data-alert-id]").count() == 0
        # The rest (an overflow storm, a NaN loss): error findings, the default rule fires.
        assert api.post("/api/ingest", json={**payload, "records": records[100:],
                                              "final": False}).status_code == 200
        pg.wait_for_function("() => document.querySelectorAll("
                             "'#alerts-body tr[data-alert-id]').length > 0", timeout=WAIT_MS)
        assert pg.evaluate("() => document.getElementById('live').dataset.state") == "live"
        alerts = api.get(f"/api/runs/{run_id}/alerts").json()["alerts"]
        assert alerts and pg.locator("#alerts-body .alert-title").first.inner_text() == (
            alerts[0]["title"])
        watched.assert_clean()
    finally:
        api.close()
        server.stop()
