"""Live findings in a real browser (issue #14): the demo's training (examples/demo_model.py: an
init_scale far too high, a growth interval of 50, a `whisper` branch whose gradient underflows)
runs in a thread under the real hook, paced like `make demo`, into a real server (SQLite), while
Chromium holds the run page and the runs list open.

- Findings appear and update without a reload, each finding's element kept (updated in place),
  and the relative "started" time ticks.
- No flicker: after a warm-up, sampled once a second, no finding appears or disappears on the
  run page and the runs list's headline (kind, severity) does not change.
No console error, no CSP violation.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import torch
from playwright.sync_api import ConsoleMessage, Page, sync_playwright

import ampscope
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo_model import make_training, train_step

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
STEPS = 1600
STEPS_PER_S = 20.0
WARMUP_STEP = 500
"""Sampling starts once the page's findings were analysed at this step (the calibration
descent, several probes and the underflow all seen)."""
SAMPLES = 20
WAIT_MS = 60_000
RECORD = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(`${e.violatedDirective} blocked ${e.blockedURI || 'inline'}`
    + ` (${e.sourceFile}:${e.lineNumber}:${e.columnNumber} ${e.sample})`);
});
"""
SHOWN = "() => [...document.querySelectorAll('#findings li[data-identity]')]" \
        ".map((li) => li.dataset.identity)"
ANALYSED = "() => Number(document.getElementById('findings').dataset.step || -1)"


@dataclass
class Training:
    server: ServerProcess
    run_id: str = ""
    done: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)

    def train(self) -> None:
        try:
            torch.set_num_threads(1)
            model, scaler, optimizer, gen = make_training()
            mon = ampscope.watch(model, scaler, optimizer, run="live-findings",
                                 server=self.server.url, layer_every=1)
            self.run_id = mon.run_id
            self.started.set()
            try:
                for _ in range(STEPS):
                    if self.done.is_set():
                        break
                    begin = time.monotonic()
                    train_step(model, scaler, optimizer, gen)
                    time.sleep(max(0.0, 1 / STEPS_PER_S - (time.monotonic() - begin)))
            finally:
                mon.close()
        except BaseException as exc:  # reported by the test that waits on it
            self.error.append(exc)
            self.started.set()


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Training]:
    tmp = tmp_path_factory.mktemp("live-findings")
    server = ServerProcess(migrated_sqlite(tmp), tmp).start()
    job = Training(server)
    thread = threading.Thread(target=job.train, daemon=True)
    thread.start()
    try:
        assert job.started.wait(60), "the training did not start"
        assert not job.error, job.error
        yield job
    finally:
        job.done.set()
        thread.join(timeout=60)
        server.stop()


@dataclass
class Browser:
    run_page: Page
    list_page: Page
    errors: list[str]


@pytest.fixture(scope="module")
def browser(training: Training) -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = chromium.new_context(viewport={"width": 1440, "height": 900})
        context.add_init_script(RECORD)
        errors: list[str] = []
        pages = [context.new_page(), context.new_page()]
        for pg in pages:
            def on_console(msg: ConsoleMessage) -> None:
                if msg.type == "error":
                    errors.append(f"console.error: {msg.text}")

            pg.on("console", on_console)
            pg.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
        pages[0].goto(f"{training.server.url}/runs/{training.run_id}")
        pages[1].goto(f"{training.server.url}/")
        try:
            yield Browser(pages[0], pages[1], errors)
        finally:
            chromium.close()


def _assert_clean(b: Browser) -> None:
    for pg in (b.run_page, b.list_page):
        violations: list[str] = pg.evaluate("() => window.__cspViolations || []")
        assert violations == [], "\n".join(violations)
    assert b.errors == [], "\n".join(b.errors)


def test_findings_appear_and_update_in_place_without_reload(browser: Browser) -> None:
    pg = browser.run_page
    pg.wait_for_function(f"() => ({ANALYSED})() >= 0", timeout=WAIT_MS)
    first_step: int = pg.evaluate(ANALYSED)
    underflow = pg.locator('#findings li[data-identity="gradient_underflow"]')
    underflow.wait_for(timeout=WAIT_MS)
    # Mark the element; a later analysis must update this very element, not replace it.
    pg.evaluate("""() => {
      document.querySelector('#findings li[data-identity="gradient_underflow"]').__kept = true;
    }""")
    at: int = pg.evaluate(ANALYSED)
    pg.wait_for_function(f"() => ({ANALYSED})() >= {at + 100}", timeout=WAIT_MS)
    assert pg.evaluate("""() => document.querySelector(
      '#findings li[data-identity="gradient_underflow"]').__kept === true""")
    assert pg.evaluate(ANALYSED) > first_step
    note = pg.locator("#findings .panel-note").inner_text()
    assert f"analysed at step {pg.evaluate(ANALYSED)}" in note
    # The card uses the finding's definition and says so.
    assert pg.locator("#card-worst-label").text_content() == (
        "Most lost to fp16 · median, last 5 layer-stat steps")
    started = pg.locator('.meta-value[data-ago]')
    before = started.inner_text()
    pg.wait_for_function("(old) => document.querySelector('.meta-value[data-ago]').textContent "
                         "!== old", arg=before, timeout=WAIT_MS)
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "live-findings.png"), full_page=False)
    _assert_clean(browser)


def test_no_flicker_after_warm_up(browser: Browser, training: Training) -> None:
    pg, runs = browser.run_page, browser.list_page
    pg.wait_for_function(f"() => ({ANALYSED})() >= {WARMUP_STEP}", timeout=3 * WAIT_MS)
    headline = f"""() => {{
      const cell = document.querySelector('tr[data-run-id="{training.run_id}"] td.finding-cell');
      return cell && cell.dataset.kind ? `${{cell.dataset.severity}} ${{cell.dataset.kind}}` : null;
    }}"""
    shown: list[set[str]] = []
    headlines: list[str | None] = []
    steps: list[int] = []
    for _ in range(SAMPLES):
        begin = time.monotonic()
        shown.append(set(pg.evaluate(SHOWN)))
        headlines.append(runs.evaluate(headline))
        steps.append(pg.evaluate(ANALYSED))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - begin)))
    assert steps[-1] > steps[0], "the run page kept analysing while sampled"
    flips = sum(len(a ^ b) for a, b in itertools.pairwise(shown))
    assert flips == 0, shown
    assert "gradient_underflow" in shown[0]
    assert len(set(headlines)) == 1 and headlines[0] is not None, headlines
    summary = httpx.get(f"{training.server.url}/api/runs/{training.run_id}", timeout=30).json()
    assert f"{summary['top_finding']['severity']} {summary['top_finding']['kind']}" == headlines[0]
    _assert_clean(browser)
