"""Per-optimizer view in a real browser: a run with two optimizers shows, for each, its skipped
steps (count, the steps, red ✕ markers) and the lr of each of its parameter groups labelled
"optimizer N, group G" (a NaN/inf lr a red tick, not dropped), and carries on from the live
socket; a one-optimizer run shows none of it. The live steps' `ranks` name the first non-finite
rank without asking /ranks again. No console error, no CSP violation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.wire import batch, new_id, record
from tests.support.browser import Watched
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.browser

WAIT_MS = 15_000
STEPS = 12
SKIPS = (3, 7, 8)
"""The steps where optimizer 1 skipped (optimizer 0 never does)."""
SHOWN = "window.ampscope.optimizers.shown"
"""What the panel shows (`OptimizerPanel.shown`): each optimizer's line and its chart's traces."""


def _post(server: ServerProcess, payload: dict[str, Any]) -> None:
    response = httpx.post(f"{server.url}/api/ingest", json=payload, timeout=30)
    assert response.status_code == 200, response.text


def _optimizers(step: int) -> list[dict[str, Any]]:
    return [{"skipped": False, "lr": [1e-3, 1e-4]},
            {"skipped": step in SKIPS, "lr": ["nan" if step == 5 else 0.01]}]


def _v4(run_id: str, steps: range, *, first: bool, world_size: int = 2,
        ranks: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    records = [record(i, with_layers=False, optimizers=_optimizers(i),
                      ranks=(ranks or {}).get(i, {"loss": [1.0] * world_size,
                                                  "nonfinite": [0] * world_size}))
               for i in steps]
    payload = batch(records, run_id=run_id, name="two optimizers", world_size=world_size,
                    layers=None if not first else batch([], run_id=run_id)["layers"])
    payload["schema_version"] = 4
    return payload


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("optimizers")
    proc = ServerProcess(migrated_sqlite(tmp), tmp).start()
    try:
        yield proc
    finally:
        proc.stop()


def _trace_xs(shown: list[dict[str, Any]]) -> list[dict[str, list[int]]]:
    return [{trace["name"]: trace["x"] for trace in block["traces"]} for block in shown]


def test_two_optimizers_their_skips_and_lr(server: ServerProcess, watched: Watched) -> None:
    run_id = new_id()
    _post(server, _v4(run_id, range(STEPS), first=True))
    page = watched.page
    page.goto(f"{server.url}/runs/{run_id}")
    page.wait_for_function("() => window.ampscope !== undefined", timeout=WAIT_MS)
    page.wait_for_function(f"() => {SHOWN}.length === 2", timeout=WAIT_MS)
    assert page.locator("#optimizers-panel").is_visible()
    assert page.locator(".optimizer-note").all_inner_texts() == [
        "optimizer 0 · 2 parameter groups · no step skipped of 12 steps",
        "optimizer 1 · 1 parameter group · skipped 3 of 12 steps: 3, 7, 8",
    ]
    assert page.evaluate("() => [...document.querySelectorAll('.optimizer-note')]"
                         ".map((n) => n.classList.contains('warn'))") == [False, True]
    shown = page.evaluate(f"() => {SHOWN}")
    every = list(range(STEPS))
    assert _trace_xs(shown) == [
        {"optimizer 0 skipped step": [], "lr not finite (NaN or inf)": [],
         "optimizer 0, group 0": every, "optimizer 0, group 1": every},
        {"optimizer 1 skipped step": [3, 7, 8], "lr not finite (NaN or inf)": [5],
         "optimizer 1, group 0": every},
    ]
    lines = {trace["name"]: trace["y"] for block in shown for trace in block["traces"]}
    assert lines["optimizer 0, group 1"] == [1e-4] * STEPS
    # The NaN lr is a gap in the line and a tick at its step, not a dropped point.
    assert lines["optimizer 1, group 0"] == [None if i == 5 else 0.01 for i in every]
    assert page.evaluate("() => document.querySelectorAll('#optimizers .js-plotly-plot')"
                         ".length") == 2

    # Live: more steps, one of them skipped by optimizer 1 with an inf lr; the charts and
    # the counts carry on without reading /optimizers again.
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    later = _v4(run_id, range(STEPS, STEPS + 3), first=False)
    later["records"][1]["optimizers"][1] = {"skipped": True, "lr": ["inf"]}
    _post(server, later)
    page.wait_for_function(
        f"() => {SHOWN}[1].text.startsWith('optimizer 1 · 1 parameter group · skipped 4 ')",
        timeout=WAIT_MS)
    shown = page.evaluate(f"() => {SHOWN}")
    assert [block["text"] for block in shown] == [
        "optimizer 0 · 2 parameter groups · no step skipped of 15 steps",
        "optimizer 1 · 1 parameter group · skipped 4 of 15 steps: 3, 7, 8, 13",
    ]
    xs = _trace_xs(shown)[1]
    assert xs["optimizer 1 skipped step"] == [3, 7, 8, 13]
    assert xs["lr not finite (NaN or inf)"] == [5, 13]
    assert xs["optimizer 1, group 0"] == list(range(STEPS + 3))
    assert not [url for url in asked if "/optimizers" in url]
    watched.assert_clean()


def test_a_one_optimizer_run_shows_none_of_it(server: ServerProcess, watched: Watched) -> None:
    run_id = new_id()
    _post(server, batch([record(i, with_layers=False) for i in range(5)], run_id=run_id))
    page = watched.page
    page.goto(f"{server.url}/runs/{run_id}")
    page.wait_for_function("() => window.ampscope !== undefined", timeout=WAIT_MS)
    _post(server, batch([record(5, with_layers=False)], run_id=run_id, layers=None))
    page.wait_for_function("() => window.ampscope.lastStep.step === 5", timeout=WAIT_MS)
    assert page.locator("#optimizers-panel").is_hidden()
    assert page.evaluate(f"() => {SHOWN}") == []
    assert page.locator(".optimizer-note").count() == 0
    watched.assert_clean()


def test_live_steps_name_the_first_nonfinite_rank_without_asking_again(
    server: ServerProcess, watched: Watched,
) -> None:
    run_id = new_id()
    _post(server, _v4(run_id, range(3), first=True, world_size=4))
    page = watched.page
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    page.goto(f"{server.url}/runs/{run_id}")
    page.wait_for_function("() => !document.getElementById('rank-note').hidden",
                           timeout=WAIT_MS)
    assert page.locator("#rank-note").inner_text() == (
        "4 ranks: no rank's loss or gradients have been NaN or inf.")
    bad = {4: {"loss": [1.0, 1.0, "nan", 1.0], "nonfinite": [2, 2, 2, 2]},
           5: {"loss": ["inf", 1.0, 1.0, 1.0], "nonfinite": [0, 0, 0, 0]}}
    _post(server, _v4(run_id, range(3, 6), first=False, world_size=4, ranks=bad))
    page.wait_for_function(
        "() => document.getElementById('rank-note').classList.contains('bad')",
        timeout=WAIT_MS)
    assert page.locator("#rank-note").inner_text() == (
        "First non-finite: rank 2 at step 4 (loss NaN) while 3 other ranks' losses were "
        "finite: inspect that rank's batch.")
    assert len([url for url in asked if url.endswith("/ranks")]) == 1
    watched.assert_clean()
