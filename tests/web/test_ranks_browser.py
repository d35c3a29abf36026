"""Distributed runs in a real browser: the runs list says "N ranks" beside a run of N > 1
processes (and nothing for one), the run page names the rank that went non-finite first, read
from `/ranks`. Names that look like markup stay text; no console error, no CSP violation."""

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
XSS_NAME = '<img src=x onerror="window.__xss=1">'
RANK_BADGES = """() => Object.fromEntries([...document.querySelectorAll('#runs-body tr')].map(
  (tr) => [tr.dataset.runId, tr.querySelector('.ranks-badge')?.textContent ?? null]))"""


def _post(server: ServerProcess, payload: dict[str, Any]) -> None:
    response = httpx.post(f"{server.url}/api/ingest", json=payload, timeout=30)
    assert response.status_code == 200, response.text


def _v4(run_id: str, name: str, world_size: int, bad_step: int | None) -> dict[str, Any]:
    records = []
    for i in range(8):
        loss: list[Any] = [2.0 - 0.1 * i] * world_size
        nonfinite: list[int | None] = [0] * world_size
        if bad_step is not None and i >= bad_step:
            loss[1] = "nan"
        records.append(record(i, with_layers=False, ranks={"loss": loss, "nonfinite": nonfinite},
                              optimizers=[{"skipped": None, "lr": [1e-3]}]))
    payload = batch(records, run_id=run_id, name=name, world_size=world_size)
    payload["schema_version"] = 4
    return payload


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess,
                                                                        dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("ranks")
    server = ServerProcess(migrated_sqlite(tmp), tmp).start()
    try:
        ids = {"single": new_id(), "pair": new_id(), "four": new_id(), "many": new_id(),
               "shards": new_id()}
        _post(server, batch([record(i, with_layers=False) for i in range(3)],
                            run_id=ids["single"], name="single"))
        _post(server, _v4(ids["pair"], XSS_NAME, 2, None))
        _post(server, _v4(ids["four"], "four", 4, 5))
        many = _v4(ids["many"], "many", 4, None)
        many["records"][2]["ranks"] = {"loss": ["inf", 1.0, 1.0, None], "nonfinite": [0, 0, 3, 0]}
        _post(server, many)
        shards = _v4(ids["shards"], "shards", 4, None)  # gradients only, every loss finite
        shards["records"][1]["ranks"] = {"loss": [1.0] * 4, "nonfinite": [0, 2, 0, 1]}
        _post(server, shards)
        yield server, ids
    finally:
        server.stop()


def test_the_runs_list_shows_the_world_size(
    served: tuple[ServerProcess, dict[str, str]], watched: Watched,
) -> None:
    server, ids = served
    page = watched.page
    page.goto(f"{server.url}/")
    page.wait_for_function(
        "() => document.querySelectorAll('#runs-body tr').length === 5", timeout=WAIT_MS)
    assert page.evaluate(RANK_BADGES) == {
        ids["single"]: None, ids["pair"]: "2 ranks", ids["four"]: "4 ranks",
        ids["many"]: "4 ranks", ids["shards"]: "4 ranks"}
    pair = page.locator(f'#runs-body tr[data-run-id="{ids["pair"]}"] .run-name a')
    assert pair.inner_text() == XSS_NAME
    assert page.evaluate("() => window.__xss") is None
    watched.assert_clean()


@pytest.mark.parametrize(("run", "text"), [
    ("four", "First non-finite: rank 1 at step 5 (loss NaN) while 3 other ranks' losses were "
             "finite: inspect that rank's batch."),
    ("pair", "2 ranks: no rank's loss or gradients have been NaN or inf."),
    # Rank 2's gradients held NaN too, but rank 0's own loss is where it started.
    ("many", "First non-finite: rank 0 at step 2 (loss +inf) while 2 other ranks' losses were "
             "finite: inspect that rank's batch."),
    ("shards", "First non-finite: gradients at step 1 (rank 1: 2 layers with NaN/inf "
               "gradients; rank 3: 1 layer with NaN/inf gradients), every loss finite."),
])
def test_the_run_page_names_the_first_nonfinite_rank(
    served: tuple[ServerProcess, dict[str, str]], run: str, text: str, watched: Watched,
) -> None:
    server, ids = served
    page = watched.page
    page.goto(f"{server.url}/runs/{ids[run]}")
    page.wait_for_function("() => !document.getElementById('rank-note').hidden",
                           timeout=WAIT_MS)
    assert page.locator("#rank-note").inner_text() == text
    assert page.evaluate("() => document.getElementById('rank-note').classList"
                         ".contains('bad')") is (run != "pair")
    world = page.locator(".meta-item", has_text="world size").inner_text()
    assert world.split() == ["world", "size", "2" if run == "pair" else "4"]
    page.wait_for_function("() => window.ampscope !== undefined", timeout=WAIT_MS)
    assert page.evaluate("() => window.__xss") is None
    watched.assert_clean()


def test_a_single_process_run_has_no_rank_line(
    served: tuple[ServerProcess, dict[str, str]], watched: Watched,
) -> None:
    server, ids = served
    page = watched.page
    page.goto(f"{server.url}/runs/{ids['single']}")
    page.wait_for_function("() => window.ampscope !== undefined", timeout=WAIT_MS)
    assert page.locator("#rank-note").is_hidden()
    assert page.locator(".meta-item", has_text="world size").count() == 0
    watched.assert_clean()
