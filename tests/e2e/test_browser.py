"""The dashboard in a real browser: Debian's headless Chromium over a real server (SQLite) that a
real CPU AMP training, watched by the real hook, streams into while the pages are open.

The run: `init_scale` 2^20 so the first steps overflow and are skipped, a short growth interval so
the scaler keeps probing (more skips), the demo model's `whisper` branch whose gradients underflow,
and one step whose loss is NaN. Every page must load and update with no console error and no CSP
violation; screenshots land in test-artifacts/ for a human to look at.

The pace: the run streams at STEPS_PER_S (10 steps/s, as before) only while a test watches it
(`Training.streaming`), and never takes its last step until a test wants it finished
(`Training.finish`); the rest then goes at FINISH_STEPS_PER_S. The live tests need a step every
so often (a count that grows, a step shown within 2 s of the server having it, > 5 new chart
points) and a run not yet over, both of which this gives whatever the load; nothing needs the
wall time between them. Before, the run trained 240 steps at 10 steps/s (24 s) on its own clock:
the finished-run tests waited that out, and under load the live tests could outlast it and find
the run ended ("the run ended before the page could watch it stream").
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from playwright.sync_api import Page, ViewportSize
from torch import nn

import ampscope
from tests.support.browser import Watched
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo_model import make_batch, make_training

pytestmark = pytest.mark.browser

RUN_NAME = "browser-e2e"
STEPS = 240
STEPS_PER_S = 10.0
"""The pace while a test watches the run stream (`Training.streaming`)."""
FINISH_STEPS_PER_S = 200.0
"""The pace of the steps left once a test asks for the end (`Training.finish`)."""
NAN_LOSS_STEP = 30
WAIT_MS = 15_000


@dataclass
class Training:
    """A watched training loop on a background thread whose steps the tests call for.

    It trains while some test watches it stream (`streaming()`), at STEPS_PER_S, and holds
    between those tests; it never trains its last step before a test asks for the end
    (`finish()`), which trains the rest at FINISH_STEPS_PER_S. So the run is live, and streams,
    for as long as the live tests take, under any load, and finishes as soon as a test wants it
    finished: nothing waits out a fixed schedule.
    """

    server_url: str
    name: str = RUN_NAME
    steps: int = STEPS
    run_id: str = ""
    steps_done: int = 0
    error: BaseException | None = None
    started: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    watchers: int = 0
    wake: threading.Condition = field(default_factory=threading.Condition)

    def run(self) -> None:
        try:
            self._train()
        except BaseException as exc:  # surfaced by the tests, not lost in a thread
            self.error = exc
        finally:
            self.started.set()
            self.finished.set()

    @contextmanager
    def streaming(self) -> Iterator[None]:
        """Steps flow at STEPS_PER_S while inside (the last one excepted: see `finish`)."""
        with self.wake:
            self.watchers += 1
            self.wake.notify_all()
        try:
            yield
        finally:
            with self.wake:
                self.watchers -= 1

    def release(self) -> None:
        """Let the run train its remaining steps and finish."""
        with self.wake:
            self.released.set()
            self.wake.notify_all()

    def finish(self, timeout_s: float = 60.0) -> None:
        """`release` the run and wait until it has finished."""
        self.release()
        assert self.finished.wait(timeout_s), "the training did not finish"
        self.check()

    def _next(self, step: int) -> float:
        """Wait until step `step` may be trained; its pace (steps per second)."""
        with self.wake:
            self.wake.wait_for(lambda: self.released.is_set() or (
                self.watchers > 0 and step < self.steps - 1))
            return FINISH_STEPS_PER_S if self.released.is_set() else STEPS_PER_S

    def _train(self) -> None:
        torch.set_num_threads(1)
        model, scaler, optimizer, gen = make_training(init_scale=2.0**20, growth_interval=20)
        monitor = ampscope.watch(model, scaler, optimizer, run=self.name, server=self.server_url,
                                 tags=["e2e", "<b>not bold</b>"], layer_every=1)
        self.run_id = monitor.run_id
        try:
            for step in range(self.steps):
                pace = self._next(step)
                begin = time.monotonic()
                x, y = make_batch(gen)
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = nn.functional.mse_loss(model(x).float(), y)
                if step == NAN_LOSS_STEP:
                    loss = loss * float("nan")  # a forward overflow: the scaler skips this step
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                self.steps_done = step + 1
                if step == 0:
                    self.started.set()
                time.sleep(max(0.0, begin + 1 / pace - time.monotonic()))
        finally:
            monitor.close()

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the training thread failed: {self.error!r}") from self.error


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the module (SQLite only: the browser does not care about the dialect)."""
    tmp = tmp_path_factory.mktemp("browser")
    proc = ServerProcess(migrated_sqlite(tmp), tmp).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def training(live_server: ServerProcess) -> Iterator[Training]:
    train = Training(live_server.url)
    thread = threading.Thread(target=train.run, name="ampscope-e2e-training", daemon=True)
    thread.start()
    try:
        with train.streaming():
            assert train.started.wait(60), "the training loop did not start"
            train.check()
            # The run exists on the server once its first batch has been ingested.
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                runs = httpx.get(f"{live_server.url}/api/runs", timeout=5).json()
                if any(r["id"] == train.run_id for r in runs):
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(
                    f"run {train.run_id} never reached the server:\n{live_server.log()}")
        yield train
    finally:
        train.release()
        thread.join(timeout=60)
    train.check()


FRESH = "fresh-run"
RUNS_LIVE = "() => document.getElementById('live').dataset.state === 'live'"


def record_api_requests(page: Page) -> list[str]:
    """Every GET /api/runs the page makes (the list must come over its socket, not by polling)."""
    calls: list[str] = []
    page.on("request", lambda req: calls.append(req.url)
            if req.url.split("?")[0].endswith("/api/runs") else None)
    return calls


HOSTILE = "<img src=x onerror=alert(1)>"
HOSTILE_TAG = "<script>alert(2)</script>"
SHORT_STEPS = 80


def train_short(
    server_url: str, name: str = HOSTILE, tags: list[str] | None = None, steps: int = 0
) -> str:
    """A short, finished run streamed by the real hook, unpaced, named with markup.

    Same seed, model and scaler settings as `Training`: the two runs agree until the live run's
    NaN loss at NAN_LOSS_STEP, which the comparison must find.
    """
    model, scaler, optimizer, gen = make_training(init_scale=2.0**20, growth_interval=20)
    monitor = ampscope.watch(model, scaler, optimizer, run=name, server=server_url,
                             tags=[HOSTILE_TAG, "short"] if tags is None else tags, layer_every=1)
    try:
        for _ in range(steps or SHORT_STEPS):
            x, y = make_batch(gen)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
    finally:
        monitor.close()
    return monitor.run_id


@pytest.fixture(scope="module")
def short_run(live_server: ServerProcess, training: Training) -> str:
    """The id of the finished short run (created while the live one streams)."""
    run_id = train_short(live_server.url)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        resp = httpx.get(f"{live_server.url}/api/runs/{run_id}", timeout=5)
        if resp.status_code == 200 and resp.json()["status"] == "finished":
            return run_id
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} never finished on the server:\n{live_server.log()}")


@pytest.fixture
def viewport() -> ViewportSize:
    return {"width": 1400, "height": 900}


def layer_names(server: ServerProcess, run_id: str) -> list[str]:
    resp = httpx.get(f"{server.url}/api/runs/{run_id}/layers", timeout=5)
    assert resp.status_code == 200, resp.text
    return [layer["name"] for layer in resp.json()]


def api_steps(server: ServerProcess, run_id: str) -> int:
    resp = httpx.get(f"{server.url}/api/runs/{run_id}", timeout=5)
    assert resp.status_code == 200, resp.text
    return int(resp.json()["num_steps"])


def assert_close(actual: list[float | None], expected: list[float | None]) -> None:
    """Equal lengths, None where expected is None, else equal to 1e-9 relative."""
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert (a is None) == (e is None), (i, a, e)
        assert e is None or a == pytest.approx(e, rel=1e-9), (i, a, e)


SCALE_POINTS = "() => document.getElementById('scale-chart').data[2].x.length"
SKIP_MARKERS = "() => document.getElementById('scale-chart').data[3].x.length"
HEATMAP_ROWS = "() => document.getElementById('heatmap').data[0].y"
HEATMAP_COLUMNS = "() => document.getElementById('heatmap').data[0].z.length"
LOADED = "() => !!(window.ampscope && window.ampscope.live)"
COUNT_FETCHES = """
window.__fetching = 0;
const fetched = window.fetch.bind(window);
window.fetch = (...args) => {
  window.__fetching += 1;
  return fetched(...args).finally(() => { window.__fetching -= 1; });
};
"""
"""An init script counting the page's requests in flight (`window.__fetching`)."""
SETTLED = """() => window.ampscope.statusMessages >= 1 && window.__fetching === 0
    && window.ampscope.findings.timer === null && !window.ampscope.findings.inFlight
    && window.ampscope.events.refetchTimer === null"""
"""The run page has had the socket's status message and nothing it schedules is pending (needs
COUNT_FETCHES)."""
FINISHED = "() => document.querySelector('#run-status .badge').textContent === 'finished'"


class TestRunsPage:
    def test_lists_the_live_run_and_links_to_it(
        self, live_server: ServerProcess, training: Training, watched: Watched
    ) -> None:
        with training.streaming():
            watched.page.goto(f"{live_server.url}/")
            row = watched.page.locator(f'tr[data-run-id="{training.run_id}"]')
            row.wait_for(timeout=WAIT_MS)
            assert row.locator(".run-name a").inner_text() == RUN_NAME
            assert row.locator(".badge").inner_text() == "live"
            # User text is text: the tag's markup is shown, not interpreted.
            assert "<b>not bold</b>" in row.locator(".tags").inner_text()
            assert row.locator(".tags b").count() == 0
            href = row.locator(".run-name a").get_attribute("href")
            assert href == f"/runs/{training.run_id}"

            # Kept current over the runs socket without a reload: the step count grows.
            cell = row.locator("td.num").first
            before = int(cell.inner_text())
            watched.page.wait_for_function(
                f"""() => {{
                  const td = document.querySelector('tr[data-run-id="{training.run_id}"] td.num');
                  return td && Number(td.textContent) > {before};
                }}""", timeout=WAIT_MS)
            watched.screenshot("runs.png")
            watched.assert_clean()

    def test_a_live_step_shows_within_2_s(
        self, live_server: ServerProcess, training: Training, watched: Watched
    ) -> None:
        with training.streaming():
            api_calls = record_api_requests(watched.page)
            watched.page.goto(f"{live_server.url}/")
            watched.page.locator(f'tr[data-run-id="{training.run_id}"]').wait_for(timeout=WAIT_MS)
            watched.wait_for(RUNS_LIVE)
            shown = api_steps(live_server, training.run_id)
            while (steps := api_steps(live_server, training.run_id)) == shown:
                time.sleep(0.02)
            assert steps < STEPS, "the run ended before the list could follow it"
            # The server has the new step now: the socket pushes it within 2 s.
            started = time.monotonic()
            watched.wait_for(f"""() => {{
                  const td = document.querySelector('tr[data-run-id="{training.run_id}"] td.num');
                  return td && Number(td.textContent) >= {steps};
                }}""", timeout_ms=2_500)
            assert time.monotonic() - started < 2.0
            assert watched.js("() => performance.getEntriesByType('navigation').length") == 1
            # Pushed, not polled: the page never asked GET /api/runs.
            assert api_calls == [], api_calls
            watched.assert_clean()

    def test_a_new_run_shows_within_2_s(
        self, live_server: ServerProcess, training: Training, watched: Watched
    ) -> None:
        with training.streaming():
            api_calls = record_api_requests(watched.page)
            watched.page.goto(f"{live_server.url}/")
            watched.page.locator(f'tr[data-run-id="{training.run_id}"]').wait_for(timeout=WAIT_MS)
            watched.wait_for(RUNS_LIVE)
            shown = {r["id"] for r in httpx.get(f"{live_server.url}/api/runs", timeout=5).json()}
            new: dict[str, str] = {}
            thread = threading.Thread(target=lambda: new.setdefault(
                "id", train_short(live_server.url, name=FRESH, tags=["fresh"], steps=20)))
            thread.start()
            try:
                # The moment the server lists the new run, the page has at most 2 s to show it.
                deadline = time.monotonic() + 30
                while not (fresh := [r for r in httpx.get(f"{live_server.url}/api/runs",
                                                          timeout=5).json()
                                     if r["id"] not in shown]):
                    assert time.monotonic() < deadline, "the new run never reached the server"
                    time.sleep(0.02)
                started = time.monotonic()
                row = watched.page.locator(f'tr[data-run-id="{fresh[0]["id"]}"]')
                row.wait_for(timeout=2_500)
                assert time.monotonic() - started < 2.0
                assert row.locator(".run-name a").inner_text() == FRESH
                # Merged in by id: every run once, the updates of the other run included.
                ids = watched.js("() => [...document.querySelectorAll('#runs-body tr')]"
                                 ".map((tr) => tr.dataset.runId)")
                assert len(ids) == len(set(ids)) and training.run_id in ids
            finally:
                thread.join(timeout=60)
            # ... and its steps follow until it finishes.
            watched.wait_for(f"""() => {{
                  const tr = document.querySelector('tr[data-run-id="{new["id"]}"]');
                  return tr && tr.querySelector('.badge').textContent === 'finished'
                    && Number(tr.querySelector('td.num').textContent) === 20;
                }}""")
            assert watched.js("() => performance.getEntriesByType('navigation').length") == 1
            assert api_calls == [], api_calls
            watched.screenshot("runs-live.png")
            watched.assert_clean()


class TestRunPage:
    def test_charts_load_then_follow_the_live_run(
        self, live_server: ServerProcess, training: Training, watched: Watched
    ) -> None:
        with training.streaming():
            watched.page.goto(f"{live_server.url}/runs/{training.run_id}")
            watched.wait_for(LOADED)
            assert watched.page.locator("#run-name").inner_text() == RUN_NAME

            # The scale chart gains points over the socket, with no reload.
            first = watched.js(SCALE_POINTS)
            watched.wait_for(f"() => ({SCALE_POINTS})() > {first + 5}")
            assert watched.js("() => performance.getEntriesByType('navigation').length") == 1
            assert training.steps_done < STEPS, (
                "the run ended before the page could watch it stream")

            # init_scale 2^20 overflows at once: skipped steps are red markers on the scale line.
            assert watched.js(SKIP_MARKERS) >= 1
            ticks = watched.js("() => document.getElementById('scale-chart').layout.yaxis.ticktext")
            assert all(t.startswith("2") for t in ticks), ticks

            # One heatmap row per layer, in model order, and columns arriving live.
            names = layer_names(live_server, training.run_id)
            assert watched.js(HEATMAP_ROWS) == names
            columns = watched.js(HEATMAP_COLUMNS)
            watched.wait_for(f"() => ({HEATMAP_COLUMNS})() > {columns}")
            watched.screenshot("run-live.png")
            watched.assert_clean()

    def test_other_statistics_and_the_end_of_the_run(
        self, live_server: ServerProcess, training: Training, watched: Watched
    ) -> None:
        watched.page.goto(f"{live_server.url}/runs/{training.run_id}")
        watched.wait_for(LOADED)
        with training.streaming():  # switched while columns arrive
            for stat in ("headroom_bits", "amax", "zero_frac", "lost_frac"):
                watched.page.select_option("#stat-select", stat)
                watched.wait_for(f"() => window.ampscope.heatmap.stat === '{stat}'")
        assert watched.js(HEATMAP_ROWS) == layer_names(live_server, training.run_id)
        # Live headroom divides by the format's max as the run detail gives it (FP16 here).
        assert watched.js("() => window.ampscope.heatmap.formatMax") == 65504.0

        # The run finishes while the page is open: the socket says so.
        training.finish()
        watched.wait_for(FINISHED)

        # Step NAN_LOSS_STEP's loss was NaN: a red mark on the loss chart, not an error.
        watched.wait_for(f"() => window.ampscope.loss.lastStep >= {STEPS - 1}")
        assert watched.js("() => window.ampscope.loss.nonFinite") >= 1
        marked = watched.js("() => document.getElementById('loss-chart').data[1].x")
        assert NAN_LOSS_STEP in marked
        watched.screenshot("run-finished.png")
        watched.assert_clean()

    def test_a_finished_run_loads_complete(
        self, live_server: ServerProcess, training: Training, watched: Watched
    ) -> None:
        training.finish()
        watched.page.goto(f"{live_server.url}/runs/{training.run_id}")
        watched.wait_for(LOADED)
        watched.wait_for(FINISHED)
        assert watched.js(SCALE_POINTS) == STEPS
        assert watched.js(HEATMAP_COLUMNS) == STEPS
        assert NAN_LOSS_STEP in watched.js("() => document.getElementById('loss-chart').data[1].x")
        watched.assert_clean()

    def test_the_browser_parses_every_body_of_a_run_with_nan(
        self, live_server: ServerProcess, training: Training, watched: Watched
    ) -> None:
        """The NaN loss step travels as the tag "nan": `JSON.parse` accepts every API body."""
        training.finish()
        watched.page.goto(f"{live_server.url}/runs/{training.run_id}")
        watched.wait_for(LOADED)
        base = f"/api/runs/{training.run_id}"
        paths = [f"{base}/export?format=json", f"{base}/steps", f"{base}/series/loss",
                 f"{base}/layer-stats?stat=headroom_bits", "/api/runs"]
        parsed = watched.page.evaluate(
            """async (paths) => {
                const out = {};
                for (const p of paths) {
                    const text = await (await fetch(p)).text();
                    out[p] = JSON.parse(text);  // throws on a bare NaN or Infinity token
                }
                return out;
            }""",
            paths,
        )
        steps = parsed[f"{base}/export?format=json"]["steps"]
        assert steps[NAN_LOSS_STEP]["loss"] == "nan"
        assert steps[NAN_LOSS_STEP]["skipped"] is True
        assert parsed[f"{base}/steps"]["steps"][NAN_LOSS_STEP]["loss"] == "nan"
        watched.assert_clean()

    def test_events_smoothing_skip_rate_layer_lines_table_and_zoom(
        self, live_server: ServerProcess, training: Training, watched: Watched
    ) -> None:
        """The run page's analysis features on the finished run, each against the API's data."""
        training.finish()
        page = watched.page
        requests: list[str] = []
        page.on("request", lambda req: requests.append(req.url))
        page.goto(f"{live_server.url}/runs/{training.run_id}")
        watched.wait_for(LOADED)
        watched.wait_for(FINISHED)
        base = f"{live_server.url}/api/runs/{training.run_id}"
        names = layer_names(live_server, training.run_id)

        # Events: the NaN-loss step opens onto a forward overflow and its non-finite layers, in
        # the API's (backward) order; a gradient-only overflow says the loss was finite.
        events = httpx.get(f"{base}/events", timeout=10).json()["events"]
        skipped = {e["step"]: e for e in events if e["kind"] == "skipped"}
        nan_event = skipped[NAN_LOSS_STEP]
        assert nan_event["loss_finite"] is False and nan_event["layers"]
        backward = [e for e in skipped.values() if e["loss_finite"] is True and e["layers"]]
        assert backward, "init_scale 2^20 overflows some gradients with a finite loss"
        for event, verdict in ((nan_event, "forward overflow"), (backward[0], "backward overflow")):
            details = page.locator(f'details.event-detail[data-step="{event["step"]}"]')
            assert details.get_attribute("open") is None
            details.locator("summary").click()
            assert details.get_attribute("open") is not None
            assert details.get_attribute("data-loss-finite") == str(event["loss_finite"]).lower()
            assert verdict in details.locator("summary").inner_text()
            assert details.locator(".bad-layer-name").all_inner_texts() == [
                layer["name"] for layer in event["layers"]]
            assert details.locator(".nonfinite").all_inner_texts() == [
                "NaN" if layer["kind"] == "nan" else "inf" for layer in event["layers"]]
        assert page.locator(".bad-layers img, .bad-layers script").count() == 0

        # Smoothing: the smoothed line follows the slider (debiased EMA); the raw one does not move.
        raw_before = watched.js("() => document.getElementById('loss-chart').data[0].y")
        smooth_before = watched.js("() => document.getElementById('loss-chart').data[2].y")
        page.locator("#smoothing").fill("0.9")
        watched.wait_for("() => document.getElementById('smoothing-value').textContent === '0.90'")
        raw_after = watched.js("() => document.getElementById('loss-chart').data[0].y")
        smooth_after = watched.js("() => document.getElementById('loss-chart').data[2].y")
        assert raw_after == raw_before and len(raw_after) == STEPS
        assert smooth_after != smooth_before
        expected: list[float | None] = []
        last, count = 0.0, 0
        for v in raw_after:
            if v is None:
                expected.append(None)
                continue
            last, count = last * 0.9 + 0.1 * v, count + 1
            expected.append(last / (1 - 0.9**count))
        assert smooth_after[NAN_LOSS_STEP] is None
        assert_close(smooth_after, expected)
        assert watched.js("() => document.getElementById('loss-chart').data[0].opacity") < 1

        # Rolling skip rate over the last 100 steps, from the steps' skipped flags.
        flags = [s["skipped"] for s in httpx.get(f"{base}/steps", timeout=10).json()["steps"]]
        rates = watched.js("() => document.getElementById('skiprate-chart').data[0].y")
        assert len(rates) == STEPS
        for step in (0, NAN_LOSS_STEP, STEPS - 1):
            window = flags[max(0, step - 99): step + 1]
            assert rates[step] == pytest.approx(sum(window) / len(window))

        # A click on a heatmap row adds that layer's amax and amin_nz; a second click removes them.
        # The lines start with the layers the first finding cites (issue #14): clear those first.
        watched.wait_for("() => window.ampscope.findings && window.ampscope.findings.body")
        page.evaluate("""async () => {
          const lines = window.ampscope.layerLines;
          await window.ampscope.prefill;
          for (const i of [...lines.shown]) await lines.toggle(i);
        }""")
        lines = "() => document.getElementById('layer-lines').data.map((t) => [t.meta, t.name])"
        page.locator("#heatmap").scroll_into_view_if_needed()
        box = page.locator("#heatmap .nsewdrag").bounding_box()
        assert box is not None
        row = len(names) - 1
        y = box["y"] + (row + 0.5) * box["height"] / len(names)
        page.mouse.click(box["x"] + box["width"] / 2, y)
        watched.wait_for(f"() => ({lines})().length === 2")
        assert watched.js(lines) == [[row, f"{names[row]} amax"], [row, f"{names[row]} amin_nz"]]
        amax = httpx.get(f"{base}/layer-stats", params={"stat": "amax", "max_points": 10000},
                         timeout=10).json()
        shown = watched.js("() => document.getElementById('layer-lines').data[0].y")
        assert len(shown) == len(amax["steps"]) == STEPS
        assert_close(shown, [v if isinstance(v, float | int) else None for v in amax["z"][row]])
        assert page.locator("#layer-lines-note").is_hidden()
        watched.screenshot("run-features.png")
        page.mouse.click(box["x"] + box["width"] / 2, y)
        watched.wait_for(f"() => ({lines})().length === 0")

        # The layer table, sorted by lost fraction at the last step: largest first (ties in
        # model order), then smallest first.
        last = STEPS - 1
        lost = httpx.get(f"{base}/layer-stats", params={"stat": "lost_frac", "start": last,
                                                        "end": last}, timeout=10).json()
        assert lost["steps"] == [last]
        assert page.locator("#layer-step").inner_text() == f"at step {last}"
        values = [row_[-1] for row_ in lost["z"]]
        page.click("#layer-head th[data-sort=lost_frac]")
        assert page.locator("#layer-head th[data-sort=lost_frac]").get_attribute(
            "aria-sort") == "descending"
        order = page.locator("#layer-body tr").evaluate_all(
            "(rows) => rows.map((r) => Number(r.dataset.index))")
        assert order == sorted(range(len(names)), key=lambda i: -values[i])
        page.click("#layer-head th[data-sort=lost_frac]")
        order = page.locator("#layer-body tr").evaluate_all(
            "(rows) => rows.map((r) => Number(r.dataset.index))")
        assert order == sorted(range(len(names)), key=lambda i: values[i])

        # Zoom fetches the visible range in detail and keeps the zoom (uirevision).
        page.evaluate("() => Plotly.relayout('scale-chart', {'xaxis.range': [50, 100]})")
        watched.wait_for("() => window.ampscope.zoom.scale.fetches === 1")
        zoomed = [u for u in requests if "/series/scale?" in u and "start=50" in u]
        assert len(zoomed) == 1 and "end=100" in zoomed[0]
        assert watched.js("() => document.getElementById('scale-chart').layout.xaxis.range") == [
            50, 100]
        assert watched.js("() => document.getElementById('scale-chart').layout.uirevision")
        assert watched.js(SCALE_POINTS) == STEPS  # the detail replaced the range, repeating nothing
        watched.assert_clean()

    def test_an_unknown_run_says_so(self, live_server: ServerProcess, watched: Watched) -> None:
        watched.page.goto(f"{live_server.url}/runs/no-such-run")
        banner = watched.page.locator("#error")
        banner.wait_for(state="visible", timeout=WAIT_MS)
        assert banner.inner_text() == (  # a friendly not-found state (issue #14)
            "This server has no run “no-such-run”: it may have been deleted, or the address "
            "is mistyped. Back to the runs list")
        # The browser itself logs the 404 response; nothing else may be logged.
        unexpected = [e for e in watched.errors if "404" not in e]
        assert unexpected == []

    def test_reconnects_after_a_server_restart(
        self, live_server: ServerProcess, training: Training, watched: Watched
    ) -> None:
        training.finish()
        watched.page.add_init_script(COUNT_FETCHES)
        watched.page.goto(f"{live_server.url}/runs/{training.run_id}")
        watched.wait_for(LOADED)
        live = "() => document.getElementById('live').dataset.state"
        watched.wait_for(f"() => ({live})() === 'connected'")
        # The page's own follow-up reads (findings, what-if, layer lines) done first: one still
        # in flight when the server goes would rightly log a failed request. That includes the
        # ones only scheduled: the socket's status message (sent after its backfill) has the
        # findings fetched again up to findings.js REFETCH_MS (3 s) later, and live skipped
        # steps have /events read again; wait until that message came and those ran.
        watched.wait_for(SETTLED)
        live_server.stop()
        watched.wait_for(f"() => ({live})() === 'reconnecting'")
        live_server.start()
        watched.wait_for(f"() => ({live})() === 'connected'", timeout_ms=30_000)
        assert watched.js(SCALE_POINTS) == STEPS  # the backfill after the last id repeats nothing
        # Only the failed reconnection attempts may be logged while the server was away.
        unexpected = [e for e in watched.errors if "WebSocket connection" not in e]
        assert unexpected == []
        assert watched.js("() => window.__cspViolations") == []


class TestRunsListFeatures:
    """Filter, sort, worst layers and user text, once both runs exist."""

    def test_worst_layers_filter_sort_and_hostile_text(
        self, live_server: ServerProcess, training: Training, short_run: str, watched: Watched
    ) -> None:
        page = watched.page
        page.goto(f"{live_server.url}/")
        hostile = page.locator(f'tr[data-run-id="{short_run}"]')
        hostile.wait_for(timeout=WAIT_MS)
        page.locator(f'tr[data-run-id="{training.run_id}"]').wait_for(timeout=WAIT_MS)

        # User text is text: the name and the tag show their markup; no element is made of it.
        assert hostile.locator(".run-name a").inner_text() == HOSTILE
        assert HOSTILE_TAG in hostile.locator(".tags").inner_text()
        assert page.locator("#runs-body img, #runs-body script").count() == 0

        # Skip rate and the worst layers come from the API's summary.
        summary = httpx.get(f"{live_server.url}/api/runs/{short_run}", timeout=5).json()
        assert summary["worst_underflow"] is not None and summary["worst_headroom"] is not None
        worst = hostile.locator("td.worst .layer-name").all_inner_texts()
        assert worst == [summary["worst_underflow"]["layer"], summary["worst_headroom"]["layer"]]
        assert "%" in hostile.locator("td.num").nth(2).inner_text()

        rows = "() => [...document.querySelectorAll('#runs-body tr')].map((tr) => tr.dataset.runId)"
        both = {short_run, training.run_id}
        # Words...
        page.fill("#filter", "short")
        watched.wait_for(f"() => ({rows})().length === 1 && ({rows})()[0] === '{short_run}'")
        # ... a regular expression ...
        page.check("#filter-regex")
        page.fill("#filter", "^browser-e2e$")
        watched.wait_for(f"() => ({rows})().length === 1 && ({rows})()[0] === '{training.run_id}'")
        assert page.locator("#filter-error").is_hidden()
        # ... and an invalid one: a message, every run shown, no exception.
        page.fill("#filter", "img([")
        page.locator("#filter-error").wait_for(state="visible", timeout=WAIT_MS)
        # Said once (Chromium's own message starts with the same words).
        assert page.locator("#filter-error").inner_text() == (
            "Invalid regular expression: /img([/i: Unterminated character class — showing every"
            " run.")
        assert both <= set(watched.js(rows))
        page.fill("#filter", "")

        # Sorting by steps orders the rows by the counts they show. The live run's count keeps
        # changing (pushed at most twice a second), so the check reads the counts the page shows
        # rather than the trainer's, which runs ahead of them.
        shown = """() => {
          const col = [...document.querySelectorAll('#runs thead th')]
            .findIndex((th) => th.dataset.sort === 'steps');
          return [...document.querySelectorAll('#runs-body tr')]
            .map((tr) => Number(tr.children[col].textContent.replace(/[^0-9]/g, '')));
        }"""
        page.click("th[data-sort=steps]")
        assert page.locator("th[data-sort=steps]").get_attribute("aria-sort") == "descending"
        counts = watched.js(shown)
        assert len(counts) >= 2 and counts == sorted(counts, reverse=True), counts
        page.click("th[data-sort=steps]")
        assert page.locator("th[data-sort=steps]").get_attribute("aria-sort") == "ascending"
        counts = watched.js(shown)
        assert len(counts) >= 2 and counts == sorted(counts), counts
        watched.assert_clean()

    def test_the_run_page_shows_a_hostile_name_as_text(
        self, live_server: ServerProcess, short_run: str, watched: Watched
    ) -> None:
        watched.page.goto(f"{live_server.url}/runs/{short_run}")
        watched.wait_for(LOADED)
        assert watched.page.locator("#run-name").inner_text() == HOSTILE
        assert watched.page.locator("#crumb-run").inner_text() == HOSTILE
        assert watched.page.title() == f"{HOSTILE} · ampscope"
        assert watched.page.locator("main img, main script").count() == 0
        watched.screenshot("run-hostile-name.png")
        watched.assert_clean()


MISUSE_STEP = 3


def train_with_misuse(server_url: str) -> str:
    """A short run streamed by the real hook whose loop calls `optimizer.step()` itself once,
    bypassing the scaler (the hook records `step_bypassed_scaler`)."""
    model, scaler, optimizer, gen = make_training(init_scale=2.0**10, growth_interval=20)
    monitor = ampscope.watch(model, scaler, optimizer, run="misuse", server=server_url,
                             tags=["misuse"], layer_every=1)
    try:
        for step in range(8):
            x, y = make_batch(gen)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            if step == MISUSE_STEP:
                optimizer.step()  # the misuse: scaled gradients, no inf check
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
    finally:
        monitor.close()
    return monitor.run_id


class TestRunPageSources:
    def test_activation_source_heatmap(
        self, live_server: ServerProcess, training: Training, watched: Watched
    ) -> None:
        """The source selector switches the heatmap to the sampled activation gradients (one
        row per module, one column per sampled step, as /layer-stats?source=activation serves
        them) and back to the parameter gradients."""
        training.finish()
        base = f"{live_server.url}/api/runs/{training.run_id}"
        expected = httpx.get(f"{base}/layer-stats", params={
            "stat": "lost_frac", "source": "activation"}, timeout=10).json()
        assert expected["source"] == "activation" and expected["layers"] and expected["steps"]
        page = watched.page
        page.goto(f"{live_server.url}/runs/{training.run_id}")
        watched.wait_for(LOADED)
        page.select_option("#source-select", "activation")
        watched.wait_for("() => window.ampscope.heatmap.source === 'activation'")
        assert watched.js(HEATMAP_ROWS) == expected["layers"]
        assert watched.js("() => document.getElementById('heatmap').data[0].x") == expected[
            "steps"]
        # z is per step (transpose: true): column j of the API's z[module][step].
        z = watched.js("() => document.getElementById('heatmap').data[0].z")
        assert [[row[j] for row in z] for j in range(len(z[0]))] == expected["z"]
        note = page.locator("#source-note")
        assert note.is_visible() and f"sampled on {len(expected['steps'])} steps" in (
            note.inner_text())
        # Another statistic keeps the source.
        page.select_option("#stat-select", "headroom_bits")
        watched.wait_for("() => window.ampscope.heatmap.stat === 'headroom_bits'")
        assert watched.js("() => window.ampscope.heatmap.source") == "activation"
        assert watched.js(HEATMAP_ROWS) == expected["layers"]
        watched.screenshot("run-activations.png")
        page.select_option("#source-select", "param")
        watched.wait_for("() => window.ampscope.heatmap.source === 'param'")
        assert watched.js(HEATMAP_ROWS) == layer_names(live_server, training.run_id)
        assert watched.js(HEATMAP_COLUMNS) == STEPS
        assert note.is_hidden()
        watched.assert_clean()

    def test_misuse_from_a_real_hook_run(
        self, live_server: ServerProcess, watched: Watched
    ) -> None:
        run_id = train_with_misuse(live_server.url)
        events = httpx.get(f"{live_server.url}/api/runs/{run_id}/events",
                           timeout=10).json()["events"]
        misuse = [e for e in events if e["kind"] == "misuse"]
        assert [(e["step"], e["misuse_kind"]) for e in misuse] == [
            (MISUSE_STEP, "step_bypassed_scaler")]
        page = watched.page
        page.goto(f"{live_server.url}/runs/{run_id}")
        watched.wait_for(LOADED)
        # A banner says which misuse, how often and from which step ...
        banner = page.locator("#misuse")
        assert banner.is_visible()
        item = banner.locator('li[data-kind="step_bypassed_scaler"]')
        assert "1 time, first at step 3" in item.inner_text()
        # ... and the events table holds it, opening onto the hook's own words.
        row = page.locator(f'tr.event-row[data-kind="misuse"][data-step="{MISUSE_STEP}"]')
        assert row.count() == 1
        row.locator("summary").click()
        assert row.locator(".misuse-detail").inner_text() == misuse[0]["detail"]
        assert "misuse" in page.locator("#event-counts").inner_text()
        watched.screenshot("run-misuse.png")
        watched.assert_clean()


COMPARE_READY = "() => !!(window.ampscope && window.ampscope.compare?.ready)"


def traces_of(watched: Watched, chart: str, run_id: str) -> list[dict[str, Any]]:
    """The raw line a compare chart draws for one run (not its smoothed line, ticks or marks)."""
    result: list[dict[str, Any]] = watched.page.evaluate(
        """([chart, id]) => document.getElementById(chart).data
             .filter((t) => t.meta === id && t.mode === 'lines+markers')
             .map((t) => ({name: t.name, points: t.x.length, color: t.line.color}))""",
        [chart, run_id])
    return result


class TestComparePage:
    def test_select_two_runs_and_compare_them(
        self, live_server: ServerProcess, training: Training, short_run: str, watched: Watched
    ) -> None:
        page = watched.page
        page.goto(f"{live_server.url}/")
        for run_id in (short_run, training.run_id):  # the first picked is the reference
            page.locator(f'tr[data-run-id="{run_id}"] td.check input').check()
        button = page.locator("#compare")
        assert button.is_enabled() and button.inner_text() == "Compare 2 runs"
        watched.screenshot("runs-selected.png")
        button.click()
        page.wait_for_url("**/compare?**", timeout=WAIT_MS)
        watched.wait_for(COMPARE_READY)
        query = page.evaluate("() => new URLSearchParams(location.search).get('runs')")
        assert query == f"{short_run},{training.run_id}"

        # Both runs on every chart, each in one colour everywhere; the name is plotly-escaped.
        colors = set()
        for chart in ("scale-chart", "loss-chart", "gradnorm-chart"):
            for run_id in (short_run, training.run_id):
                [trace] = traces_of(watched, chart, run_id)
                assert trace["points"] > 0, (chart, run_id)
                colors.add((run_id, trace["color"]))
        assert len(colors) == 2 and len({c for _, c in colors}) == 2
        assert traces_of(watched, "loss-chart", short_run)[0]["name"] == (
            "&lt;img src=x onerror=alert(1)&gt;")
        legend = page.locator("#loss-chart .legendtext").evaluate_all(
            "(nodes) => nodes.map((n) => n.textContent)")
        assert sorted(legend) == sorted([HOSTILE, RUN_NAME])

        # The run cards and the divergence: the same step as the API's, shown as text.
        cards = page.locator("#compare-runs .compare-run-name").all_inner_texts()
        assert cards == [HOSTILE, RUN_NAME]
        body = httpx.get(f"{live_server.url}/api/compare",
                         params={"runs": f"{short_run},{training.run_id}"}, timeout=10).json()
        divergence = body["comparisons"][0]["divergence"]
        assert divergence is not None and divergence["step"] <= NAN_LOSS_STEP
        assert page.locator(".divergence-step").inner_text() == str(divergence["step"])
        shapes = "() => document.getElementById('loss-chart').layout.shapes.map((s) => s.x0)"
        assert watched.js(shapes) == [divergence["step"]]

        # Per-layer differences: one row per layer of the model, names as text.
        names = layer_names(live_server, short_run)
        rows = page.locator("#layers-body tr")
        assert rows.count() == len(names)
        assert sorted(page.locator("#layers-body .layer-cell").all_inner_texts()) == sorted(names)
        assert page.locator("main img, main script").count() == 0
        watched.screenshot("compare.png")

        # Another tolerance is recomputed in place, without reloading the page. The NaN loss
        # stays an (infinite) divergence at any tolerance.
        page.fill("#tolerance", "100000")
        page.locator("#tolerance").dispatch_event("change")
        page.wait_for_url("**tolerance=1000**", timeout=WAIT_MS)
        looser = httpx.get(f"{live_server.url}/api/compare", timeout=10, params={
            "runs": f"{short_run},{training.run_id}", "tolerance": 1000}).json()
        step = looser["comparisons"][0]["divergence"]["step"]
        assert step == NAN_LOSS_STEP
        watched.wait_for(
            f"() => document.querySelector('.divergence-step')?.textContent === '{step}'")
        assert "tolerance 100000%" in page.locator(".divergence-detail").inner_text()
        assert watched.js("() => performance.getEntriesByType('navigation').length") == 1
        watched.assert_clean()

    def test_a_streaming_run_updates_in_place(
        self, live_server: ServerProcess, short_run: str, watched: Watched
    ) -> None:
        """A run still training, compared with a finished one: its steps arrive over its live
        socket and are appended to every chart, with no reload and no chart re-fetched."""
        train = Training(live_server.url, name="compare-live", steps=60)
        thread = threading.Thread(target=train.run, name="ampscope-e2e-compare", daemon=True)
        thread.start()
        try:
            with train.streaming():
                assert train.started.wait(60), "the training loop did not start"
                train.check()
                deadline = time.monotonic() + 15
                while not train.run_id or httpx.get(
                        f"{live_server.url}/api/runs/{train.run_id}", timeout=5).status_code != 200:
                    assert time.monotonic() < deadline, "the streaming run never reached the server"
                    time.sleep(0.05)
                page = watched.page
                requests: list[str] = []
                page.on("request", lambda req: requests.append(req.url))
                page.goto(f"{live_server.url}/compare?runs={short_run},{train.run_id}")
                watched.wait_for(COMPARE_READY)
                charts = ("scale-chart", "loss-chart", "gradnorm-chart")
                before = {c: traces_of(watched, c, train.run_id)[0]["points"] for c in charts}
                drawn = len(requests)
                watched.wait_for("() => document.getElementById('live').dataset.state === 'live'")
                # New steps land on every chart (extendTraces), the finished run's lines stay put.
                for chart in charts:
                    watched.wait_for(f"""() => document.getElementById('{chart}').data
                        .find((t) => t.meta === '{train.run_id}'
                          && t.mode === 'lines+markers').x.length > {before[chart] + 3}""")
                assert train.steps_done < train.steps, (
                    "the run ended before the page could follow it")
                assert traces_of(watched, "loss-chart", short_run)[0]["points"] == SHORT_STEPS
                flushes = watched.js("() => window.ampscope.compare.live.flushes")
                assert flushes >= 1
                later = [u for u in requests[drawn:] if "/series/" in u or "/events" in u]
                assert later == [], later
                assert watched.js("() => performance.getEntriesByType('navigation').length") == 1
            # The run's end reaches its card over the socket.
            train.finish()
            card = page.locator(f'#compare-runs li[data-run-id="{train.run_id}"] .badge')
            watched.wait_for(f"""() => document.querySelector(
                '#compare-runs li[data-run-id="{train.run_id}"] .badge')?.textContent
                === 'finished'""")
            assert card.inner_text() == "finished"
            # Every step drawn once: the live run's loss line holds each of its steps.
            xs = watched.js(f"""() => document.getElementById('loss-chart').data
                .find((t) => t.meta === '{train.run_id}' && t.mode === 'lines+markers').x""")
            assert xs == sorted(set(xs)) and len(xs) == train.steps
            watched.screenshot("compare-live.png")
            watched.assert_clean()
        finally:
            train.release()
            thread.join(timeout=60)

    def test_too_few_runs_says_so(self, live_server: ServerProcess, watched: Watched) -> None:
        watched.page.goto(f"{live_server.url}/compare?runs=one")
        banner = watched.page.locator("#error")
        banner.wait_for(state="visible", timeout=WAIT_MS)
        assert "two or more runs" in banner.inner_text()
        watched.assert_clean()


class TestApiDocsPage:
    def test_documents_the_api_offline_under_the_csp(
        self, live_server: ServerProcess, watched: Watched
    ) -> None:
        watched.page.goto(f"{live_server.url}/docs")
        paths = watched.page.locator(".opblock-summary-path")
        paths.first.wait_for(timeout=WAIT_MS)
        shown = set(paths.all_inner_texts())
        assert {"/api/runs", "/api/ingest", "/api/runs/{run_id}/export"} <= {
            p.replace("\u200b", "") for p in shown}
        watched.screenshot("api-docs.png")
        watched.assert_clean()
