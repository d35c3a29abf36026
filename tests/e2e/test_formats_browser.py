"""The Formats view (#33, "Beyond FP16") in a real Chromium against a real server (SQLite): wire
v8 and v7 batches whose every number is known (`formats_runs`). The run page's section fetches
nothing until it is scrolled to; then it names the layers and recipes of the matrix, shows a
module without a gradient as "not measured" (never 0), lists each recipe's verdict with the
layers it keeps in BF16 and why, and a layer that really trains in a recipe; draws a clicked
cell's trend and its block scales' exponents (a v7 run's: a note), fetches again for another
operand's trend or another sampled step, and, while the run trains, for a new sample unless a
step is picked; a run without formats says so. The compare page sets two runs'
verdicts side by side and their matrices on the same rows (a layer only one run has: absent).
Dark mode keeps every text readable. No console error, no CSP violation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from playwright.sync_api import Browser, Page

from tests.e2e import formats_runs as runs
from tests.e2e.test_dark_mode_browser import CONTRAST
from tests.server.wire import RECIPES, new_id
from tests.support.browser import Watched, artifact, open_watched
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.browser

WAIT_MS = 15_000
ROWS = [runs.NAMES[i] for i in runs.LISTED]
MERGED = [runs.QKV, runs.PROJ, runs.FC1, runs.FC2, runs.HEAD, runs.AUX]
EMPTY = ("No formats samples: this run's hook did not send any (ampscope ≥ wire v7 sends them"
         " every 100 steps; formats_every=0 turns them off)")
FC2_KEEP = ("keep in BF16: blocks.0.mlp.fc2.weight — grad_output, underflow {} vs median 0.05%"
            " (scale pinned at its least in 30% of blocks)")
HEAD_KEEP = ("keep in BF16: head.weight — grad_output, rel. error 0.7: SNR 3.1 dB, under the"
             " 4.77 dB below which a gradient drowns in its quantisation noise")
TIMES = "\u00d7"
BARS_PX = 48 + 44  # the sticky top bar and section bar (section_bar.js)


def scores(*values: str) -> list[str]:
    """Cell texts of the "worst" score, each value followed by the multiplication sign."""
    return [f"{v}{TIMES}" for v in values]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("formats-browser")
    server = ServerProcess(migrated_sqlite(tmp), tmp).start()
    ids = {"sampled": new_id(), "twin": new_id(), "plain": new_id(), "normed": new_id()}
    try:
        for key, make in (("sampled", runs.sampled), ("twin", runs.twin), ("plain", runs.plain),
                          ("normed", runs.normed)):
            response = httpx.post(f"{server.url}/api/ingest", json=make(ids[key]), timeout=60)
            assert response.status_code == 200, response.text
        yield server, ids
    finally:
        server.stop()


def _formats_requests(requests: list[str]) -> list[dict[str, Any]]:
    """The page's /formats and /formats/trend reads, in order: path tail and query."""
    out = []
    for url in requests:
        parsed = urlparse(url)
        if parsed.path.startswith("/api/runs/") and "/formats" in parsed.path:
            out.append({"path": parsed.path.split("/formats", 1)[1] or "/",
                        "query": {k: v[0] for k, v in parse_qs(parsed.query).items()}})
    return out


def _open(watched: Watched, server: ServerProcess, run_id: str) -> list[str]:
    """Open the run page, check nothing of the formats is read before the section is near,
    scroll to it and wait for its first answer. Returns the recorded request URLs (live)."""
    pg = watched.page
    requests: list[str] = []
    pg.on("request", lambda request: requests.append(request.url))
    pg.goto(f"{server.url}/runs/{run_id}")
    watched.wait_for("() => window.ampscope && window.ampscope.formats"
                     " && window.ampscope.whatIf.view !== null")
    assert _formats_requests(requests) == []  # lazy: the section is far below
    pg.locator("#formats-panel").scroll_into_view_if_needed()
    watched.wait_for("() => window.ampscope.formats.loads === 1")
    return requests


def _traces(watched: Watched, chart: str = "formats-matrix") -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = watched.js("""(id) => document.getElementById(id).data.map(
      (t) => ({x: Array.from(t.x), y: Array.from(t.y),
        z: t.z ? t.z.map((r) => Array.from(r)) : null,
        text: Array.isArray(t.text) ? t.text.map((r) => Array.from(r)) : null,
        meta: t.meta ?? null }))""", chart)
    return found


def _cell_point(pg: Page, chart: str, row: int, column: int) -> tuple[float, float]:
    """The page coordinates of a matrix cell's centre, the chart scrolled to the middle."""
    pg.evaluate("(id) => document.getElementById(id).scrollIntoView({block: 'center'})", chart)
    x, y = pg.evaluate("""([id, row, column]) => {
      const div = document.getElementById(id);
      const layout = div._fullLayout, box = div.getBoundingClientRect();
      return [box.left + layout.xaxis._offset + layout.xaxis.l2p(column),
              box.top + layout.yaxis._offset + layout.yaxis.l2p(row)]; }""", [chart, row, column])
    return float(x), float(y)


def _shoot(pg: Page, name: str) -> None:
    """The Formats panel as a human sees it at 1440 px, for test-artifacts/: the window made tall
    enough for the whole panel under the sticky bars (which would cover an element screenshot's
    top otherwise), no hover open; the window's size is restored after."""
    size = pg.viewport_size
    assert size is not None
    pg.mouse.move(0, 0)
    height = pg.evaluate("() => document.getElementById('formats-panel').offsetHeight")
    pg.set_viewport_size({"width": size["width"], "height": int(height) + BARS_PX + 16})
    pg.evaluate("""(bars) => window.scrollTo(0, document.getElementById('formats-panel')
      .getBoundingClientRect().top + window.scrollY - bars - 8)""", BARS_PX)
    pg.locator("#formats-panel").screenshot(path=str(artifact(name)))
    pg.set_viewport_size(size)


def _verdicts(watched: Watched) -> list[list[str]]:
    """Each recipe's line: its mark, its summary, and its keep-list's lines."""
    found: list[list[str]] = watched.js("""() => [...document.querySelectorAll(
      '#formats-verdicts li.formats-verdict')].map((li) => [li.dataset.recipe,
        li.querySelector('.verdict-mark').textContent,
        li.querySelector('.verdict-summary').textContent,
        ...[...li.querySelectorAll('.formats-keep li')].map((k) => k.textContent)])""")
    return found


def test_the_matrix_shows_every_layer_and_recipe_and_what_was_not_measured(
        served: tuple[ServerProcess, dict[str, str]], watched: Watched) -> None:
    server, ids = served
    pg = watched.page
    requests = _open(watched, server, ids["sampled"])
    assert _formats_requests(requests) == [{"path": "/", "query": {}}]
    measured, nan, absent = _traces(watched)
    assert measured["y"] == nan["y"] == ROWS  # table order, the first on top
    assert measured["x"] == RECIPES
    aux = ROWS.index(runs.AUX)
    # The module without a gradient: a gap in the coloured trace (never 0), a cell of its own.
    assert measured["z"][aux] == [None] * 6
    assert nan["z"][aux] == [1] * 6 and nan["text"][aux] == ["not measured"] * 6
    assert all(v is None for r, row in enumerate(nan["z"]) if r != aux for v in row)
    assert all(v is None for row in absent["z"] for v in row)
    svg = pg.locator("#formats-matrix").text_content() or ""
    assert svg.count("not measured") == 6
    # The worst score: E4M3 0.52x, E5M2 gradients 1.1x, FP4 ~11x and 6.6x; the kept cells say so.
    fc2, head = ROWS.index(runs.FC2), ROWS.index(runs.HEAD)
    assert measured["text"][fc2] == [*scores("1.1", "0.52", "0.52"), f"12{TIMES} · BF16",
                                     *scores("11", "6.6")]
    assert measured["text"][head][5] == f"14{TIMES} · BF16"
    outlined = watched.js("() => document.getElementById('formats-matrix').layout.shapes.map("
                          "(s) => [s.y0 + 0.5, s.x0 + 0.5])")
    assert outlined == [[fc2, 3], [head, 5]]
    # The hover: all five numbers of the cell.
    pg.mouse.move(*_cell_point(pg, "formats-matrix", ROWS.index(runs.QKV), 0))
    pg.locator("#formats-matrix .hoverlayer .hovertext").wait_for(timeout=WAIT_MS)
    hover = pg.locator("#formats-matrix .hoverlayer").text_content()
    assert hover == (f"{runs.QKV} · fp8_tensorwise" "underflow 0% · saturated 0%"
                     "rel. error 0.053 (SNR 25.5 dB)" "blocks' scale at least 0% · at greatest 0%")
    pg.mouse.move(*_cell_point(pg, "formats-matrix", aux, 3))
    watched.wait_for("() => (document.querySelector('#formats-matrix .hoverlayer').textContent"
                     " || '').includes('not measured')")
    # Another statistic: the same cells, its own numbers.
    pg.select_option("#formats-stat", "underflow_frac")
    watched.wait_for("() => document.getElementById('formats-matrix').data[0].text[2][3]"
                     " === '12% · BF16'")
    assert _traces(watched)[1]["text"][aux] == ["not measured"] * 6
    assert watched.js("() => document.getElementById('formats-legend-max').textContent") == "100%"
    watched.assert_clean()


def test_the_verdicts_say_which_layers_stay_in_bf16(
        served: tuple[ServerProcess, dict[str, str]], watched: Watched) -> None:
    server, ids = served
    _open(watched, server, ids["sampled"])
    pg = watched.page
    assert pg.inner_text("#formats-verdicts .formats-headline") == (
        "Fits with every layer: fp8_tensorwise, fp8_rowwise, fp8_block128, mxfp4 · "
        "Needs layers kept in BF16: mxfp8 (1 of 5 layers), nvfp4 (1 of 5 layers)")
    fits = [[r, "fits", f"{r}: all 5 layers fit"] for r in RECIPES]
    assert _verdicts(watched) == [
        *fits[:3],
        ["mxfp8", "1 in BF16", "mxfp8: 1 of 5 layers need BF16 (blocks.0.mlp.fc2.weight)",
         FC2_KEEP.format("8%")],  # the median of the last three samples: 5, 8, 12 %
        fits[4],
        ["nvfp4", "1 in BF16", "nvfp4: 1 of 5 layers need BF16 (head.weight)", HEAD_KEEP]]
    assert pg.inner_text("#formats-note") == (
        f"step 200 · 5 layers {TIMES} 6 recipes · 3 sampled steps · verdicts over the last 3"
        " samples")
    assert pg.locator('#formats-verdicts li[data-recipe="mxfp8"] .formats-keep').is_visible()
    # The layer that really trains in a recipe, with the scales it used at step 200.
    assert pg.locator("#formats-verdicts .formats-trained").all_inner_texts() == [
        "head.weight trains in fp8_tensorwise: scale 112 (input amax 4), scale 112 (weight amax"
        " 4), scale 0.219 (grad_output amax 262144)"]
    watched.assert_clean()


def test_a_layernorm_is_judged_apart_as_a_fully_quantised_run_would_quantise_it(
        served: tuple[ServerProcess, dict[str, str]], watched: Watched) -> None:
    """The norm's row: its weight measured, its input and gradient "not measured"; the layers'
    verdicts as without it (5 layers), and under MXFP4 and NVFP4 a line that keeps its affine
    weight in BF16 if quantised, beside the GEMM weights' median underflow."""
    server, ids = served
    _open(watched, server, ids["normed"])
    pg = watched.page
    measured, nan, _ = _traces(watched)
    assert measured["y"] == [*ROWS, runs.LN]
    # The input, selected by default; kept whole under the two FP4 recipes, as a layer is.
    assert nan["text"][-1] == ["not measured"] * 4 + ["not measured · BF16"] * 2
    assert pg.inner_text("#formats-verdicts .formats-headline") == (
        "Fits with every layer: fp8_tensorwise, fp8_rowwise, fp8_block128, mxfp4 · "
        "Needs layers kept in BF16: mxfp8 (1 of 5 layers), nvfp4 (1 of 5 layers) · "
        "Norms' affine weights to keep in BF16 if quantised: mxfp4 (1 of 1), nvfp4 (1 of 1)")
    norm_line = ("if quantised, keep in BF16: blocks.0.ln.weight — 68.8% of its gains flushed to"
                 " zero (GEMM weights' median {})")
    found = {line[0]: line[1:] for line in _verdicts(watched)}
    assert found["mxfp4"] == [
        "fits", "mxfp4: all 5 layers fit; quantised too, 1 of 1 norms' affine weights need BF16"
        " (blocks.0.ln.weight)", norm_line.format("11%")]
    assert found["nvfp4"] == [
        "1 in BF16", "nvfp4: 1 of 5 layers need BF16 (head.weight); quantised too, 1 of 1 norms'"
        " affine weights need BF16 (blocks.0.ln.weight)", HEAD_KEEP, norm_line.format("6.6%")]
    assert [len(found[r]) for r in ("fp8_tensorwise", "fp8_rowwise", "fp8_block128")] == [2] * 3
    pg.select_option("#formats-operand", "weight")  # the norm's one measured operand
    watched.wait_for("() => document.getElementById('formats-matrix').data[0].z[5][0] !== null")
    _shoot(pg, "formats-layernorm.png")
    watched.assert_clean()


def test_a_click_draws_the_cells_trend_and_another_operand_or_step_is_fetched(
        served: tuple[ServerProcess, dict[str, str]], watched: Watched) -> None:
    server, ids = served
    pg = watched.page
    requests = _open(watched, server, ids["sampled"])
    assert pg.is_hidden("#formats-trend")
    pg.mouse.click(*_cell_point(pg, "formats-matrix", ROWS.index(runs.FC2), RECIPES.index("mxfp8")))
    watched.wait_for("() => !document.getElementById('formats-trend').hidden"
                     " && document.getElementById('formats-trend-operand').data")
    assert _formats_requests(requests)[1:] == [{"path": "/trend", "query": {
        "layer": "3", "operand": "grad_output", "recipe": "mxfp8"}}]
    assert pg.inner_text("#formats-trend-note") == (
        "blocks.0.mlp.fc2.weight · grad_output · mxfp8 · over 3 sampled steps")
    stats = {t["meta"]: t for t in _traces(watched, "formats-trend-stats")}
    assert list(stats) == ["underflow_frac", "saturated_frac", "rel_rmse", "scale_min_frac",
                           "scale_max_frac"]
    assert all(t["x"] == list(runs.SAMPLED) for t in stats.values())
    assert stats["underflow_frac"]["y"] == list(runs.FC2_UNDERFLOW)
    assert stats["scale_min_frac"]["y"] == [runs.FC2_SCALE_MIN] * 3
    # An exact 0 (nothing saturated) sits on the log axis' floor, labelled "0", not a gap.
    floor = stats["saturated_frac"]["y"][0]
    assert stats["saturated_frac"]["y"] == [floor] * 3 and 0 < floor < 0.026
    ticks = watched.js("() => document.getElementById('formats-trend-stats').layout.yaxis.ticktext")
    assert ticks[0] == "0"
    operand = {t["meta"]: t for t in _traces(watched, "formats-trend-operand")}
    assert operand["amax"]["y"] == pytest.approx([1.5, 0.15, 0.015])
    assert operand["kurtosis"]["y"] == [40.0, 41.0, 42.0]
    mark = "(id) => document.getElementById(id).layout.shapes.map((s) => s.x0)"
    assert watched.js(mark, "formats-trend-stats") == [200]
    # Where MXFP8's block scales sit: each step's 7 blocks at its top, 2^-8, -11, -14, and the
    # pinned 3 of 10 in its last row, 15 binades below (or farther: below it, a gap).
    assert pg.is_visible("#formats-trend-scales") and pg.is_hidden("#formats-trend-scales-none")
    (heat,) = _traces(watched, "formats-trend-scales")
    assert heat["x"] == list(runs.SAMPLED) and heat["y"] == list(range(-29, -7))
    for k, top in enumerate(runs.FC2_TOPS):
        z = [row[k] for row in heat["z"]]
        expected = [None] * (top - 15 + 29) + [0.3] + [0.0] * 14 + [0.7] + [0.0] * (-8 - top)
        assert z == pytest.approx(expected), top
    assert heat["text"] is not None and heat["text"][heat["y"].index(-29)][2] == (
        "step 200 · scale 2^-29 or below: 3 of 10 blocks (30%)")
    assert watched.js(mark, "formats-trend-scales") == [200]
    # One step axis for the three: a step sits at the same x in each.
    assert watched.js("() => ['stats', 'operand', 'scales'].map((c) => document.getElementById("
                      "`formats-trend-${c}`)._fullLayout.xaxis.range)") == [[-50, 250]] * 3
    _shoot(pg, "formats-run.png")
    # Another operand: the matrix is redrawn from the answer held, the trend is fetched again.
    pg.select_option("#formats-operand", "input")
    watched.wait_for("() => window.ampscope.formats.trendCharts.trend.operand === 'input'")
    assert _formats_requests(requests)[1:] == [
        {"path": "/trend", "query": {"layer": "3", "operand": "grad_output", "recipe": "mxfp8"}},
        {"path": "/trend", "query": {"layer": "3", "operand": "input", "recipe": "mxfp8"}}]
    # The module without a gradient had an input: measured.
    assert _traces(watched)[0]["text"][ROWS.index(runs.AUX)] == [
        *scores("0.54", "0.52", "0.52", "0.52", "11", "6.6")]
    # Another sampled step: fetched, its matrix and its verdicts (the median of 5 % and 8 %).
    assert watched.js("() => [...document.querySelectorAll('#formats-step option')].map("
                      "(o) => o.textContent)") == ["step 200", "step 100", "step 0"]
    pg.select_option("#formats-step", "100")
    watched.wait_for("() => window.ampscope.formats.loads === 2")
    assert _formats_requests(requests)[-1] == {"path": "/", "query": {"step": "100"}}
    assert pg.inner_text("#formats-note").startswith("step 100 · ")
    assert _verdicts(watched)[3][3] == FC2_KEEP.format("6.5%")
    pg.select_option("#formats-operand", "grad_output")
    watched.wait_for("() => document.getElementById('formats-matrix').data[0].text[2][3]"
                     f" === '8{TIMES} · BF16'")
    watched.wait_for(f"() => ({mark})('formats-trend-stats')[0] === 100")
    watched.assert_clean()


def test_a_live_run_shows_each_new_sample_unless_a_step_is_picked(
        served: tuple[ServerProcess, dict[str, str]], watched: Watched) -> None:
    """While the run trains, steps that arrive fetch the section again (at most every 30 s:
    the test lets the next one through at once) and it shows the newest sample; once the
    user picks a step, arriving steps leave it alone."""
    server, _ = served
    pg = watched.page
    run_id = new_id()
    first, second, third = runs.live(run_id)

    def post(payload: dict[str, Any]) -> None:
        response = httpx.post(f"{server.url}/api/ingest", json=payload, timeout=60)
        assert response.status_code == 200, response.text

    post(first)
    requests = _open(watched, server, run_id)
    assert pg.inner_text("#formats-note").startswith("step 100 · ")
    watched.js("() => { window.ampscope.formats.lastFetch = -Infinity; }")
    post(second)
    watched.wait_for("() => window.ampscope.formats.loads === 2")
    assert _formats_requests(requests) == [{"path": "/", "query": {}}] * 2
    assert pg.inner_text("#formats-note").startswith("step 200 · ")
    assert watched.js("() => [...document.querySelectorAll('#formats-step option')].map("
                      "(o) => o.textContent)") == ["step 200", "step 100", "step 0"]
    pg.select_option("#formats-step", "100")
    watched.wait_for("() => window.ampscope.formats.loads === 3")
    watched.js("() => { window.ampscope.formats.lastFetch = -Infinity; }")
    post(third)
    watched.wait_for("() => window.ampscope.lastStep && window.ampscope.lastStep.step === 300")
    assert watched.js("() => [window.ampscope.formats.loads, window.ampscope.formats.timer]") == [
        3, None]
    assert pg.inner_text("#formats-note").startswith("step 100 · ")
    watched.assert_clean()


def test_a_hook_before_v8_sent_no_block_scale_exponents(
        served: tuple[ServerProcess, dict[str, str]], watched: Watched) -> None:
    server, ids = served
    pg = watched.page
    _open(watched, server, ids["twin"])
    rows = [runs.TWIN_NAMES[i] for i in runs.TWIN_LISTED]
    pg.mouse.click(*_cell_point(pg, "formats-matrix", rows.index(runs.FC1),
                                RECIPES.index("nvfp4")))
    watched.wait_for("() => !document.getElementById('formats-trend').hidden"
                     " && document.getElementById('formats-trend-operand').data")
    assert pg.inner_text("#formats-trend-note").startswith(f"{runs.FC1} · grad_output · nvfp4")
    assert pg.is_visible("#formats-trend-scales-none")
    assert pg.inner_text("#formats-trend-scales-none") == (
        "No block scale exponents at these steps: the hook that sent them predates wire v8.")
    assert pg.is_hidden("#formats-trend-scales")
    watched.assert_clean()


def test_a_run_without_formats_says_so(
        served: tuple[ServerProcess, dict[str, str]], watched: Watched) -> None:
    server, ids = served
    pg = watched.page
    _open(watched, server, ids["plain"])
    assert pg.is_visible("#formats-empty")
    assert pg.inner_text("#formats-empty") == EMPTY
    assert pg.is_hidden("#formats-body") and pg.is_hidden("#formats-legend")
    assert pg.is_disabled("#formats-step")
    assert watched.js("() => document.getElementById('formats-matrix').data") is None
    # The page around it is whole: its section link, the other sections' contents.
    assert pg.is_visible("#section-bar a:text-is('Formats')")
    assert pg.inner_text("#run-name") == "no-formats"
    watched.assert_clean()


def _compare(watched: Watched, server: ServerProcess, first: str, second: str) -> Page:
    pg = watched.page
    pg.goto(f"{server.url}/compare?runs={first},{second}")
    watched.wait_for("() => window.ampscope && window.ampscope.compare.ready")
    pg.locator("#formats-panel").scroll_into_view_if_needed()
    watched.wait_for("() => window.ampscope.compare.formats.draws >= 1")
    return pg


def test_compare_sets_two_runs_verdicts_side_by_side(
        served: tuple[ServerProcess, dict[str, str]], watched: Watched) -> None:
    server, ids = served
    pg = _compare(watched, server, ids["sampled"], ids["twin"])
    heads = watched.js("() => [...document.querySelectorAll('#formats-verdicts-head th')].map("
                       "(th) => [th.dataset.runId ?? null, th.textContent])")
    assert heads == [[None, "Recipe"], [ids["sampled"], "bf16-baseline"], [ids["twin"], "fp8-twin"]]
    rows = watched.js("""() => [...document.querySelectorAll('#formats-verdicts-body tr')].map(
      (tr) =>
      [tr.dataset.recipe, ...[...tr.querySelectorAll('td[data-run-id]')].map((td) =>
        [td.querySelector('.verdict-summary').textContent,
         ...[...td.querySelectorAll('.formats-keep li')].map((li) => li.textContent)])])""")
    fits = {r: [f"{r}: all 5 layers fit"] for r in RECIPES}
    assert rows == [
        *[[r, fits[r], fits[r]] for r in RECIPES[:3]],
        ["mxfp8",
         ["mxfp8: 1 of 5 layers need BF16 (blocks.0.mlp.fc2.weight)", FC2_KEEP.format("8%")],
         fits["mxfp8"]],
        ["mxfp4", fits["mxfp4"], fits["mxfp4"]],
        ["nvfp4", *[["nvfp4: 1 of 5 layers need BF16 (head.weight)", HEAD_KEEP]] * 2]]
    # The two matrices on the same rows: a layer one run lacks is absent in the other's.
    grids = watched.js("""() => window.ampscope.compare.formats.grids.map((g) => ({rows: g.rows,
      states: g.cells.map((row) => row.map((c) => c.state))}))""")
    assert [g["rows"] for g in grids] == [MERGED, MERGED]
    states = [{name: set(row) for name, row in zip(MERGED, g["states"], strict=True)}
              for g in grids]
    assert states[0][runs.PROJ] == {"absent"} and states[0][runs.AUX] == {"nan"}
    assert states[1][runs.AUX] == {"absent"} and states[1][runs.PROJ] == {"measured"}
    for i in (0, 1):
        traces = _traces(watched, f"formats-matrix-{i}")
        assert traces[0]["y"] == MERGED
    absent = _traces(watched, "formats-matrix-0")[2]
    assert absent["text"][MERGED.index(runs.PROJ)] == ["absent"] * 6
    assert pg.inner_text("#formats-note") == "bf16-baseline: step 200 · fp8-twin: step 200"
    _shoot(pg, "formats-compare.png")
    # The other run as the reference: the panel follows the page's order.
    pg.click(f'li[data-run-id="{ids["twin"]}"] button')
    watched.wait_for("() => window.ampscope.compare.formats.draws >= 2")
    heads = watched.js("() => [...document.querySelectorAll('#formats-verdicts-head th')].map("
                       "(th) => th.textContent)")
    assert heads == ["Recipe", "fp8-twin", "bf16-baseline"]
    watched.assert_clean()


def test_compare_beside_a_run_without_formats(
        served: tuple[ServerProcess, dict[str, str]], watched: Watched) -> None:
    server, ids = served
    pg = _compare(watched, server, ids["sampled"], ids["plain"])
    cells = watched.js("""() => [...document.querySelectorAll(
      '#formats-verdicts-body td[data-run-id]')].map((td) => td.textContent)""")
    assert cells[1::2] == ["no formats samples"] * 6
    assert pg.is_visible("#formats-empty-1") and pg.inner_text("#formats-empty-1") == EMPTY
    assert pg.is_hidden("#formats-matrix-1") and pg.is_visible("#formats-matrix-0")
    watched.assert_clean()


@pytest.mark.parametrize("page", ["run", "compare"])
def test_dark_mode_keeps_the_formats_readable(
        served: tuple[ServerProcess, dict[str, str]], chromium: Browser, page: str) -> None:
    server, ids = served
    with open_watched(chromium, color_scheme="dark") as dark:
        if page == "run":
            _open(dark, server, ids["sampled"])
        else:
            _compare(dark, server, ids["sampled"], ids["twin"])
        result = dark.js(CONTRAST)
        assert result["bg"] == "rgb(13, 17, 23)"
        assert result["failures"] == [], "\n".join(result["failures"])
        colours = dark.js("""() => [...document.querySelectorAll('.chart')].filter((d) =>
          d.id.startsWith('formats-matrix') && d.data).map((d) => d.data[1].colorscale[0][1])""")
        assert colours and set(colours) == {"#4c4f8f"}  # "not measured", the dark palette's
        _shoot(dark.page, f"formats-{page}-dark.png")
        dark.assert_clean()

