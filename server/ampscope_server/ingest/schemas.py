"""What ingest answers; the batch it takes is `ingest.wire`'s."""

from __future__ import annotations

from pydantic import BaseModel


class IngestResult(BaseModel):
    run_id: str
    attempt: int
    accepted: int
    duplicates: int
