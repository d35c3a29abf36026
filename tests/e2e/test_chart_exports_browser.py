"""Chart controls under the page's CSP (issue #31), in a real Chromium: plotly's "Download plot
as a png" saves a PNG file with no CSP violation; no modebar button or link points off the
server (plotly's "Share chart..." uploads to Chart Studio by default); the run page's stacked
step charts share one x range from the first render."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.server.findings.payloads import troubled_batch
from tests.server.wire import new_id
from tests.support.browser import Watched
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.browser

WAIT_MS = 15_000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEP_CHARTS = ["scale-chart", "loss-chart", "gradnorm-chart", "skiprate-chart", "heatmap",
               "layer-lines"]
MODEBAR = ["Download plot as a PNG", "Zoom", "Pan", "Zoom in", "Zoom out", "Reset axes"]
"""Every modebar button of a step chart, in order: nothing that leaves the server."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    tmp = tmp_path_factory.mktemp("chart-exports")
    server = ServerProcess(migrated_sqlite(tmp), tmp).start()
    run_id = new_id()
    try:
        response = httpx.post(f"{server.url}/api/ingest", json=troubled_batch(run_id), timeout=60)
        assert response.status_code == 200, response.text
        yield server, run_id
    finally:
        server.stop()


def _open_run(watched: Watched, served: tuple[ServerProcess, str]) -> None:
    server, run_id = served
    watched.page.goto(f"{server.url}/runs/{run_id}")
    watched.page.locator("#loss-chart .nsewdrag").wait_for(timeout=WAIT_MS)
    watched.wait_for("() => window.ampscope && window.ampscope.zoom.linked !== undefined")


def test_png_download_saves_a_png_under_the_csp(
        served: tuple[ServerProcess, str], watched: Watched, tmp_path: Path) -> None:
    _open_run(watched, served)
    pg = watched.page
    pg.hover("#loss-chart .nsewdrag")
    with pg.expect_download(timeout=WAIT_MS) as info:
        pg.click('#loss-chart .modebar-btn[data-title="Download plot as a PNG"]')
    saved = tmp_path / info.value.suggested_filename
    info.value.save_as(saved)
    assert saved.suffix == ".png"
    data = saved.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    watched.assert_clean()  # no CSP violation (blob: images are the page's own)


def test_no_chart_control_points_off_the_server(
        served: tuple[ServerProcess, str], watched: Watched) -> None:
    server, _ = served
    _open_run(watched, served)
    pg = watched.page
    titles = watched.js("""(ids) => ids.map((id) => [...document.querySelectorAll(
      `#${id} .modebar-btn`)].map((b) => b.getAttribute('data-title')))""", STEP_CHARTS)
    assert titles == [MODEBAR] * len(STEP_CHARTS)
    hrefs: list[str] = watched.js("""() => [...document.querySelectorAll('a[href]')]
      .map((a) => a.href)""")
    origin = urlsplit(server.url)
    off = [h for h in hrefs if urlsplit(h)[:2] != origin[:2]]
    assert off == []
    assert pg.locator("text=Share chart").count() == 0
    watched.assert_clean()


def test_stacked_step_charts_share_the_x_range_on_first_render(
        served: tuple[ServerProcess, str], watched: Watched) -> None:
    _open_run(watched, served)
    ranges = watched.js("""(ids) => ids.map((id) =>
      Array.from(document.getElementById(id)._fullLayout.xaxis.range))""", STEP_CHARTS)
    assert ranges == [ranges[0]] * len(STEP_CHARTS), dict(zip(STEP_CHARTS, ranges, strict=True))
    # The plot areas line up too: a step is at the same pixel on every chart.
    lefts = watched.js("""(ids) => ids.map((id) => {
      const l = document.getElementById(id)._fullLayout; return [l._size.l, l._size.w]; })""",
                       STEP_CHARTS)
    assert lefts == [lefts[0]] * len(STEP_CHARTS)
    watched.assert_clean()


def test_a_live_runs_step_charts_start_at_the_same_step(
        served: tuple[ServerProcess, str], watched: Watched) -> None:
    """A run still training (no final batch): its charts grow with it, so only their left edge
    is pinned, at its first step, on every chart alike."""
    server, _ = served
    run_id = new_id()
    payload = troubled_batch(run_id)
    payload["final"] = False
    response = httpx.post(f"{server.url}/api/ingest", json=payload, timeout=60)
    assert response.status_code == 200, response.text
    watched.page.goto(f"{server.url}/runs/{run_id}")
    watched.page.locator("#loss-chart .nsewdrag").wait_for(timeout=WAIT_MS)
    watched.wait_for("() => window.ampscope && window.ampscope.zoom.linked !== undefined")
    lefts = watched.js("""(ids) => ids.map((id) =>
      document.getElementById(id)._fullLayout.xaxis.range[0])""", STEP_CHARTS[:5])
    assert lefts == [0] * 5
    watched.assert_clean()
