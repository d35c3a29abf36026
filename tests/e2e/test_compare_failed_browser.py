"""Compare keeps the failed run visible (issue #31), in a real Chromium: a healthy run beside one
that explodes (loss to 7.8e5 then NaN, a gradient norm that is finite only at isolated steps
between NaN/inf, a loss scale that collapses to 0, layers that turn NaN with NaN-born zeros).

Checked: the exploding run's isolated finite points carry a marker and its non-finite steps a
tick (as on the run page); the loss and grad-norm axes switch between log and linear; the scale
chart still marks the skipped steps once the scale is 0; the per-layer ratio leaves NaN steps
out (no "0x") and NaN-born zeros are not "underflow only in"; zoom and smoothing are shared. No
console error, no CSP violation."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.wire import batch_v2, layer_stats, new_id, record_v2
from tests.support.browser import Watched
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.browser

WAIT_MS = 15_000
STEPS = 300
EXPLODE = 200       # the loss grows tenfold a step from here (2 → 2e5 at step 205)
NAN_FROM = 250      # loss NaN, grad norm non-finite, every step skipped, layers NaN
ISOLATED = (260, 280)  # the only finite grad norms from NAN_FROM on
ZERO_SCALE = 270    # the scale is 0 from here on
LAYER_EVERY = 10
HISTOGRAM_STEP = 290


def _layers(step: int, nan: bool) -> dict[str, list[Any]]:
    stats = layer_stats(1.0)
    if nan:
        # Every finite element is a zero the NaN made: not underflow, and no norm.
        stats.update(amax=[0.0, 0.0], amin_nz=[None, None], zero_frac=[0.9, 0.9],
                     subnormal_frac=[0.0, 0.0], underflow_frac=[0.0, 0.0], nan_count=[12, 2],
                     inf_count=[0, 0], l2=[0.0, 0.0])
    else:
        stats.update(nan_count=[0, 0], inf_count=[0, 0], zero_frac=[0.0, 0.0],
                     underflow_frac=[0.0, 0.0], subnormal_frac=[0.0, 0.0])
    return stats


def _healthy(run_id: str) -> dict[str, Any]:
    records = [record_v2(s, with_layers=s % LAYER_EVERY == 0, loss=2.0 - s / 1000,
                         scale_before=65536.0, scale_after=65536.0, grad_norm=0.75)
               for s in range(STEPS)]
    for rec in records:
        if rec["layers"] is not None:
            rec["layers"] = _layers(rec["step"], nan=False)
    return batch_v2(records, run_id=run_id, name="healthy", final=True)


def _grad_norm(step: int) -> float | str:
    if step < NAN_FROM or step in ISOLATED:
        return 1.5 if step < NAN_FROM else 1e4
    return "nan" if step % 2 else "inf"


def _scale(step: int) -> float:
    if step < NAN_FROM:
        return 65536.0
    return 0.0 if step >= ZERO_SCALE else 65536.0 / 2 ** (step - NAN_FROM + 1)


def _exploding(run_id: str) -> dict[str, Any]:
    records = []
    for s in range(STEPS):
        loss: float | str = 2.0 if s < EXPLODE else min(2.0 * 10 ** (s - EXPLODE), 7.8e5)
        bad = s >= NAN_FROM
        rec = record_v2(s, with_layers=s % LAYER_EVERY == 0, loss="nan" if bad else loss,
                        grad_norm=_grad_norm(s), scale_before=_scale(s),
                        scale_after=_scale(s + 1) if bad else _scale(s), skipped=bad,
                        found_inf=bad, nonfinite=[{"layer": 0, "kind": "nan"}] if bad else [])
        if rec["layers"] is not None:
            rec["layers"] = _layers(s, nan=bad)
            if not bad:
                rec["layers"]["l2"][0] *= 2  # fc1.weight's norm doubled
        records.append(rec)
    # One exponent histogram, at a NaN step: 124 of fc1.weight's 128 values NaN, 4 zeros;
    # every one of fc1.bias's 16 inf (bins: zero, non-finite, below, 2^-4 … 2^2, above).
    nan_hist = [[4, 124] + [0] * 9, [0, 16] + [0] * 9]
    records[HISTOGRAM_STEP]["histogram"] = {"min_exp": -4, "max_exp": 2, "counts": nan_hist}
    return batch_v2(records, run_id=run_id, name="lr_explodes", final=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str, str]]:
    tmp = tmp_path_factory.mktemp("compare-failed")
    server = ServerProcess(migrated_sqlite(tmp), tmp).start()
    healthy, exploding = new_id(), new_id()
    try:
        for payload in (_healthy(healthy), _exploding(exploding)):
            response = httpx.post(f"{server.url}/api/ingest", json=payload, timeout=60)
            assert response.status_code == 200, response.text
        yield server, healthy, exploding
    finally:
        server.stop()


def _open(watched: Watched, served: tuple[ServerProcess, str, str]) -> None:
    server, healthy, exploding = served
    watched.page.goto(f"{server.url}/compare?runs={healthy},{exploding}")
    watched.wait_for("() => window.ampscope && window.ampscope.compare.ready", WAIT_MS)


def _traces(watched: Watched, chart: str, run_id: str) -> list[dict[str, Any]]:
    """The chart's traces of one run: name, x, y, marker sizes (plain lists)."""
    found: list[dict[str, Any]] = watched.js("""([chart, runId]) =>
      document.getElementById(chart).data.filter((t) => t.meta === runId).map((t) => ({
        name: t.name, x: Array.from(t.x), y: Array.from(t.y), yaxis: t.yaxis ?? 'y',
        visible: t.visible ?? true,
        size: t.marker && Array.isArray(t.marker.size) ? Array.from(t.marker.size) : null }))""",
                                             [chart, run_id])
    return found


def test_the_exploding_runs_grad_norm_is_visible(
        served: tuple[ServerProcess, str, str], watched: Watched) -> None:
    _, _, exploding = served
    _open(watched, served)
    line, ticks, smooth = _traces(watched, "gradnorm-chart", exploding)
    assert line["x"] == list(range(STEPS))
    finite = [s for s in range(STEPS) if s < NAN_FROM or s in ISOLATED]
    assert [s for s, y in zip(line["x"], line["y"], strict=True) if y is not None] == finite
    # A marker exactly on the finite points with no finite neighbour.
    marked = [s for s, size in zip(line["x"], line["size"], strict=True) if size > 0]
    assert marked == list(ISOLATED)
    # One tick per non-finite step, on the run's own row along the top.
    assert ticks["yaxis"] == "y2"
    assert ticks["x"] == [s for s in range(NAN_FROM, STEPS) if s not in ISOLATED]
    assert smooth["name"].endswith("(smoothed)") and smooth["visible"] is True
    watched.screenshot("compare-failed-run.png")
    watched.assert_clean()


def test_loss_and_grad_norm_switch_between_log_and_linear(
        served: tuple[ServerProcess, str, str], watched: Watched) -> None:
    _open(watched, served)
    pg = watched.page
    axis_type = "(id) => document.getElementById(id)._fullLayout.yaxis.type"
    assert watched.js(axis_type, "loss-chart") == "linear"
    assert watched.js(axis_type, "gradnorm-chart") == "log"
    linear = '#loss-chart-axis button[data-scale="linear"]'
    assert pg.get_attribute(linear, "aria-pressed") == "true"
    pg.click('#loss-chart-axis button[data-scale="log"]')
    watched.wait_for("() => document.getElementById('loss-chart')._fullLayout.yaxis.type === 'log'")
    assert pg.get_attribute('#loss-chart-axis button[data-scale="log"]', "aria-pressed") == "true"
    # The healthy loss (≈2) is no longer a flat 0 under the 7.8e5 peak: its decade is on the axis.
    low, high = watched.js("() => document.getElementById('loss-chart')._fullLayout.yaxis.range")
    assert low < math.log10(1.7) and high > math.log10(7.8e5)
    pg.click('#gradnorm-chart-axis button[data-scale="linear"]')
    watched.wait_for(
        "() => document.getElementById('gradnorm-chart')._fullLayout.yaxis.type === 'linear'")
    watched.screenshot("compare-failed-log-loss.png")
    watched.assert_clean()


def test_the_scale_chart_marks_skips_after_the_scale_reached_zero(
        served: tuple[ServerProcess, str, str], watched: Watched) -> None:
    _, _, exploding = served
    _open(watched, served)
    line, _, skipped = _traces(watched, "scale-chart", exploding)
    assert skipped["x"] == list(range(NAN_FROM, STEPS))
    floor = min(y for y in skipped["y"])
    # Scale 0 sits on the floor: one power of two below the smallest positive scale drawn.
    smallest = 65536.0 / 2 ** (ZERO_SCALE - NAN_FROM)
    assert floor == smallest / 2
    assert skipped["y"][ZERO_SCALE - NAN_FROM:] == [floor] * (STEPS - ZERO_SCALE)
    assert line["y"][ZERO_SCALE:] == [floor] * (STEPS - ZERO_SCALE)
    watched.assert_clean()


def test_the_layer_table_leaves_nan_steps_out(
        served: tuple[ServerProcess, str, str], watched: Watched) -> None:
    _open(watched, served)
    rows = watched.js("""() => [...document.querySelectorAll('#layers-body tr')].map(
      (tr) => [...tr.children].map((td) => td.textContent))""")
    layer_steps = STEPS // LAYER_EVERY
    nan_steps = (STEPS - NAN_FROM) // LAYER_EVERY
    ok = f"{layer_steps - nan_steps}/{layer_steps}"
    # Doubled norms over the finite steps; 0 % lost in both; no "underflow only in".
    assert rows == [["fc1.weight", "2.00\u00d7", ok, str(nan_steps), "0%", "0%", "—"],
                    ["fc1.bias", "1.00\u00d7", ok, str(nan_steps), "0%", "0%", "—"]]
    note = watched.page.inner_text("#layers-note")
    assert note == (f"2 layers in both runs · {layer_steps} common steps with layer statistics"
                    " · 1 with norms 2\u00d7 apart or more · 0 underflowing in one run only"
                    " · 2 with NaN/inf steps (left out of the ratio and the lost shares)")
    watched.assert_clean()


def test_zoom_and_smoothing_are_shared(
        served: tuple[ServerProcess, str, str], watched: Watched) -> None:
    _open(watched, served)
    pg = watched.page
    watched.js("() => Plotly.relayout(document.getElementById('loss-chart'), "
               "{'xaxis.range': [100, 200]})")
    ranges = "() => ['scale-chart', 'loss-chart', 'gradnorm-chart'].map((id) => " \
             "Array.from(document.getElementById(id)._fullLayout.xaxis.range))"
    watched.wait_for(f"() => ({ranges})().every((r) => r[0] === 100 && r[1] === 200)")
    # Each chart fetched its runs' detail for the visible steps, and kept what lies outside.
    watched.wait_for("() => window.ampscope.compare.zoomDetail.every((z) => z.fetches === 1)")
    detail = watched.js("""() => window.ampscope.compare.zoomDetail.map((z) => z.lastRange)""")
    assert detail == [{"start": 100, "end": 200}] * 3
    _, healthy, exploding = served
    line, ticks, _ = _traces(watched, "gradnorm-chart", exploding)
    assert line["x"] == list(range(STEPS))
    assert [s for s, size in zip(line["x"], line["size"], strict=True) if size] == list(ISOLATED)
    assert ticks["x"] == [s for s in range(NAN_FROM, STEPS) if s not in ISOLATED]
    assert _traces(watched, "loss-chart", healthy)[0]["x"] == list(range(STEPS))
    pg.fill("#smoothing", "0")
    pg.dispatch_event("#smoothing", "input")
    visible = watched.js("""() => ['loss-chart', 'gradnorm-chart'].flatMap((id) =>
      document.getElementById(id).data.filter((t) => t.name.endsWith('(smoothed)'))
        .map((t) => t.visible))""")
    assert visible == [False, False, False, False]
    assert pg.inner_text("#smoothing-value") == "0.00"
    watched.assert_clean()


def test_the_run_pages_scale_chart_keeps_drawing_at_zero(
        served: tuple[ServerProcess, str, str], watched: Watched) -> None:
    """The run page's scale chart: the line and every skip marker after the scale reached 0."""
    server, _, exploding = served
    pg = watched.page
    pg.goto(f"{server.url}/runs/{exploding}")
    pg.locator("#scale-chart .nsewdrag").wait_for(timeout=WAIT_MS)
    watched.wait_for("() => document.getElementById('scale-chart').data[3].x.length"
                     f" === {STEPS - NAN_FROM}")
    line, skipped = watched.js("""() => { const d = document.getElementById('scale-chart').data;
      return [2, 3].map((i) => ({x: Array.from(d[i].x), y: Array.from(d[i].y)})); }""")
    floor = 65536.0 / 2 ** (ZERO_SCALE - NAN_FROM) / 2
    assert skipped["x"] == list(range(NAN_FROM, STEPS))
    assert skipped["y"][ZERO_SCALE - NAN_FROM:] == [floor] * (STEPS - ZERO_SCALE)
    assert line["y"][ZERO_SCALE:] == [floor] * (STEPS - ZERO_SCALE)
    watched.screenshot("run-scale-zero.png", full_page=False)
    watched.assert_clean()


def test_what_if_does_not_call_nan_layers_all_zero(
        served: tuple[ServerProcess, str, str], watched: Watched) -> None:
    """The what-if view's "first overflow" of a layer without a finite non-zero value: NaN/inf
    layers are not "never (all zero)"."""
    server, _, exploding = served
    pg = watched.page
    pg.goto(f"{server.url}/runs/{exploding}")
    pg.wait_for_function("() => window.ampscope && window.ampscope.whatIf"
                         " && window.ampscope.whatIf.rows.length === 2", timeout=WAIT_MS)
    cells = watched.js("""() => [...document.querySelectorAll('#whatif-body tr')].map(
      (tr) => [tr.dataset.layer, tr.lastElementChild.textContent])""")
    assert cells == [["fc1.weight", "already NaN/inf (no finite value)"],
                     ["fc1.bias", "already NaN/inf (no finite value)"]]
    watched.assert_clean()
