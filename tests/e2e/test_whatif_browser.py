"""The "what if the scale were x k?" view in a real browser (issue #14): the demo's model trained
with real FP16 AMP under the real hook (exponent histograms every 10 steps), served by a real
server (SQLite). For several k, the shares the page computes from the histogram must equal a
NumPy reference over the same histogram (GET /api/runs/{id}/histogram); the layer that would
overflow first must come first. No console error, no CSP violation."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from playwright.sync_api import Page

import ampscope
from tests.support.browser import Watched, artifact
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo_model import make_training, train_step

pytestmark = pytest.mark.browser

STEPS = 40
WAIT_MS = 15_000


def reference(counts: list[int], min_exp: int, max_exp: int, scale: float,
              fmt: dict[str, float]) -> dict[str, int]:
    """NumPy: each bin's lower edge (the bin below the range: half its upper edge 2^min_exp)
    times the scale, classed against the format's limits."""
    c = np.asarray(counts, dtype=np.int64)
    lower = np.concatenate([[2.0 ** (min_exp - 1)], 2.0 ** np.arange(min_exp, max_exp + 2)])
    values, n = lower * scale, c[2:]
    overflow = values > fmt["max"]
    flushed = ~overflow & (values < fmt["min_subnormal"] / 2)
    subnormal = ~overflow & ~flushed & (values < fmt["min_normal"])
    fits = ~(overflow | flushed | subnormal)
    return {"zero": int(c[0]), "nonfinite": int(c[1]), "flushed": int(n[flushed].sum()),
            "subnormal": int(n[subnormal].sum()), "overflow": int(n[overflow].sum()),
            "fits": int(n[fits].sum()), "total": int(c.sum())}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    tmp = tmp_path_factory.mktemp("whatif-browser")
    server = ServerProcess(migrated_sqlite(tmp), tmp).start()
    try:
        model, scaler, optimizer, gen = make_training()
        mon = ampscope.watch(model, scaler, optimizer, run="whatif-e2e", server=server.url,
                             layer_every=10, histogram_every=10)
        try:
            for _ in range(STEPS):
                train_step(model, scaler, optimizer, gen)
        finally:
            mon.close()
        yield server, mon.run_id
    finally:
        server.stop()


def _set_doublings(pg: Page, d: int) -> list[dict[str, Any]]:
    pg.evaluate("""(d) => {
      const slider = document.getElementById('whatif-k');
      slider.value = String(d);
      slider.dispatchEvent(new Event('input'));
    }""", d)
    rows: list[dict[str, Any]] = pg.evaluate("() => window.ampscope.whatIf.rows")
    return rows


def test_shares_match_a_numpy_reference(served: tuple[ServerProcess, str],
                                        watched: Watched) -> None:
    server, run_id = served
    pg = watched.page
    view = httpx.get(f"{server.url}/api/runs/{run_id}/histogram", timeout=30).json()
    assert view["step"] == 30 and view["steps"] == [30, 20, 10, 0]
    assert view["format"] == {"name": "fp16", "max": 65504.0, "min_normal": 2.0**-14,
                              "min_subnormal": 2.0**-24}
    assert len(view["layers"]) == len(view["counts"]) == 19
    pg.goto(f"{server.url}/runs/{run_id}")
    pg.wait_for_function("() => window.ampscope && window.ampscope.whatIf"
                         " && window.ampscope.whatIf.rows.length === 19", timeout=WAIT_MS)
    scale = view["scale"]
    seen_overflow = seen_flush = False
    for d in (-12, -4, 0, 3, 8, 16):
        rows = {r["name"]: r for r in _set_doublings(pg, d)}
        for name, counts in zip(view["layers"], view["counts"], strict=True):
            want = reference(counts, view["min_exp"], view["max_exp"], scale * 2.0**d,
                             view["format"])
            got = {k: rows[name][k] for k in want}
            assert got == want, (d, name)
            seen_overflow |= want["overflow"] > 0
            seen_flush |= want["flushed"] > 0
        # The table lists the layer that overflows first (fewest doublings left) first.
        body = pg.locator("#whatif-body tr").evaluate_all("rs => rs.map((r) => r.dataset.layer)")
        left = {name: rows[name]["overflowDoublings"] for name in rows}
        assert left[body[0]] == min(v for v in left.values() if v is not None)
    assert seen_overflow and seen_flush, "the chosen k cover both ends of the format"
    pg.locator("#whatif-panel").screenshot(path=str(artifact("whatif.png")))
    watched.assert_clean()


def test_unknown_sampled_step_is_a_404(served: tuple[ServerProcess, str]) -> None:
    server, run_id = served
    response = httpx.get(f"{server.url}/api/runs/{run_id}/histogram?step=5", timeout=30)
    assert response.status_code == 404
    assert response.json() == {"detail": f"run '{run_id}' has no exponent histogram at step 5 "
                                         "(sampled: the last 4 are 30, 20, 10, 0)"}
