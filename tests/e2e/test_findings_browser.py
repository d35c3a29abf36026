"""Findings in a real browser: a run trained on the CPU with real FP16 AMP and watched by the
real hook (an init_scale far too high, then six steps whose loss is multiplied by 1e8: an
overflow storm whose layers the hook names), served by a real server (SQLite). The run page
must show the findings first and a click on one must zoom the loss-scale chart to its steps
and show its layers' lines; the runs list must show the most severe finding. No console error,
no CSP violation."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from playwright.sync_api import ViewportSize
from torch import nn

import ampscope
from tests.support.browser import Watched
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo_model import make_batch, make_training

pytestmark = pytest.mark.browser

STEPS = 80
STORM = range(40, 46)
WAIT_MS = 15_000


def _train(server_url: str) -> str:
    model, scaler, optimizer, gen = make_training(init_scale=2.0**24, growth_interval=50)
    monitor = ampscope.watch(model, scaler, optimizer, run="findings-e2e", server=server_url,
                             layer_every=10)
    try:
        for step in range(STEPS):
            x, y = make_batch(gen)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.mse_loss(model(x).float(), y)
            if step in STORM:
                loss = loss * 1e8  # the scaled backward overflows fp16 on each of these steps
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
    finally:
        monitor.close()
    return monitor.run_id


@pytest.fixture(scope="module")
def served_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    tmp = tmp_path_factory.mktemp("findings-browser")
    server = ServerProcess(migrated_sqlite(tmp), tmp).start()
    try:
        yield server, _train(server.url)
    finally:
        server.stop()


@pytest.fixture
def viewport() -> ViewportSize:
    return {"width": 1400, "height": 900}


def test_run_page_shows_findings_and_a_click_zooms(
    served_run: tuple[ServerProcess, str], watched: Watched
) -> None:
    server, run_id = served_run
    pg = watched.page
    body = httpx.get(f"{server.url}/api/runs/{run_id}/findings", timeout=30).json()
    storm: dict[str, Any] = next(f for f in body["findings"] if f["kind"] == "overflow_storm")
    assert (storm["step_start"], storm["step_end"]) == (40, 45)
    assert storm["layers"], "the hook names the layers that overflowed"

    pg.goto(f"{server.url}/runs/{run_id}")
    item = pg.locator('#findings li[data-kind="overflow_storm"]')
    item.wait_for(timeout=WAIT_MS)
    # The findings panel comes before the charts, most severe first.
    kinds = pg.locator("#findings li").evaluate_all("items => items.map((i) => i.dataset.kind)")
    assert kinds == [f["kind"] for f in body["findings"]]
    assert item.locator(".finding-title").inner_text() == storm["title"]
    assert pg.evaluate("""() => {
      const f = document.getElementById('findings');
      const chart = document.getElementById('scale-chart');
      return !!(f.compareDocumentPosition(chart) & Node.DOCUMENT_POSITION_FOLLOWING);
    }""")

    item.locator(".finding-title").click()
    # rangeOf: the cited steps plus max(5, 10 %) on each side.
    pg.wait_for_function("""() => {
      const r = document.getElementById('scale-chart').layout.xaxis.range;
      return r && Math.round(r[0]) === 35 && Math.round(r[1]) === 50;
    }""", timeout=WAIT_MS)
    # The cited layers are selected once their lines' data has arrived (a fetch): wait for it.
    shown = "() => window.ampscope.layerLines.shown.map((i) => window.ampscope.layerNames[i])"
    pg.wait_for_function(f"(want) => JSON.stringify(({shown})()) === JSON.stringify(want)",
                         arg=storm["layers"], timeout=WAIT_MS)
    names: list[str] = pg.evaluate(shown)
    assert names == storm["layers"]
    watched.screenshot("findings.png")
    watched.assert_clean()


def test_runs_list_shows_the_most_severe_finding(
    served_run: tuple[ServerProcess, str], watched: Watched
) -> None:
    server, run_id = served_run
    pg = watched.page
    top = httpx.get(f"{server.url}/api/runs/{run_id}", timeout=30).json()["top_finding"]
    assert top["severity"] == "error"
    pg.goto(f"{server.url}/")
    cell = pg.locator(f'tr[data-run-id="{run_id}"] td.finding-cell')
    cell.wait_for(timeout=WAIT_MS)
    assert cell.locator(".severity").inner_text().lower() == "error"
    brief = cell.locator(".finding-brief")
    assert brief.inner_text() == top["title"]
    assert len(top["title"]) > 40  # more than one line's width: it wraps, nothing cut
    assert brief.evaluate("(e) => e.scrollHeight <= e.clientHeight && "
                          "e.scrollWidth <= e.clientWidth && e.getClientRects().length === 1 && "
                          "e.getBoundingClientRect().height > 20")
    watched.assert_clean()
