"""create_app(settings): wiring only (routers, handlers, middleware, lifespan)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from ampscope_server import __version__
from ampscope_server.api import compare, findings, ingest, live, pages, runs, series
from ampscope_server.config import Settings
from ampscope_server.db import make_engine, make_session_factory, verify_schema
from ampscope_server.errors import AmpscopeError
from ampscope_server.handlers import ampscope_error_handler, validation_error_handler
from ampscope_server.live import Hub


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.db_url)
        verify_schema(engine)
        factory = make_session_factory(engine)
        hub = Hub()
        hub.install(factory)
        app.state.settings = settings
        app.state.session_factory = factory
        app.state.hub = hub
        try:
            yield
        finally:
            engine.dispose()

    # /docs is pages.api_docs_page: FastAPI's own pages load Swagger/ReDoc from a CDN.
    app = FastAPI(title="ampscope", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.add_exception_handler(AmpscopeError, ampscope_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_middleware(pages.SecurityHeaders)
    for module in (runs, ingest, series, live, compare, findings, pages):
        app.include_router(module.router)
    app.mount("/static", pages.static_files(), name="static")
    return app
