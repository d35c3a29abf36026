"""The dashboard in a real browser: Debian's headless Chromium over a real server (SQLite) that a
real CPU AMP training, watched by the real hook, streams into while the pages are open.

The run: `init_scale` 2^20 so the first steps overflow and are skipped, a short growth interval so
the scaler keeps probing (more skips), the demo model's `whisper` branch whose gradients underflow,
and one step whose loss is NaN. Every page must load and update with no console error and no CSP
violation; screenshots land in test-artifacts/ for a human to look at.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright
from torch import nn

import ampscope
from tests.support.databases import sqlite_url
from tests.support.servers import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo_model import make_batch, make_training

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
RUN_NAME = "browser-e2e"
STEPS = 240
STEPS_PER_S = 10.0
NAN_LOSS_STEP = 30
WAIT_MS = 15_000

# Runs in the page before any of its scripts (CDP, so the CSP does not apply to it): a CSP
# violation is recorded even where the browser would not log it to the console.
RECORD_CSP_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(`${e.violatedDirective} blocked ${e.blockedURI || 'inline'}`
    + ` at ${e.sourceFile}:${e.lineNumber}`);
});
"""


@dataclass
class Training:
    """A watched training loop on a background thread, paced at STEPS_PER_S."""

    server_url: str
    run_id: str = ""
    steps_done: int = 0
    error: BaseException | None = None
    started: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            self._train()
        except BaseException as exc:  # surfaced by the tests, not lost in a thread
            self.error = exc
        finally:
            self.started.set()
            self.finished.set()

    def _train(self) -> None:
        torch.set_num_threads(1)
        model, scaler, optimizer, gen = make_training(init_scale=2.0**20, growth_interval=20)
        monitor = ampscope.watch(model, scaler, optimizer, run=RUN_NAME, server=self.server_url,
                                 tags=["e2e", "<b>not bold</b>"], layer_every=1)
        self.run_id = monitor.run_id
        start = time.monotonic()
        try:
            for step in range(STEPS):
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
                time.sleep(max(0.0, start + (step + 1) / STEPS_PER_S - time.monotonic()))
        finally:
            monitor.close()

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the training thread failed: {self.error!r}") from self.error


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the module (SQLite only: the browser does not care about the dialect)."""
    tmp = tmp_path_factory.mktemp("browser")
    proc = ServerProcess(sqlite_url(tmp), tmp).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def training(live_server: ServerProcess) -> Iterator[Training]:
    train = Training(live_server.url)
    thread = threading.Thread(target=train.run, name="ampscope-e2e-training", daemon=True)
    thread.start()
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
        raise AssertionError(f"run {train.run_id} never reached the server:\n{live_server.log()}")
    yield train
    thread.join(timeout=STEPS / STEPS_PER_S + 30)
    train.check()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class Watched:
    """A page plus every console error, uncaught exception and CSP violation it produced."""

    page: Page
    errors: list[str]

    def assert_clean(self) -> None:
        violations: list[str] = self.page.evaluate("() => window.__cspViolations || []")
        assert self.errors == [], "console errors:\n" + "\n".join(self.errors)
        assert violations == [], "CSP violations:\n" + "\n".join(violations)

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / name
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def js(self, expression: str) -> Any:
        """Evaluate a function expression in the page (strings would need 'unsafe-eval')."""
        return self.page.evaluate(expression)

    def wait_for(self, predicate: str, timeout_ms: int = WAIT_MS) -> None:
        self.page.wait_for_function(predicate, timeout=timeout_ms)


@pytest.fixture
def watched(browser: Browser) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.add_init_script(RECORD_CSP_VIOLATIONS)
    page = context.new_page()
    errors: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            errors.append(f"console.error: {msg.text} ({msg.location.get('url', '')})")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    try:
        yield Watched(page, errors)
    finally:
        context.close()


def layer_names(server: ServerProcess, run_id: str) -> list[str]:
    resp = httpx.get(f"{server.url}/api/runs/{run_id}/layers", timeout=5)
    assert resp.status_code == 200, resp.text
    return [layer["name"] for layer in resp.json()]


SCALE_POINTS = "() => document.getElementById('scale-chart').data[2].x.length"
SKIP_MARKERS = "() => document.getElementById('scale-chart').data[3].x.length"
HEATMAP_ROWS = "() => document.getElementById('heatmap').data[0].y"
HEATMAP_COLUMNS = "() => document.getElementById('heatmap').data[0].z.length"
LOADED = "() => !!(window.ampscope && window.ampscope.live)"
FINISHED = "() => document.querySelector('#run-status .badge').textContent === 'finished'"


class TestRunsPage:
    def test_lists_the_live_run_and_links_to_it(
        self, live_server: ServerProcess, training: Training, watched: Watched
    ) -> None:
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

        # Refreshed every 2 s without a reload: the step count grows.
        cell = row.locator("td.num").first
        before = int(cell.inner_text())
        watched.page.wait_for_function(
            f"""() => {{
              const td = document.querySelector('tr[data-run-id="{training.run_id}"] td.num');
              return td && Number(td.textContent) > {before};
            }}""", timeout=WAIT_MS)
        watched.screenshot("runs.png")
        watched.assert_clean()


class TestRunPage:
    def test_charts_load_then_follow_the_live_run(
        self, live_server: ServerProcess, training: Training, watched: Watched
    ) -> None:
        watched.page.goto(f"{live_server.url}/runs/{training.run_id}")
        watched.wait_for(LOADED)
        assert watched.page.locator("#run-name").inner_text() == RUN_NAME

        # The scale chart gains points over the socket, with no reload.
        first = watched.js(SCALE_POINTS)
        watched.wait_for(f"() => ({SCALE_POINTS})() > {first + 5}")
        assert watched.js("() => performance.getEntriesByType('navigation').length") == 1
        assert training.steps_done < STEPS, "the run ended before the page could watch it stream"

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
        for stat in ("headroom_bits", "amax", "zero_frac", "lost_frac"):
            watched.page.select_option("#stat-select", stat)
            watched.wait_for(f"() => window.ampscope.heatmap.stat === '{stat}'")
        assert watched.js(HEATMAP_ROWS) == layer_names(live_server, training.run_id)

        # The run finishes while the page is open: the socket says so.
        assert training.finished.wait(STEPS / STEPS_PER_S + 30), "the training did not finish"
        training.check()
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
        assert training.finished.wait(STEPS / STEPS_PER_S + 30)
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
        assert training.finished.wait(STEPS / STEPS_PER_S + 30)
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

    def test_an_unknown_run_says_so(self, live_server: ServerProcess, watched: Watched) -> None:
        watched.page.goto(f"{live_server.url}/runs/no-such-run")
        banner = watched.page.locator("#error")
        banner.wait_for(state="visible", timeout=WAIT_MS)
        assert "run 'no-such-run' not found" in banner.inner_text()
        # The browser itself logs the 404 response; nothing else may be logged.
        unexpected = [e for e in watched.errors if "404" not in e]
        assert unexpected == []

    def test_reconnects_after_a_server_restart(
        self, live_server: ServerProcess, training: Training, watched: Watched
    ) -> None:
        assert training.finished.wait(STEPS / STEPS_PER_S + 30)
        watched.page.goto(f"{live_server.url}/runs/{training.run_id}")
        watched.wait_for(LOADED)
        live = "() => document.getElementById('live').dataset.state"
        watched.wait_for(f"() => ({live})() === 'connected'")
        live_server.stop()
        watched.wait_for(f"() => ({live})() === 'reconnecting'")
        live_server.start()
        watched.wait_for(f"() => ({live})() === 'connected'", timeout_ms=30_000)
        assert watched.js(SCALE_POINTS) == STEPS  # the backfill after the last id repeats nothing
        # Only the failed reconnection attempts may be logged while the server was away.
        unexpected = [e for e in watched.errors if "WebSocket connection" not in e]
        assert unexpected == []
        assert watched.js("() => window.__cspViolations") == []


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
