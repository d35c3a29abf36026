"""Dark mode (issue #31), in a real Chromium told the system prefers dark: the pages take the dark
palette (web/css/dark.css), the charts too (plot.js's THEME), and no text fails WCAG AA contrast.

The contrast is computed here from the computed styles, as axe-core's color-contrast rule does
(no copy of axe is available offline): for every visible text node outside the charts' SVG, its
colour (alpha-blended) against the backgrounds of its ancestors composited from the root, the
ratio (L1 + 0.05) / (L2 + 0.05) of relative luminances, at least 4.5 (3 for large text: 24 px, or
18.66 px bold). Disabled controls are exempt, as WCAG exempts inactive components."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.findings.payloads import healthy_batch, troubled_batch
from tests.server.wire import new_id
from tests.support.browser import Watched
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.browser

WAIT_MS = 15_000

CONTRAST = """() => {
  const parse = (c) => {
    const m = /rgba?\\(([^)]+)\\)/.exec(c);
    if (!m) return null;
    const p = m[1].split(/[\\s,/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const channel = (v) => {
    const x = v / 255;
    return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4;
  };
  const lum = (c) => 0.2126 * channel(c[0]) + 0.7152 * channel(c[1]) + 0.0722 * channel(c[2]);
  const over = (top, bottom) => [0, 1, 2]
    .map((i) => top[i] * top[3] + bottom[i] * (1 - top[3])).concat([1]);
  const background = (node) => {
    const chain = [];
    for (let n = node; n; n = n.parentElement) chain.unshift(n);
    let bg = [255, 255, 255, 1];
    for (const n of chain) {
      const c = parse(getComputedStyle(n).backgroundColor);
      if (c && c[3] > 0) bg = over(c, bg);
    }
    return bg;
  };
  const failures = [];
  let checked = 0;
  const seen = new Set();
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const text = walker.currentNode;
    const node = text.parentElement;
    if (!text.textContent.trim() || !node || seen.has(node)) continue;
    seen.add(node);
    if (node.closest('svg, script, style, template, option, [hidden], :disabled')) continue;
    const box = node.getBoundingClientRect();
    const style = getComputedStyle(node);
    if (!box.width || !box.height || style.visibility === 'hidden') continue;
    const bg = background(node);
    const fg = over(parse(style.color), bg);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (Number(style.fontWeight) >= 700 && size >= 18.66);
    checked += 1;
    if (ratio < (large ? 3 : 4.5)) {
      const what = `${node.tagName.toLowerCase()}.${node.className}`;
      failures.push(`${ratio.toFixed(2)}: ${style.color} on rgb(${bg.slice(0, 3).map(Math.round)})`
        + ` ${what} "${text.textContent.trim().slice(0, 40)}"`);
    }
  }
  return { checked, failures, bg: getComputedStyle(document.body).backgroundColor };
}"""


@pytest.fixture
def context_options() -> dict[str, Any]:
    return {"color_scheme": "dark"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[str]]]:
    tmp = tmp_path_factory.mktemp("dark-mode")
    server = ServerProcess(migrated_sqlite(tmp), tmp).start()
    ids = []
    try:
        for make in (troubled_batch, healthy_batch):
            run_id = new_id()
            response = httpx.post(f"{server.url}/api/ingest", json=make(run_id), timeout=60)
            assert response.status_code == 200, response.text
            ids.append(run_id)
        yield server, ids
    finally:
        server.stop()


def _check(watched: Watched, name: str) -> None:
    result = watched.js(CONTRAST)
    watched.screenshot(f"dark-{name}.png", full_page=False)
    assert result["bg"] == "rgb(13, 17, 23)"  # the dark palette is on
    assert result["checked"] > 20
    assert result["failures"] == [], "\n".join(result["failures"])


def test_the_runs_list_is_dark_and_readable(
        served: tuple[ServerProcess, list[str]], watched: Watched) -> None:
    server, ids = served
    watched.page.goto(f"{server.url}/")
    watched.page.locator(f'tr[data-run-id="{ids[0]}"] .finding-brief').wait_for(timeout=WAIT_MS)
    _check(watched, "runs")
    watched.assert_clean()


def test_the_run_page_is_dark_and_readable(
        served: tuple[ServerProcess, list[str]], watched: Watched) -> None:
    server, ids = served
    pg = watched.page
    pg.goto(f"{server.url}/runs/{ids[0]}")
    pg.locator('#findings li[data-identity="overflow_storm"]').wait_for(timeout=WAIT_MS)
    pg.locator("#events-body tr").first.wait_for(timeout=WAIT_MS)
    backgrounds = watched.js("""() => ['scale-chart', 'loss-chart', 'layer-lines'].map(
      (id) => document.getElementById(id)._fullLayout.plot_bgcolor)""")
    assert backgrounds == ["#0d1117"] * 3
    _check(watched, "run")
    pg.evaluate("() => window.scrollTo(0, document.body.scrollHeight / 2)")
    watched.screenshot("dark-run-middle.png", full_page=False)
    watched.assert_clean()


def test_the_compare_page_is_dark_and_readable(
        served: tuple[ServerProcess, list[str]], watched: Watched) -> None:
    server, ids = served
    watched.page.goto(f"{server.url}/compare?runs={ids[1]},{ids[0]}")
    watched.wait_for("() => window.ampscope && window.ampscope.compare.ready")
    _check(watched, "compare")
    watched.assert_clean()
