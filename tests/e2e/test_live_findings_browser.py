"""Live findings in a real browser (issue #14): the demo's training (examples/demo_model.py: an
init_scale far too high, a growth interval of 50, a `whisper` branch whose gradient underflows)
under the real hook, into a real server (SQLite), while Chromium holds the run page and the runs
list open.

- Findings appear and update without a reload, each finding's element kept (updated in place),
  and the relative "started" time ticks.
- No flicker: after a warm-up, over ANALYSES consecutive analyses (400 steps, two HOLD_STEPS),
  no finding appears or disappears on the run page and the runs list's headline (kind,
  severity) does not change.
No console error, no CSP violation.

Time is driven, not waited out. The server analyses a live run when asked and at most every 2 s
(finding_reads.LIVE_REFRESH_S), so what it shows depends on the steps its analyses land on: the
demo's underflow hovers at the thresholds (`gain`, `whisper.*` lose 11-30 % over the last five
samples), and an analysis on a spike raises the finding citing only the layers above 25 %. Paced
by the wall clock (20 steps/s and a page polling every 3 s), the steps analysed were a matter of
scheduling, and under load the test flickered (see "Known server flicker" below). So the test
sets the schedule: the hook sends only when told (`flush_interval` an hour, `Monitor.flush` at
each checkpoint), the training runs FIRST steps at once and then EVERY steps per checkpoint, and
the next checkpoint waits until the run page shows the analysis of the last one. Every analysis
thus sees the steps of a checkpoint, whoever asked for it (page or runs list), whatever the load.
EVERY = 40 is the demo's cadence (2 s between analyses at `make demo`'s 20 steps/s), so the
hold of HOLD_STEPS = 200 steps spans the same five analyses as in the demo. The page's own
3 s refetch timer (findings.js REFETCH_MS) is brought forward with playwright's clock; only the
server's 2 s remain, about 2.3 s per checkpoint (the old test: 80 s of paced training, 64 s).

The flicker this test once showed under load was the server's, and it is fixed (852a069): the
underflow finding's hysteresis applied only to the layers the shown finding cited. With
analyses at steps 30 + 40·k, the one at step 550 raised it citing only `whisper.bias` (29.7 %;
`gain` 23.4 %, `whisper.weight` 22.1 %, just under 25 %); `whisper.bias` then fell under 15 %
while `gain` stayed at 14-20 %, so the finding went at 750 and came back at 990. Now, while a
finding is shown, every layer is judged against the exit threshold. FIRST = 471 puts the
analyses on exactly that schedule (the last step trained is FIRST - 1), so this test fails on
the old server and guards the fix.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import torch
from playwright.sync_api import Browser

import ampscope
from tests.support.browser import Watched, open_watched, watch
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo_model import make_training, train_step

pytestmark = pytest.mark.browser

STEPS = 1600
"""The most steps the tests may drive the run to (they stop far earlier)."""
FIRST = 471
"""Steps trained before the pages open (at once: nothing is analysed in between)."""
EVERY = 40
"""Steps per checkpoint: one analysis each, as the demo's 2 s analyses at 20 steps/s."""
WARMUP_STEP = 500
"""Observation starts once the page's findings were analysed at this step (the calibration
descent, several probes and the underflow all seen)."""
ANALYSES = 10
"""Consecutive analyses observed for flicker: 400 steps, twice HOLD_STEPS, as the old test's
20 samples a second apart at 20 steps/s."""
CHECKPOINT_S = 30.0
"""How long one analysis may take to reach the page (the server's 2 s, and load)."""
WAIT_MS = 15_000
SHOWN = "() => [...document.querySelectorAll('#findings li[data-identity]')]" \
        ".map((li) => li.dataset.identity)"
ANALYSED = "() => Number(document.getElementById('findings').dataset.step || -1)"


@dataclass
class Seen:
    """What the pages showed once an analysis reached the run page."""

    step: int
    shown: set[str]
    headline: str | None


@dataclass
class Live:
    """The demo's training under the real hook, driven a checkpoint at a time, and the two
    pages watching it."""

    server: ServerProcess
    run_page: Watched
    list_page: Watched
    run_id: str
    mon: ampscope.Monitor
    training: tuple[torch.nn.Module, torch.amp.GradScaler, torch.optim.Optimizer,
                    torch.Generator]
    trained: int = 0
    seen: list[Seen] = field(default_factory=list)
    """One entry per analysis the run page showed, in order."""

    def train_to(self, steps: int) -> None:
        """Train up to `steps` steps and hand them all to the server."""
        assert steps <= STEPS, "the tests drove the run further than STEPS"
        while self.trained < steps:
            train_step(*self.training)
            self.trained += 1
        assert self.mon.flush(30), "the hook did not deliver the checkpoint's steps"

    def analysed(self) -> int:
        step: int = self.run_page.js(ANALYSED)
        return step

    def settle(self) -> None:
        """Wait until the run page shows the analysis of every step trained, bringing its
        refetch timer forward (the server's own 2 s throttle is real time), and note what both
        pages show then."""
        pg = self.run_page.page
        deadline = time.monotonic() + CHECKPOINT_S
        while self.analysed() < self.trained - 1:
            assert time.monotonic() < deadline, f"no analysis of step {self.trained - 1}"
            pg.clock.fast_forward(1000)
            time.sleep(0.2)
        self.seen.append(Seen(self.analysed(), set(self.run_page.js(SHOWN)),
                              self.list_page.js(self.headline())))

    def checkpoint(self) -> None:
        self.train_to(self.trained + EVERY)
        self.settle()

    def drive_until(self, predicate: str) -> None:
        """Checkpoints until `predicate` (a function expression) holds in the run page."""
        while not self.run_page.js(predicate):
            self.checkpoint()

    def headline(self) -> str:
        return f"""() => {{
          const cell = document.querySelector('tr[data-run-id="{self.run_id}"] td.finding-cell');
          return cell && cell.dataset.kind ? `${{cell.dataset.severity}} ${{cell.dataset.kind}}`
            : null;
        }}"""

    def assert_clean(self) -> None:
        self.run_page.assert_clean()
        self.list_page.assert_clean()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, chromium: Browser) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("live-findings")
    server = ServerProcess(migrated_sqlite(tmp), tmp).start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the demo trains; given back below (it is process-wide)
    training = make_training()
    model, scaler, optimizer, _ = training
    try:
        mon = ampscope.watch(model, scaler, optimizer, run="live-findings", server=server.url,
                             layer_every=1, flush_interval=3600.0)
        try:
            with open_watched(chromium) as run_page:
                list_page = watch(run_page.context.new_page())
                run_page.page.clock.install()  # the context's pages: refetch timers, Date
                job = Live(server, run_page, list_page, mon.run_id, mon, training)
                job.train_to(FIRST)
                run_page.page.goto(f"{server.url}/runs/{job.run_id}")
                list_page.page.goto(f"{server.url}/")
                job.settle()
                yield job
        finally:
            mon.close()
    finally:
        torch.set_num_threads(threads)
        server.stop()


def test_findings_appear_and_update_in_place_without_reload(live: Live) -> None:
    pg = live.run_page.page
    pg.wait_for_function(f"() => ({ANALYSED})() >= 0", timeout=WAIT_MS)
    first_step: int = pg.evaluate(ANALYSED)
    underflow = '#findings li[data-identity="gradient_underflow"]'
    live.drive_until(f"() => !!document.querySelector('{underflow}')")
    # Mark the element; a later analysis must update this very element, not replace it.
    pg.evaluate(f"() => {{ document.querySelector('{underflow}').__kept = true; }}")
    at: int = pg.evaluate(ANALYSED)
    live.drive_until(f"() => ({ANALYSED})() >= {at + 100}")
    assert pg.evaluate(f"() => document.querySelector('{underflow}').__kept === true")
    assert pg.evaluate(ANALYSED) > first_step
    note = pg.locator("#findings .panel-note").inner_text()
    assert f"analysed at step {pg.evaluate(ANALYSED)}" in note
    # The card uses the finding's definition and says so.
    assert pg.locator("#card-worst-label").text_content() == (
        "Most lost to fp16 · median, last 5 layer-stat steps")
    # The relative time moves on without new data: a minute later (the page's clock) it reads
    # otherwise, in seconds or minutes alike.
    started = pg.locator('.meta-value[data-ago]')
    before = started.inner_text()
    pg.clock.fast_forward(60_000)
    pg.wait_for_function("(old) => document.querySelector('.meta-value[data-ago]').textContent "
                         "!== old", arg=before, timeout=WAIT_MS)
    live.run_page.screenshot("live-findings.png", full_page=False)
    live.assert_clean()


def _window(seen: list[Seen]) -> list[Seen]:
    """The analyses from the first at or past WARMUP_STEP whose predecessor showed the underflow
    too (the runs list hears of an analysis with the next batch: one checkpoint late)."""
    for i in range(1, len(seen)):
        if seen[i].step >= WARMUP_STEP and all(
                "gradient_underflow" in s.shown for s in seen[i - 1:i + 1]):
            return seen[i:]
    return []


def test_no_flicker_after_warm_up(live: Live) -> None:
    while len(_window(live.seen)) < ANALYSES:
        live.checkpoint()
    window = _window(live.seen)[:ANALYSES]
    shown = [s.shown for s in window]
    headlines = [s.headline for s in window]
    steps = [s.step for s in window]
    assert steps[-1] > steps[0], "the run page kept analysing while observed"
    flips = sum(len(a ^ b) for a, b in itertools.pairwise(shown))
    assert flips == 0, list(zip(steps, shown, strict=True))
    assert "gradient_underflow" in shown[0]
    assert len(set(headlines)) == 1 and headlines[0] is not None, headlines
    summary = httpx.get(f"{live.server.url}/api/runs/{live.run_id}", timeout=30).json()
    assert f"{summary['top_finding']['severity']} {summary['top_finding']['kind']}" == headlines[0]
    live.assert_clean()
