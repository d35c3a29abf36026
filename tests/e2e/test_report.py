"""The offline HTML report in a real browser: downloaded from a real server (SQLite), saved to a
file, opened through file:// in Debian's headless Chromium with every network request blocked.

The charts must render (each plot holds its data traces) with no console error, no CSP violation,
no dialog (a run and a layer are named like an XSS probe) and no request leaving the file.
The screenshot lands in test-artifacts/report.png for a human to look at.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Route, ViewportSize

from tests.server.wire import LAYERS, batch, layer_stats, new_id, record
from tests.support.browser import Watched
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=alert(1)>"
CONFIG = {"lr": 0.001, "optimizer": {"name": "adamw", "betas": [0.9, 0.999]}, HOSTILE: HOSTILE,
          "amp": True, "seed": None}
CONFIG_ROWS = [[HOSTILE, HOSTILE], ["amp", "true"], ["lr", "0.001"],
               ["optimizer.betas", "[0.9,0.999]"], ["optimizer.name", "adamw"], ["seed", "null"]]
"""The config as the report (and the run page) lists it: dotted keys, sorted, JSON values."""
STEPS = 400
NUM_LAYERS = 8
SKIPPED = {50, 51, 200}
NAN_LOSS = 120
SPIKE = (3, 300)  # (layer, step): the one cell of the heatmap at 90% lost


@pytest.fixture
def viewport() -> ViewportSize:
    return {"width": 1400, "height": 900}


@pytest.fixture
def context_options() -> dict[str, Any]:
    return {"offline": True}


def _layers() -> list[dict[str, Any]]:
    names = [HOSTILE, "embed.weight", 'attn.q,"proj"', "attn.k", "mlp.fc1", "mlp.fc2", "ln.w",
             "head.weight"]
    return [{**LAYERS[0], "index": i, "name": name} for i, name in enumerate(names)]


def _records() -> list[dict[str, Any]]:
    records = []
    scale = 2.0**16
    for step in range(STEPS):
        stats = layer_stats(1.0, NUM_LAYERS)
        stats["zero_frac"] = [0.002 * (i % 4) * (1 + math.sin(step / 40)) for i in
                              range(NUM_LAYERS)]
        stats["underflow_frac"] = [0.0] * NUM_LAYERS
        if step == SPIKE[1]:
            stats["underflow_frac"][SPIKE[0]] = 0.9
        skipped = step in SKIPPED
        after = scale / 2 if skipped else (scale * 2 if step % 100 == 99 else scale)
        records.append(record(
            step, scale_before=scale, scale_after=after, found_inf=skipped, skipped=skipped,
            loss="nan" if step == NAN_LOSS else 3.0 * math.exp(-step / 150) + 0.05 * math.sin(step),
            grad_norm="inf" if skipped else 0.5 + 0.2 * math.cos(step / 7), layers=stats,
        ))
        scale = after
    return records


@pytest.fixture
def report_file(tmp_path: Path) -> Iterator[Path]:
    server = ServerProcess(migrated_sqlite(tmp_path), tmp_path).start()
    try:
        run_id = new_id()
        payload = batch(_records(), run_id=run_id, layers=_layers(), name=HOSTILE,
                        tags=["amp", "post-mortem", HOSTILE], config=CONFIG, final=True)
        with httpx.Client(base_url=server.url, timeout=60.0) as api:
            assert api.post("/api/ingest", json=payload).status_code == 200
            response = api.get(f"/api/runs/{run_id}/export?format=html")
        assert response.status_code == 200, response.text
        path = tmp_path / "report.html"
        path.write_bytes(response.content)
        yield path
    finally:
        server.stop()


def test_report_renders_offline(report_file: Path, watched: Watched) -> None:
    requests: list[str] = []

    def block(route: Route) -> None:
        url = route.request.url
        if url.startswith("file://"):
            route.continue_()
        else:
            requests.append(url)
            route.abort()

    watched.levels = ("error", "warning")  # the report logs nothing, not even a warning
    watched.context.route("**/*", block)
    page = watched.page
    page.goto(report_file.as_uri())
    page.wait_for_selector("body[data-rendered='true']", timeout=30_000)

    traces = page.evaluate("""() => Object.fromEntries(
        ['scale-chart', 'heatmap', 'loss-chart', 'gradnorm-chart'].map((id) => {
          const div = document.getElementById(id);
          return [id, (div.data || []).map((t) => ({
            name: t.name || t.type, n: t.type === 'heatmap' ? t.z.length : t.x.length,
            cols: t.type === 'heatmap' ? t.x.length : null,
            zmax: t.type === 'heatmap' ? Math.max(...t.z.flat()) : null }))];
        }))""")
    assert {t["name"]: t["n"] for t in traces["scale-chart"]} == {
        "loss scale": STEPS, "skipped step (overflow)": len(SKIPPED), "growth": 4}
    (heat,) = traces["heatmap"]
    assert (heat["n"], heat["cols"]) == (NUM_LAYERS, STEPS)
    assert heat["zmax"] > 0.9  # the spike (its layer's zero fraction on top)
    assert traces["loss-chart"][0]["n"] == STEPS
    assert traces["loss-chart"][1]["n"] == 1  # the NaN loss, flagged
    assert traces["gradnorm-chart"][1]["n"] == len(SKIPPED)

    assert page.text_content("#run-name") == HOSTILE
    assert page.locator(".tag").all_text_contents() == ["amp", "post-mortem", HOSTILE]
    assert page.locator("#events-body tr").count() == 2 * len(SKIPPED) + 4
    rows = page.evaluate("""() => [...document.querySelectorAll('#config-body tr')].map(
      (tr) => [...tr.children].map((td) => td.textContent))""")
    assert rows == CONFIG_ROWS
    assert page.evaluate("() => document.querySelectorAll('img').length") == 0

    watched.screenshot("report.png")
    watched.assert_clean()  # no console error or warning, no dialog, no CSP violation
    assert requests == []
