"""The run page's layer table lists canonical layer names and shows the model's own name (a
wrapper's ``module.``/``_orig_mod.`` kept) on hover where it differs; real Chromium."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.server.wire import LAYERS, batch, new_id, record
from tests.support.browser import Watched
from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.browser
WAIT_MS = 15_000


def test_the_layer_table_shows_the_raw_name_on_hover(
    tmp_path: Path, watched: Watched
) -> None:
    server = ServerProcess(migrated_sqlite(tmp_path), tmp_path).start()
    try:
        run_id = new_id()
        layers = [{**LAYERS[0], "raw_name": "_orig_mod.module.fc1.weight"},
                  {**LAYERS[1], "raw_name": LAYERS[1]["name"]}]
        response = httpx.post(f"{server.url}/api/ingest", timeout=30, json=batch(
            [record(i) for i in range(3)], run_id=run_id, layers=layers))
        assert response.status_code == 200, response.text
        page = watched.page
        page.goto(f"{server.url}/runs/{run_id}")
        page.wait_for_function(
            "() => document.querySelectorAll('#layer-body tr').length === 2",
            timeout=WAIT_MS)
        cells = page.locator("#layer-body .layer-cell").evaluate_all(
            "(cells) => cells.map((c) => [c.textContent, c.title])")
        assert cells == [["fc1.weight", "in the model: _orig_mod.module.fc1.weight"],
                         ["fc1.bias", ""]]
        watched.assert_clean()
    finally:
        server.stop()
