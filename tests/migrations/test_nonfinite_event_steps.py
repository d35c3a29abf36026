"""Revision 0019 rebuilds the event steps' partial index with `found_inf` in its condition, on
both dialects, and back: the index's condition is the one `models.STEP_IS_EVENT` repeats."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from ampscope_server.store import db
from ampscope_server.store.models import STEP_IS_EVENT
from tests.migrations.support import query

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations (test_migrations.py keeps the models-against-
# schema check in the fast tier).
pytestmark = pytest.mark.slow

INDEX = "ix_steps_run_key_event_step"


def _definition(url: str) -> str:
    if make_url(url).get_backend_name() == "sqlite":
        rows = query(url, f"SELECT sql FROM sqlite_master WHERE name = '{INDEX}'")
    else:
        rows = query(url, f"SELECT indexdef FROM pg_indexes WHERE indexname = '{INDEX}'")
    assert len(rows) == 1
    return str(rows[0][0])


def test_0019_puts_found_inf_into_the_event_index_and_back(db_url: str) -> None:
    db.upgrade(db_url)
    assert "found_inf" in STEP_IS_EVENT and "found_inf" in _definition(db_url)
    db.downgrade(db_url, "0018")
    assert "found_inf" not in _definition(db_url) and "skipped" in _definition(db_url)
    db.upgrade(db_url)
    assert "found_inf" in _definition(db_url)
