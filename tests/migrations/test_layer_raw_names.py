"""Revision 0018 (`layers.raw_name`) keeps every layer row both ways, on both dialects, and
backfills the raw name of the rows stored before it with their `name`: what clients sent then."""

from __future__ import annotations

from typing import Any

import pytest

from ampscope_server.store import db
from tests.migrations.support import query
from tests.server.wire import LAYERS, batch, new_id, record
from tests.support.ingest import ingest_into

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations (test_migrations.py keeps the models-against-
# schema check in the fast tier).
pytestmark = pytest.mark.slow

LAYER_ROWS = ("SELECT r.id, l.\"index\", l.name, l.shape, l.dtype, l.numel, l.module_type "
              "FROM layers l JOIN runs r ON r.id = l.run_id ORDER BY r.id, l.\"index\"")


def _raw_names(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT r.id, l.\"index\", l.raw_name FROM layers l JOIN runs r "
                      "ON r.id = l.run_id ORDER BY r.id, l.\"index\"")


def test_0018_keeps_the_layers_and_backfills_raw_names(db_url: str) -> None:
    db.upgrade(db_url)
    ddp, compiled = sorted([new_id(), new_id()])
    # A DDP run as clients before issue #13 stored it: the raw name as `name`, no `raw_name`.
    ingest_into(db_url, batch([record(0)], run_id=ddp, layers=[
        {**layer, "name": f"module.{layer['name']}"} for layer in LAYERS]))
    # A compiled run of a newer client: canonical names, the raw ones beside.
    ingest_into(db_url, batch([record(0)], run_id=compiled, layers=[
        {**layer, "raw_name": f"_orig_mod.{layer['name']}"} for layer in LAYERS]))
    head = query(db_url, LAYER_ROWS)
    assert [row[:3] for row in head] == [
        (ddp, 0, "module.fc1.weight"), (ddp, 1, "module.fc1.bias"),
        (compiled, 0, "fc1.weight"), (compiled, 1, "fc1.bias")]
    assert _raw_names(db_url) == [
        (ddp, 0, "module.fc1.weight"), (ddp, 1, "module.fc1.bias"),
        (compiled, 0, "_orig_mod.fc1.weight"), (compiled, 1, "_orig_mod.fc1.bias")]

    db.downgrade(db_url, "0017")
    assert query(db_url, LAYER_ROWS) == head

    db.upgrade(db_url)
    assert query(db_url, LAYER_ROWS) == head
    # Backfilled from `name`: exact for the old client's run; the newer client's raw names were
    # lost by the downgrade (its docstring says so), its canonical names kept.
    assert _raw_names(db_url) == [
        (ddp, 0, "module.fc1.weight"), (ddp, 1, "module.fc1.bias"),
        (compiled, 0, "fc1.weight"), (compiled, 1, "fc1.bias")]
