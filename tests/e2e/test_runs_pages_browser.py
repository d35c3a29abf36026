"""The runs list pages in a real browser: the first page comes over the socket (no GET), the
next by the cursor when the list is scrolled to its end, a filter is answered by the server
(it finds a run beyond the loaded pages), and a run pushed live still joins. No console error,
no CSP violation."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.server.wire import batch, new_id, record
from tests.support.browser import Watched
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.browser

WAIT_MS = 15_000
RUNS = 130  # more than a page (100)
ROWS = "() => [...document.querySelectorAll('#runs-body tr')].map((tr) => tr.dataset.runId)"


def _post(server: ServerProcess, run_id: str, name: str, steps: int = 1) -> None:
    response = httpx.post(f"{server.url}/api/ingest", timeout=30, json=batch(
        [record(i, with_layers=False) for i in range(steps)], run_id=run_id, name=name))
    assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[str]]]:
    tmp = tmp_path_factory.mktemp("runs-pages")
    server = ServerProcess(migrated_sqlite(tmp), tmp).start()
    try:
        ids = []
        for i in range(RUNS):
            run_id = new_id()
            _post(server, run_id, "needle-in-page-two" if i == 3 else f"hay-{i:03d}")
            ids.append(run_id)
        yield server, ids[::-1]  # newest first, as the list shows them
    finally:
        server.stop()


def test_pages_filter_and_live(served: tuple[ServerProcess, list[str]],
                               watched: Watched) -> None:
    server, ids = served
    pg = watched.page
    lists: list[str] = []  # the page's GET /api/runs
    pg.on("request", lambda r: lists.append(r.url.split("/", 3)[3])
          if r.url.split("?")[0].endswith("/api/runs") else None)
    pg.goto(f"{server.url}/")
    pg.wait_for_function(f"() => ({ROWS})().length === 100", timeout=WAIT_MS)
    assert pg.evaluate(ROWS) == ids[:100]
    assert lists == []  # the first page is the socket's snapshot
    assert pg.locator("#run-count").inner_text() == f"100 of {RUNS} runs"

    # Scrolled to the end: the next page, by the cursor the snapshot carried.
    pg.locator("#load-more").scroll_into_view_if_needed()
    pg.wait_for_function(f"() => ({ROWS})().length === {RUNS}", timeout=WAIT_MS)
    assert pg.evaluate(ROWS) == ids
    assert len(lists) == 1 and "cursor=" in lists[0]
    assert pg.locator("#load-more-row").is_hidden()
    assert pg.locator("#run-count").inner_text() == f"{RUNS} runs"

    # A filter is the server's: reloaded, it finds the run on page two.
    pg.evaluate("() => window.scrollTo(0, 0)")
    pg.reload()
    pg.wait_for_function(f"() => ({ROWS})().length === 100", timeout=WAIT_MS)
    assert ids[RUNS - 4] not in pg.evaluate(ROWS)  # the needle is on page two
    with pg.expect_response(lambda r: "q=needle" in r.url, timeout=WAIT_MS):
        pg.fill("#filter", "needle")
    pg.wait_for_function(f"() => ({ROWS})().length === 1 && ({ROWS})()[0] === '{ids[RUNS - 4]}'",
                         timeout=WAIT_MS)
    assert pg.locator("#run-count").inner_text() == "1 matching run"

    # Live: a new run that matches joins; one that does not stays out.
    hit, miss = new_id(), new_id()
    _post(server, hit, "needle-live")
    _post(server, miss, "hay-live")
    pg.wait_for_function(f"() => ({ROWS})().includes('{hit}')", timeout=WAIT_MS)
    assert miss not in pg.evaluate(ROWS)
    watched.assert_clean()


LINE_ENDS = """([id, selector]) => {
  const link = document.querySelector(`tr[data-run-id="${id}"] ${selector}`);
  const lines = new Map();
  for (const node of link.childNodes) {
    if (node.nodeType !== Node.TEXT_NODE) continue;
    for (let i = 0; i < node.length; i += 1) {
      const range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const top = Math.round(range.getBoundingClientRect().top);
      lines.set(top, (lines.get(top) ?? '') + node.data[i]);
    }
  }
  const clipped = link.scrollWidth > link.clientWidth || link.scrollHeight > link.clientHeight;
  return {text: link.textContent, lines: [...lines.values()], clipped};
}"""


def test_a_long_run_name_wraps_between_its_parts(served: tuple[ServerProcess, list[str]],
                                                 watched: Watched) -> None:
    server, _ = served
    name = "resnet50_imagenet_bf16_lr3e-4_warmup2000_seed17.cosine"
    run_id = new_id()
    _post(server, run_id, name)
    pg = watched.page
    pg.goto(f"{server.url}/")
    pg.wait_for_selector(f'tr[data-run-id="{run_id}"] td.run-name a', timeout=WAIT_MS)
    seen = pg.evaluate(LINE_ENDS, [run_id, "td.run-name a"])
    assert seen["text"] == name  # copies as written: no invisible characters
    assert "".join(seen["lines"]) == name and len(seen["lines"]) > 1
    assert [line[-1] for line in seen["lines"][:-1] if line[-1] not in "_-./:"] == []
    watched.assert_clean()


def test_a_long_tag_is_shown_whole(served: tuple[ServerProcess, list[str]],
                                   watched: Watched) -> None:
    """A tag wraps between its parts inside its chip: nothing cut, nothing broken mid-word (it
    was cut with an ellipsis at ~20 characters)."""
    server, _ = served
    tag = "tokenizer-sentencepiece_v2.unigram_32k"
    run_id = new_id()
    response = httpx.post(f"{server.url}/api/ingest", timeout=30, json=batch(
        [record(0, with_layers=False)], run_id=run_id, name="tagged", tags=["amp", tag]))
    assert response.status_code == 200, response.text
    pg = watched.page
    pg.goto(f"{server.url}/")
    chip = 'td.tags .tag:nth-child(2)'
    pg.wait_for_selector(f'tr[data-run-id="{run_id}"] {chip}', timeout=WAIT_MS)
    seen = pg.evaluate(LINE_ENDS, [run_id, chip])
    assert seen["text"] == tag and not seen["clipped"]
    assert "".join(seen["lines"]) == tag and len(seen["lines"]) > 1
    assert [line[-1] for line in seen["lines"][:-1] if line[-1] not in "_-./:"] == []
    watched.assert_clean()
