"""The pages' rough edges in a real browser (issue #14): the runs list fits 1,440 px without
horizontal scroll even with long names and tags, unknown run and compare ids get a friendly
not-found state (no raw "GET … → 404"), the run page offers its report and exports, and an
unknown id quoted from the address stays text. No console error, no CSP violation."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import ViewportSize

from tests.server.findings.payloads import healthy_batch, troubled_batch
from tests.server.wire import batch_v2, layer_stats, new_id, record_v2
from tests.support.browser import Watched
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.browser

WAIT_MS = 15_000
WIDTH = 1440
LONG_TAGS = ["scenario", "transformer-encoder-large-with-a-very-long-tag-name", "bf16-vs-fp16",
             "experiment-2026-12-01-learning-rate-sweep"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[str]]]:
    tmp = tmp_path_factory.mktemp("pages-browser")
    server = ServerProcess(migrated_sqlite(tmp), tmp).start()
    ids = []
    try:
        for i, make in enumerate([troubled_batch, healthy_batch, troubled_batch]):
            run_id = new_id()
            payload = make(run_id, name=f"a-rather-long-run-name-for-layout-checks-{i}"
                                        "-seed-1234-lr-3e-4-warmup-2000")
            payload["run"]["tags"] = LONG_TAGS
            response = httpx.post(f"{server.url}/api/ingest", json=payload, timeout=30)
            assert response.status_code == 200, response.text
            ids.append(run_id)
        yield server, ids
    finally:
        server.stop()


@pytest.fixture
def viewport() -> ViewportSize:
    return {"width": WIDTH, "height": 900}


@pytest.fixture
def console_expected() -> tuple[str, ...]:
    """The not-found pages fetch a missing resource on purpose: the browser logs that 404 itself
    ("Failed to load resource: ... 404 (Not Found)"); any other console error is one of ours."""
    return ("404 (Not Found)",)


def test_runs_list_fits_1440_px(served: tuple[ServerProcess, list[str]],
                                watched: Watched) -> None:
    server, ids = served
    pg = watched.page
    pg.goto(f"{server.url}/")
    pg.locator(f'tr[data-run-id="{ids[-1]}"]').wait_for(timeout=WAIT_MS)
    watched.screenshot("runs-1440.png")
    widths = pg.evaluate("""() => {
      const wrap = document.getElementById('runs').parentElement;
      return {doc: document.documentElement.scrollWidth,
              view: document.documentElement.clientWidth,
              table: wrap.scrollWidth, box: wrap.clientWidth};
    }""")
    assert widths["doc"] <= widths["view"], widths
    assert widths["table"] <= widths["box"], widths  # no horizontal scroll inside the panel
    # A tag is shown whole (nothing clipped), on whole lines of 20 px: it wraps between its parts
    # (where, test_runs_pages_browser.py::test_a_long_tag_is_shown_whole reads).
    shown = pg.evaluate("""() => [...document.querySelectorAll('td.tags .tag')].map((t) => [
      t.textContent, t.scrollWidth > t.clientWidth, t.getBoundingClientRect().height % 20])""")
    assert {(text, clipped, rest) for text, clipped, rest in shown} == {
        (tag, False, 0) for tag in LONG_TAGS}
    watched.assert_clean()


def test_unknown_run_is_a_friendly_not_found(served: tuple[ServerProcess, list[str]],
                                             watched: Watched) -> None:
    server, _ = served
    pg = watched.page
    response = pg.goto(f"{server.url}/runs/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
    assert response is not None and response.status == 404  # not a 200 over empty charts
    banner = pg.locator("#error")
    banner.wait_for(state="visible", timeout=WAIT_MS)
    assert banner.inner_text() == (
        "This server has no run “<img src=x onerror=alert(1)>”: it may have been deleted, or "
        "the address is mistyped. Back to the runs list")
    assert banner.locator("a").get_attribute("href") == "/"
    assert pg.locator("#error img").count() == 0  # the id stayed text
    assert pg.locator("#run-name").inner_text() == "Run not found"
    assert "→ 404" not in banner.inner_text()
    pg.wait_for_function("() => document.getElementById('live').dataset.state === 'closed'",
                         timeout=WAIT_MS)
    assert pg.locator("#delete-run").count() == 0  # nothing to delete (no auth: admin)
    watched.assert_clean()


def test_unknown_compare_id_is_a_friendly_not_found(served: tuple[ServerProcess, list[str]],
                                                    watched: Watched) -> None:
    server, ids = served
    pg = watched.page
    pg.goto(f"{server.url}/compare?runs={ids[0]},nope")
    banner = pg.locator("#error")
    banner.wait_for(state="visible", timeout=WAIT_MS)
    assert banner.inner_text() == (
        "Nothing to compare: run 'nope' not found (the runs of this page come from its "
        "address, ?runs=…). Back to the runs list")
    # Nothing streams: the indicator does not say "connecting" for ever.
    assert pg.locator("#live-text").inner_text() == "not connected"
    watched.assert_clean()


def test_run_page_offers_report_and_exports(served: tuple[ServerProcess, list[str]],
                                            watched: Watched) -> None:
    server, ids = served
    pg = watched.page
    pg.goto(f"{server.url}/runs/{ids[0]}")
    pg.locator("#run-actions").wait_for(state="visible", timeout=WAIT_MS)
    links = pg.evaluate("""() => [...document.querySelectorAll('#run-actions a')].map(
      (a) => [a.textContent, a.getAttribute('href'), a.hasAttribute('download')])""")
    base = f"/api/runs/{ids[0]}/export?format="
    assert links == [["Report (HTML)", base + "html", True], ["Export JSON", base + "json", True],
                     ["Export CSV", base + "csv", True], ["CSV (wide)", base + "csv_wide", True]]
    for _, href, _ in links:
        response = httpx.get(f"{server.url}{href}", timeout=30)
        assert response.status_code == 200, (href, response.text[:200])
        if href.endswith("json"):
            assert response.json()["run"]["id"] == ids[0]
        assert response.headers["content-disposition"].startswith("attachment")
    pg.locator('#findings li[data-identity="overflow_storm"]').wait_for(timeout=WAIT_MS)
    watched.assert_clean()


STEP_CHARTS = ["scale-chart", "loss-chart", "gradnorm-chart", "skiprate-chart", "heatmap",
               "layer-lines"]


def test_run_page_reads_top_down_with_one_step_axis(
    served: tuple[ServerProcess, list[str]], watched: Watched
) -> None:
    server, ids = served
    pg = watched.page
    pg.goto(f"{server.url}/runs/{ids[0]}")
    pg.locator('#findings li[data-identity="overflow_storm"]').wait_for(timeout=WAIT_MS)
    # Overview first: the scale, loss and grad-norm charts come before the per-layer views.
    order = pg.evaluate(f"""() => {{
      const ids = {STEP_CHARTS!r};
      const nodes = ids.map((id) => document.getElementById(id));
      return nodes.every((n, i) => i === 0 ||
        !!(nodes[i - 1].compareDocumentPosition(n) & Node.DOCUMENT_POSITION_FOLLOWING));
    }}""")
    assert order
    # The per-layer range starts with the layers the first finding cites (at most 3).
    storm = httpx.get(f"{server.url}/api/runs/{ids[0]}/findings", timeout=30).json()
    cited = next(f["layers"] for f in storm["findings"] if f["layers"])[:3]
    shown = "() => window.ampscope.layerLines.shown.map((i) => window.ampscope.layerNames[i])"
    pg.wait_for_function(f"(want) => JSON.stringify(({shown})()) === JSON.stringify(want)",
                         arg=cited, timeout=WAIT_MS)
    # Every step chart's plot area starts and ends at the same x (same margins, same width).
    sizes = "ids => ids.map((id) => { const s = document.getElementById(id)._fullLayout._size;" \
            " return [s.l, s.w]; })"
    pg.wait_for_function(f"(ids) => new Set(({sizes})(ids).map(String)).size === 1",
                         arg=STEP_CHARTS, timeout=WAIT_MS)
    # Zoom one: all follow; reset another: all reset.
    pg.evaluate("() => Plotly.relayout(document.getElementById('loss-chart'), "
                "{'xaxis.range': [100, 200]})")
    ranges = "ids => ids.map((id) => document.getElementById(id).layout.xaxis.range)"
    pg.wait_for_function(f"(ids) => ({ranges})(ids).every((r) => r && r[0] === 100 && "
                         "r[1] === 200)", arg=STEP_CHARTS, timeout=WAIT_MS)
    pg.evaluate("() => Plotly.relayout(document.getElementById('heatmap'), "
                "{'xaxis.autorange': true})")
    pg.wait_for_function("(ids) => ids.every((id) => document.getElementById(id).layout.xaxis"
                         ".autorange === true)", arg=STEP_CHARTS, timeout=WAIT_MS)
    watched.screenshot("run-top-down.png")
    watched.assert_clean()


MARGIN_RELAYOUTS = """
  window.__marginRelayouts = [];
  window.addEventListener('DOMContentLoaded', () => {
    const relayout = window.Plotly.relayout;
    window.Plotly.relayout = (div, update, ...rest) => {
      if (typeof update === 'object' && Object.keys(update).some((k) => k.startsWith('margin')))
        window.__marginRelayouts.push(div.id);
      return relayout(div, update, ...rest);
    };
  });
"""


def test_run_page_draws_its_step_charts_once_with_shared_margins(
    served: tuple[ServerProcess, list[str]], watched: Watched
) -> None:
    """The step charts are drawn with the margins of the widest labels (the heatmap's layer
    names) from the start: lining them up after drawing relaid out (redrew) every chart."""
    server, ids = served
    pg = watched.page
    pg.add_init_script(MARGIN_RELAYOUTS)
    pg.goto(f"{server.url}/runs/{ids[0]}")
    pg.locator('#findings li[data-identity="overflow_storm"]').wait_for(timeout=WAIT_MS)
    pg.wait_for_function("() => window.ampscope.layerLines.shown.length > 0", timeout=WAIT_MS)
    margins = pg.evaluate("(ids) => ids.map((id) => { const s = document.getElementById(id)"
                          "._fullLayout._size; return [s.l, s.r]; })", STEP_CHARTS)
    assert len(set(map(tuple, margins))) == 1, margins
    assert margins[0][0] > 56  # wider than a line chart's own: the layer names decided it
    assert pg.evaluate("window.__marginRelayouts") == []
    watched.assert_clean()


def test_compare_shows_each_runs_root_cause(served: tuple[ServerProcess, list[str]],
                                            watched: Watched) -> None:
    server, ids = served
    pg = watched.page
    pg.goto(f"{server.url}/compare?runs={ids[0]},{ids[1]}")
    for run_id in ids[:2]:
        top = httpx.get(f"{server.url}/api/runs/{run_id}", timeout=30).json()["top_finding"]
        cell = pg.locator(f'li[data-run-id="{run_id}"] .compare-run-finding')
        cell.wait_for(timeout=WAIT_MS)
        assert cell.get_attribute("data-kind") == top["kind"]
        assert cell.inner_text() == f"{top['severity'].upper()} {top['title']}"
        assert cell.evaluate("(e) => e.scrollWidth <= e.clientWidth")  # wrapped, not cut
    watched.screenshot("compare-findings.png", full_page=False)
    watched.assert_clean()


def test_a_scripted_session_logs_no_error(served: tuple[ServerProcess, list[str]],
                                          watched: Watched) -> None:
    """Clicks and zooms over every control of the run page and the runs list."""
    server, ids = served
    pg = watched.page
    pg.goto(f"{server.url}/runs/{ids[0]}")
    pg.locator('#findings li[data-identity="overflow_storm"]').wait_for(timeout=WAIT_MS)
    for title in pg.locator("#findings .finding-title").all():
        title.click()
    heat = pg.locator("#heatmap .nsewdrag")
    heat.scroll_into_view_if_needed()
    box = heat.bounding_box()
    assert box is not None
    for row in (0, 1, 0):  # add, add, remove
        pg.mouse.click(box["x"] + box["width"] / 2, box["y"] + (row + 0.5) * box["height"] / 2)
    options = pg.locator("#stat-select option").evaluate_all("os => os.map((o) => o.value)")
    assert "inf_count" in options
    for stat in options:
        pg.select_option("#stat-select", stat)
        pg.wait_for_function("(s) => window.ampscope.heatmap.stat === s", arg=stat,
                             timeout=WAIT_MS)
    pg.select_option("#source-select", "activation")
    pg.select_option("#source-select", "param")
    scale = pg.locator("#scale-chart .nsewdrag")
    scale.scroll_into_view_if_needed()
    sbox = scale.bounding_box()
    assert sbox is not None
    y = sbox["y"] + sbox["height"] / 2
    pg.mouse.move(sbox["x"] + sbox["width"] * 0.3, y)
    pg.mouse.down()
    pg.mouse.move(sbox["x"] + sbox["width"] * 0.6, y, steps=5)
    pg.mouse.up()
    pg.wait_for_function("() => !document.getElementById('heatmap').layout.xaxis.autorange",
                         timeout=WAIT_MS)
    pg.mouse.dblclick(sbox["x"] + sbox["width"] / 2, y)
    pg.locator("#smoothing").fill("0.9")
    pg.evaluate("""() => { const s = document.getElementById('whatif-k'); s.value = '5';
                           s.dispatchEvent(new Event('input')); }""")
    assert pg.locator("#whatif-empty").is_visible()  # these runs carry no histograms
    pg.goto(f"{server.url}/")
    pg.locator(f'tr[data-run-id="{ids[0]}"]').wait_for(timeout=WAIT_MS)
    for key in ("name", "steps", "underflow", "headroom", "started"):
        pg.click(f'#runs th[data-sort="{key}"]')
    pg.fill("#filter", "checks-1")
    pg.fill("#filter", "")
    watched.assert_clean()


LONE_EVENT_STEP = 1234
DENSE_STEPS = 2000


def _lone_event_batch(run_id: str) -> dict[str, object]:
    """2,000 steps with layer statistics at every step, one inf in fc1.bias at step 1234 only."""
    records = []
    for step in range(DENSE_STEPS):
        rec = record_v2(step)
        rec["layers"] = layer_stats(1.0)
        rec["layers"]["nan_count"] = [0, 0]
        rec["layers"]["inf_count"] = [0, 5 if step == LONE_EVENT_STEP else 0]
        records.append(rec)
    return batch_v2(records, run_id=run_id, name="lone-event", final=True)


def test_a_lone_event_in_the_heatmap_is_visible(served: tuple[ServerProcess, list[str]],
                                                watched: Watched) -> None:
    """A heatmap column of a 2,000-step run is under a pixel wide: the one step where a layer
    overflowed is also marked with a square of fixed size, whatever the zoom. (And a constant
    series stays a flat line once smoothed.)"""
    server, _ = served
    pg = watched.page
    run_id = new_id()
    response = httpx.post(f"{server.url}/api/ingest", json=_lone_event_batch(run_id), timeout=60)
    assert response.status_code == 200, response.text
    pg.goto(f"{server.url}/runs/{run_id}")
    pg.locator("#heatmap .nsewdrag").wait_for(timeout=WAIT_MS)
    pg.select_option("#stat-select", "inf_count")
    pg.wait_for_function("() => window.ampscope.heatmap.stat === 'inf_count' && "
                         "document.getElementById('heatmap').data.length === 2", timeout=WAIT_MS)
    marked, columns = pg.evaluate("""() => {
      const [heat, t] = document.getElementById('heatmap').data;
      return [[Array.from(t.x), Array.from(t.y), Array.from(t.text)], Array.from(heat.x)]; }""")
    # One marker, on the column (a downsampled bucket of steps) that holds step 1234.
    [bucket], names, counts = marked
    assert (names, counts) == (["fc1.bias"], [5])
    after = columns[columns.index(bucket) + 1]
    assert bucket <= LONE_EVENT_STEP < after
    column_px = pg.evaluate("""() => { const l = document.getElementById('heatmap')._fullLayout;
      return l._size.w / (l.xaxis.range[1] - l.xaxis.range[0]); }""")
    assert column_px < 1  # the heatmap's own cell for that step: a sliver
    box = pg.locator("#heatmap .scatterlayer .point").bounding_box()
    assert box is not None and box["width"] >= 6 and box["height"] >= 6, box
    # A statistic without events draws no markers.
    pg.select_option("#stat-select", "zero_frac")
    pg.wait_for_function("() => window.ampscope.heatmap.stat === 'zero_frac' && "
                         "document.getElementById('heatmap').data.length === 1", timeout=WAIT_MS)
    pg.select_option("#stat-select", "inf_count")
    pg.locator("#heatmap .scatterlayer .point").wait_for(timeout=WAIT_MS)
    # The constant grad norm (0.75 at every step) is smoothed to exactly 0.75: no rounding
    # wiggle for the autorange to zoom into.
    smoothed = pg.evaluate("""() => document.getElementById('gradnorm-chart').data
      .filter((t) => t.name.endsWith('(smoothed)')).map((t) => Array.from(new Set(t.y)))""")
    assert smoothed == [[0.75]]
    watched.screenshot("heatmap-lone-event.png")
    watched.assert_clean()


def test_a_run_without_a_scaler_says_why_it_has_no_scale_chart(
        served: tuple[ServerProcess, list[str]], watched: Watched) -> None:
    """A BF16 run (``watch(model, None, optimizer)``) sends null scales: the scale panel says
    why it is empty, and a NaN gradient the optimizer applied is a `non-finite` event; a run
    with a scaler shows its chart and no such note."""
    server, ids = served
    pg = watched.page
    run_id = new_id()
    records = [record_v2(step, scale_before=None, scale_after=None, growth_tracker=None,
                         skipped=False, found_inf=step == 7,
                         nonfinite=[{"layer": 1, "kind": "nan"}] if step == 7 else None)
               for step in range(20)]
    payload = batch_v2(records, run_id=run_id, name="bf16-no-scaler", final=True)
    response = httpx.post(f"{server.url}/api/ingest", json=payload, timeout=30)
    assert response.status_code == 200, response.text
    pg.goto(f"{server.url}/runs/{run_id}")
    pg.locator("#loss-chart .nsewdrag").wait_for(timeout=WAIT_MS)
    pg.locator("#scale-empty").wait_for(state="visible", timeout=WAIT_MS)
    assert "no GradScaler" in pg.locator("#scale-empty").inner_text()
    row = pg.locator('#events-body tr[data-kind="nonfinite"]')  # applied, not skipped
    row.wait_for(timeout=WAIT_MS)
    assert row.get_attribute("data-step") == "7" and "non-finite" in row.inner_text()
    row.locator("summary").click()
    assert "fc1.bias" in row.locator(".bad-layers").inner_text()
    pg.goto(f"{server.url}/runs/{ids[1]}")
    pg.locator("#scale-chart .nsewdrag").wait_for(timeout=WAIT_MS)
    pg.locator("#loss-chart .nsewdrag").wait_for(timeout=WAIT_MS)
    assert pg.locator("#scale-empty").is_hidden()
    watched.assert_clean()
