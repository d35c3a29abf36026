"""POST /api/ingest: one wire batch (docs/contracts.md, "Wire v1" … "v6").

The body is read on the event loop (capped by `limits.BodyLimit`), then parsed, validated and
stored in the threadpool: an 8 MiB batch never holds up other requests (/api/health). The body
is therefore not a FastAPI parameter; `document` puts its schema into the OpenAPI document.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from ampscope_server.access.principal import Principal, Scope
from ampscope_server.access.ratelimit import RateLimiter
from ampscope_server.api.deps import PrincipalDep, SessionFactoryDep, requires
from ampscope_server.api.handlers import format_errors
from ampscope_server.api.schemas import AUTH_RESPONSES, ErrorBody
from ampscope_server.errors import InvalidPayload, RateLimited, UnsupportedMediaType
from ampscope_server.ingest import batches as ingest
from ampscope_server.ingest.schemas import IngestResult
from ampscope_server.ingest.wire import IngestBatch
from ampscope_server.store.db import unit_of_work

router = APIRouter(prefix="/api", tags=["ingest"], dependencies=[requires(Scope.INGEST)])
PATH = "/api/ingest"


@router.post(
    "/ingest",
    responses={
        **AUTH_RESPONSES,
        404: {"model": ErrorBody, "description": "The run belongs to another project"},
        408: {"model": ErrorBody, "description": "The body stopped arriving"},
        409: {"model": ErrorBody, "description": "Layer or module table missing or different"},
        410: {"model": ErrorBody, "description": "The run was deleted"},
        413: {"model": ErrorBody, "description": "The body is over the size limit"},
        415: {"model": ErrorBody, "description": "The body is not JSON"},
        422: {"model": ErrorBody, "description": "Invalid batch, or over a limit"},
        429: {"model": ErrorBody, "description": "Over the token's ingest rate"},
    },
)
async def post_ingest(
    request: Request, principal: PrincipalDep, factory: SessionFactoryDep
) -> IngestResult:
    limiter: RateLimiter = request.app.state.ingest_limiter
    if principal.token_id is not None:
        wait = limiter.acquire(principal.token_id)
        if wait > 0:
            raise RateLimited(f"this token is over its ingest rate of {limiter.rate:g} "
                              "requests/s; retry later", wait)
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise UnsupportedMediaType(f"the body must be application/json, not {media or 'untyped'}")
    body = await request.body()
    return await run_in_threadpool(_ingest, factory, body, principal)


def _ingest(factory: sessionmaker[Session], body: bytes, principal: Principal) -> IngestResult:
    try:
        batch = IngestBatch.model_validate_json(body)
    except ValidationError as exc:
        message = format_errors(exc.errors())
        if "hex escape" in message or "surrogate" in message:
            message += (" (a lone UTF-16 surrogate such as \\ud800 is not text: no database "
                        "could give it back)")
        raise InvalidPayload(message) from None
    with unit_of_work(factory) as session:
        return ingest.ingest_batch(session, batch, writer=principal)


def document(openapi: dict[str, Any]) -> None:
    """Give the ingest operation its request body (an IngestBatch) in the OpenAPI document."""
    schema = IngestBatch.model_json_schema(ref_template="#/components/schemas/{model}")
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    components.update(schema.pop("$defs", {}))
    components["IngestBatch"] = schema
    openapi["paths"][PATH]["post"]["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IngestBatch"}}},
    }
