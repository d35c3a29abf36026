"""POST /api/ingest: one wire batch (docs/contracts.md, "Wire v1" and "Wire v2")."""

from __future__ import annotations

from fastapi import APIRouter

from ampscope_server import ingest
from ampscope_server.deps import SessionDep
from ampscope_server.schemas import ErrorBody, IngestBatch, IngestResult

router = APIRouter(prefix="/api", tags=["ingest"])


@router.post(
    "/ingest",
    responses={
        409: {"model": ErrorBody, "description": "Layer or module table missing or different"},
        422: {"model": ErrorBody, "description": "Invalid batch"},
    },
)
def post_ingest(batch: IngestBatch, session: SessionDep) -> IngestResult:
    return ingest.ingest_batch(session, batch)
