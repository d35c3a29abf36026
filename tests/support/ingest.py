"""Getting a wire batch (a JSON-able dict, `tests/server/wire.py`) into a database in tests:
through the ingest service in this process, or posted over HTTP to an app or a server.

The service path parses the batch from its JSON text, as `POST /api/ingest` parses a body: the
tagged non-finite floats ("nan", "inf", "-inf") arrive as the wire sends them, and a float NaN
in a hand-built dict is refused as a real client's bare NaN would be.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from ampscope_server.ingest import batches as ingest
from ampscope_server.ingest.schemas import IngestResult
from ampscope_server.ingest.wire import IngestBatch
from ampscope_server.store import db
from tests.server.wire import strict_json


def ingest_payload(factory: sessionmaker[Session], payload: dict[str, Any],
                   now: float | None = None) -> IngestResult:
    """Ingest one batch in one transaction, committed on return; `now` stands for the clock."""
    with factory() as session, session.begin():
        return ingest.ingest_batch(session, IngestBatch.model_validate_json(json.dumps(payload)),
                                   now=now)


def ingest_into(url: str, *payloads: dict[str, Any]) -> None:
    """Ingest batches, each in a transaction of its own, into the database at `url` (which no
    engine of the test holds: a migration test's database between two revisions)."""
    engine = db.make_engine(url)
    try:
        factory = db.make_session_factory(engine)
        for payload in payloads:
            ingest_payload(factory, payload)
    finally:
        engine.dispose()


def post_batch(client: httpx.Client | TestClient, payload: dict[str, Any], status: int = 200
               ) -> Any:
    """POST one batch to `/api/ingest` of the app in process (starlette's `TestClient`, an httpx2
    client) or of a real server (httpx), assert the status, and return the body as a browser
    would parse it (no bare NaN)."""
    response = client.post("/api/ingest", json=payload)
    assert response.status_code == status, response.text
    return strict_json(response.text)
