"""A run's context on the page (issue #31), in a real Chromium: its hyperparameters (`config`) as
a table on the run page, and any of their keys as a column of the runs list (kept in the
address). Keys and values are user text: shown as text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.wire import batch, new_id, record
from tests.support.browser import Watched, watch
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.browser

WAIT_MS = 15_000
HOSTILE = "<img src=x onerror=alert(1)>"
CONFIGS: list[dict[str, Any]] = [
    {"lr": 0.0003, "optimizer": {"name": "adamw", "betas": [0.9, 0.95]}, "batch_size": 64,
     HOSTILE: HOSTILE},
    {"lr": 0.1, "optimizer": {"name": "sgd"}, "amp": True},
    {},
]
REASON = f"an fp16 autocast {HOSTILE}"
RUN_PAGE_ROWS = [[HOSTILE, HOSTILE], ["batch_size", "64"], ["lr", "0.0003"],
                 ["optimizer.betas", "[0.9,0.95]"], ["optimizer.name", "adamw"]]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[str]]]:
    tmp = tmp_path_factory.mktemp("run-context")
    server = ServerProcess(migrated_sqlite(tmp), tmp).start()
    ids = []
    try:
        for i, config in enumerate(CONFIGS):
            run_id = new_id()
            payload = batch([record(s) for s in range(20)], run_id=run_id, name=f"run-{i}",
                            config=config, final=True)
            if i == 0:  # why the hook judged this format (wire v6, #30)
                payload["schema_version"] = 6
                payload["run"]["target_format_reason"] = REASON
            response = httpx.post(f"{server.url}/api/ingest", json=payload, timeout=60)
            assert response.status_code == 200, response.text
            ids.append(run_id)
        yield server, ids
    finally:
        server.stop()


def _format_item(watched: Watched) -> list[str]:
    """The run header's format item, its parts' text (label, value, why)."""
    parts: list[str] = watched.js("""() => [...[...document.querySelectorAll(
      '#run-meta .meta-item')].find((item) => item.firstChild.textContent === 'format')
      .children].map((part) => part.textContent)""")
    return parts


def _rows(watched: Watched, selector: str) -> list[list[str]]:
    found: list[list[str]] = watched.js("""(selector) => [...document.querySelectorAll(selector)]
      .map((tr) => [...tr.children].map((td) => td.textContent))""", selector)
    return found


def test_the_run_page_lists_the_hyperparameters(
        served: tuple[ServerProcess, list[str]], watched: Watched) -> None:
    server, ids = served
    pg = watched.page
    pg.goto(f"{server.url}/runs/{ids[0]}")
    pg.locator("#config-body tr").first.wait_for(timeout=WAIT_MS)
    assert _rows(watched, "#config-body tr") == RUN_PAGE_ROWS
    assert pg.inner_text("#config-note") == "5 keys"
    assert pg.locator("#config-panel img").count() == 0
    # The header says which format the run is judged in, and why (as text).
    assert _format_item(watched) == ["format", "fp16", f"({REASON})"]
    assert pg.locator("#run-meta img").count() == 0
    watched.screenshot("run-config-page.png", full_page=False)
    # A run without config says how to send one.
    pg.goto(f"{server.url}/runs/{ids[2]}")
    pg.wait_for_function("() => document.getElementById('config-note').textContent !== ''",
                         timeout=WAIT_MS)
    assert pg.locator("#config-body tr").count() == 0
    assert pg.inner_text("#config-note").startswith("none sent: ampscope.watch(..., config=")
    # A run from a client before #30 sent no reason: the format alone.
    assert _format_item(watched) == ["format", "fp16"]
    watched.assert_clean()


def test_any_config_key_is_a_column_of_the_runs_list(
        served: tuple[ServerProcess, list[str]], watched: Watched) -> None:
    server, ids = served
    pg = watched.page
    pg.goto(f"{server.url}/")
    pg.locator(f'tr[data-run-id="{ids[0]}"]').wait_for(timeout=WAIT_MS)
    assert pg.locator("th.config-col").count() == 0  # none until picked
    pg.click("#columns-menu summary")
    offered = pg.locator("#columns-list label").all_inner_texts()
    assert offered == sorted([HOSTILE, "amp", "batch_size", "lr", "optimizer.betas",
                              "optimizer.name"])
    pg.check('#columns-list input[value="lr"]')
    pg.check('#columns-list input[value="optimizer.name"]')
    heads = "() => [...document.querySelectorAll('th.config-col')].map((th) => th.textContent)"
    assert watched.js(heads) == ["lr", "optimizer.name"]
    cells = """(ids) => ids.map((id) => [...document.querySelectorAll(
      `tr[data-run-id="${id}"] td.config-col`)].map((td) => td.textContent))"""
    assert watched.js(cells, ids) == [["0.0003", "adamw"], ["0.1", "sgd"], ["—", "—"]]
    assert pg.evaluate("() => new URLSearchParams(location.search).get('columns')") == (
        "lr,optimizer.name")
    watched.screenshot("runs-config-columns.png")
    # The address keeps the columns: a link (or a reload) shows the same.
    pg.goto(f"{server.url}/?columns=amp")
    pg.locator(f'tr[data-run-id="{ids[1]}"]').wait_for(timeout=WAIT_MS)
    assert watched.js(heads) == ["amp"]
    assert watched.js(cells, ids) == [["—"], ["true"], ["—"]]
    watched.assert_clean()


STEP_CHARTS = ["scale-chart", "loss-chart", "gradnorm-chart", "skiprate-chart", "heatmap",
               "layer-lines"]
READY = "() => window.ampscope && window.ampscope.zoom && window.ampscope.zoom.linked"


def test_a_link_keeps_the_view(served: tuple[ServerProcess, list[str]], watched: Watched) -> None:
    """Zoom, smoothing, the layers drawn as lines and the loss axis go into the address; the
    address opens the same view."""
    server, ids = served
    pg = watched.page
    pg.goto(f"{server.url}/runs/{ids[0]}")
    watched.wait_for(READY)
    watched.js("() => Plotly.relayout(document.getElementById('loss-chart'), "
               "{'xaxis.range': [5, 15]})")
    pg.fill("#smoothing", "0.3")
    pg.dispatch_event("#smoothing", "input")
    watched.js("""() => document.getElementById('heatmap').emit('plotly_click',
      {points: [{y: 'fc1.bias'}]})""")
    pg.click('#loss-chart-axis button[data-scale="log"]')
    query = "() => Object.fromEntries(new URLSearchParams(location.search))"
    want = {"start": "5", "end": "15", "smoothing": "0.3", "layers": "fc1.bias",
            "loss_axis": "log"}
    # Whatever the order the page wrote them in (the click and the axis may land either way).
    watched.wait_for(f"(want) => {{ const got = ({query})(); return Object.keys(got).length "
                     "=== Object.keys(want).length && Object.entries(want).every(([k, v]) => "
                     "got[k] === v); }", arg=want)
    link = pg.url

    opened = watch(watched.context.new_page())
    fresh = opened.page
    fresh.goto(link)
    fresh.wait_for_function(READY, timeout=WAIT_MS)
    fresh.wait_for_function("() => window.ampscope.layerLines.shown.length === 1",
                            timeout=WAIT_MS)
    view = fresh.evaluate("""(ids) => ({
      ranges: ids.map((id) => Array.from(document.getElementById(id)._fullLayout.xaxis.range)),
      smoothing: document.getElementById('smoothing').value,
      shown: window.ampscope.layerLines.shown.map((i) => window.ampscope.layerNames[i]),
      lossAxis: document.getElementById('loss-chart')._fullLayout.yaxis.type,
      gradAxis: document.getElementById('gradnorm-chart')._fullLayout.yaxis.type,
      pressed: document.querySelector('#loss-chart-axis [aria-pressed="true"]').dataset.scale,
      weight: window.ampscope.loss.weight })""", STEP_CHARTS)
    assert view == {"ranges": [[5, 15]] * len(STEP_CHARTS), "smoothing": "0.3",
                    "shown": ["fc1.bias"], "lossAxis": "log", "gradAxis": "log",
                    "pressed": "log", "weight": 0.3}
    assert fresh.evaluate(query) == want  # opening it changed nothing
    opened.screenshot("run-view-from-link.png")
    opened.assert_clean()
    watched.assert_clean()


def test_the_section_bar_moves_through_the_page(
        served: tuple[ServerProcess, list[str]], watched: Watched) -> None:
    """A sticky bar of the page's sections: a link scrolls its section under the bars and is
    marked current; the bar stays in view."""
    server, ids = served
    pg = watched.page
    pg.goto(f"{server.url}/runs/{ids[0]}")
    watched.wait_for(READY)
    pg.locator("#findings").wait_for(state="visible", timeout=WAIT_MS)
    links = pg.locator("#section-bar a:visible").all_inner_texts()
    assert links == ["Findings", "Notes", "Hyperparameters", "Loss scale", "Loss", "Grad norm",
                     "Skip rate", "Per-layer", "Layer range", "What-if", "Formats", "Layers",
                     "Events", "Alerts"]  # no Optimizers: this run's panel is hidden
    current = "() => document.querySelector('#section-bar [aria-current]')?.textContent"
    pg.click("#section-bar a:text-is('Per-layer')")
    watched.wait_for(f"() => ({current})() === 'Per-layer'")
    where = watched.js("""() => {
      const section = document.querySelector('[data-section="Per-layer"]');
      const bar = document.getElementById('section-bar').getBoundingClientRect();
      return {bar: [bar.top, bar.bottom], top: section.getBoundingClientRect().top,
              hash: location.hash}; }""")
    assert where["bar"][0] == 48  # stuck under the top bar
    assert where["bar"][1] <= where["top"] <= where["bar"][1] + 8
    assert where["hash"] == "#section-per-layer"
    watched.screenshot("run-section-bar.png", full_page=False)
    # The last sections cannot reach the top of the page: the one picked is still current.
    pg.click("#section-bar a:text-is('Alerts')")
    watched.wait_for(f"() => ({current})() === 'Alerts'")
    watched.assert_clean()


def test_the_runs_list_uses_a_wide_screen_and_has_shortcuts(
        served: tuple[ServerProcess, list[str]], watched: Watched) -> None:
    """At 1,920 px the runs list is not held to 1,400; `/` focuses the filter, `?` lists the
    shortcuts, Escape closes the list."""
    server, ids = served
    pg = watched.page
    pg.set_viewport_size({"width": 1920, "height": 1080})
    pg.goto(f"{server.url}/")
    pg.locator(f'tr[data-run-id="{ids[0]}"]').wait_for(timeout=WAIT_MS)
    width = watched.js("() => document.querySelector('main').getBoundingClientRect().width")
    assert width == 1920
    pg.keyboard.press("/")
    assert watched.js("() => document.activeElement.id") == "filter"
    pg.keyboard.type("run-1")  # typed into the filter, not taken as shortcuts
    assert pg.input_value("#filter") == "run-1"
    pg.locator("#filter").blur()
    pg.keyboard.press("?")
    assert pg.locator("#shortcuts").is_visible()
    assert pg.locator("#shortcuts dt").all_inner_texts() == ["/", "?", "Esc"]
    pg.keyboard.press("Escape")
    assert pg.locator("#shortcuts").is_hidden()
    watched.assert_clean()


def test_the_runs_list_groups_by_project_tag_or_config(
        served: tuple[ServerProcess, list[str]], watched: Watched) -> None:
    server, ids = served
    pg = watched.page
    pg.goto(f"{server.url}/")
    pg.locator(f'tr[data-run-id="{ids[0]}"]').wait_for(timeout=WAIT_MS)
    layout = """() => [...document.querySelectorAll('#runs-body tr')].map((tr) =>
      tr.classList.contains('group-head') ? `# ${tr.textContent}` : tr.dataset.runId)"""
    assert watched.js(layout) == [ids[2], ids[1], ids[0]]  # newest first, no groups
    pg.select_option("#group-by", "config:optimizer.name")
    # Groups in the order of their first run (newest first), runs without the key last.
    assert watched.js(layout) == ["# sgd · 1 run", ids[1], "# adamw · 1 run", ids[0],
                                  "# (none) · 1 run", ids[2]]
    assert pg.evaluate("() => new URLSearchParams(location.search).get('group')") == (
        "config:optimizer.name")
    watched.screenshot("runs-grouped.png", full_page=False)
    pg.goto(f"{server.url}/?group=project")
    pg.locator(f'tr[data-run-id="{ids[0]}"]').wait_for(timeout=WAIT_MS)
    assert watched.js(layout) == ["# default · 3 runs", ids[2], ids[1], ids[0]]
    assert pg.input_value("#group-by") == "project"
    watched.assert_clean()
