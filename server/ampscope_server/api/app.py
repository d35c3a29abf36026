"""create_app(settings): wiring only (routers, handlers, middleware, lifespan).

Middleware, outermost first: the security headers (on every response, refusals included), the
process's request limit (`admission.py`), the gate (Host, Origin, authentication, CSRF:
`gate.py`), the per-credential limits (`admission.py`), the body cap and budget (`limits.py`).
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.requests import ClientDisconnect

from ampscope_server import __version__
from ampscope_server.access.admission import CredentialLimit, RequestLimit, SignInThrottle
from ampscope_server.access.gate import Gate
from ampscope_server.access.limits import BodyBudget, BodyLimit
from ampscope_server.access.ratelimit import RateLimiter
from ampscope_server.alerts.worker import AlertWorker
from ampscope_server.api import (
    alerts as alerts_api,
)
from ampscope_server.api import (
    auth,
    compare,
    findings,
    formats,
    health,
    ingest,
    live,
    pages,
    runs,
    series,
    tokens,
)
from ampscope_server.api.handlers import (
    ampscope_error_handler,
    client_gone_handler,
    database_error_handler,
    internal_error_handler,
    validation_error_handler,
)
from ampscope_server.api.schemas import ErrorBody
from ampscope_server.config import Settings, split_list
from ampscope_server.errors import AmpscopeError
from ampscope_server.live import postgres as live_pg
from ampscope_server.live.hub import Hub
from ampscope_server.store.db import is_sqlite, make_engine, make_session_factory, verify_schema


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.db_url)
        verify_schema(engine)
        factory = make_session_factory(engine)
        hub = Hub()
        listener: live_pg.Listener | None = None
        if is_sqlite(settings.db_url):  # one process: the hub is the whole story
            hub.install(factory)
        else:  # every worker and instance hears every commit (LISTEN/NOTIFY)
            hub.install(factory, local=False)
            live_pg.install_notify(factory)
            listener = live_pg.Listener(settings.db_url, hub)
            listener.start()
        app.state.settings = settings
        app.state.session_factory = factory
        app.state.hub = hub
        app.state.ingest_limiter = RateLimiter.worker_share(
            settings.ingest_rate_per_s, settings.ingest_burst, settings.workers)
        alerts = AlertWorker(factory, settings) if settings.alerts else None
        if alerts is not None:
            alerts.start()
        # What exists now (modules, the app, schemas, mappers: ~150k objects) lives as long as
        # the process. Out of the collector's reach, a full collection scans only what requests
        # made: scanning it all under a stream of reads set the p95 of every read
        # (docs/storage.md#the-collector-frozen-at-startup).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()  # an app stopped in a longer process (tests) leaves nothing frozen
            if alerts is not None:
                alerts.stop()
            if listener is not None:
                listener.stop()
            engine.dispose()

    # /docs is pages.api_docs_page: FastAPI's own pages load Swagger/ReDoc from a CDN.
    app = FastAPI(title="ampscope", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.add_exception_handler(AmpscopeError, ampscope_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(OperationalError, database_error_handler)
    app.add_exception_handler(InterfaceError, database_error_handler)
    app.add_exception_handler(ClientDisconnect, client_gone_handler)
    app.add_exception_handler(Exception, internal_error_handler)
    # add_middleware puts each new one outside the previous ones.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes,
                       timeout_s=settings.body_timeout_s,
                       budget=BodyBudget(settings.bodies_in_flight_bytes, settings.body_wait_s))
    app.add_middleware(CredentialLimit, max_requests=settings.max_requests_per_credential,
                       max_sockets=settings.max_sockets_per_credential)
    throttle = SignInThrottle(settings)
    app.state.sign_in_throttle = throttle
    app.add_middleware(Gate, settings=settings, throttle=throttle)
    app.add_middleware(RequestLimit, max_requests=settings.max_requests)
    app.add_middleware(pages.SecurityHeaders,
                       policy=pages.csp(split_list(settings.frame_ancestors)))
    for module in (health, auth, runs, ingest, series, formats, live, compare, findings,
                   tokens, alerts_api, pages):
        app.include_router(module.router)
    app.include_router(pages.assets)
    app.mount("/static", pages.static_files(), name="static")
    _document_ingest(app)
    return app


def _document_ingest(app: FastAPI) -> None:
    """The OpenAPI document with the ingest body (read by hand, see api/ingest.py) in it."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = plain()
            ingest.document(schema)
            # Every 422 is `{"detail": "<message>"}` (handlers.validation_error_handler), not
            # FastAPI's default list of errors.
            components = schema.get("components", {}).get("schemas", {})
            if "HTTPValidationError" in components:
                components["HTTPValidationError"] = ErrorBody.model_json_schema()
                components.pop("ValidationError", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
