"""The dashboard's HTML pages, its static files and the vendored plotly.js.

Files come from the installed package `ampscope_server._web` (the repo's web/ folder), plotly.js
included (web/vendor: its "cartesian" partial bundle, see `plotly_js`), and Swagger UI (the
OpenAPI page at /docs) from the installed `swagger-ui-bundle-v2` package, never a CDN.
`SecurityHeaders` puts a strict CSP (unless the response brings its own) and nosniff on every
response.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ampscope_server.access.principal import Scope as TokenScope
from ampscope_server.api.deps import PrincipalDep, SessionDep, requires
from ampscope_server.errors import NotFound, RunNotFound
from ampscope_server.export.assets import plotly_js, web_root
from ampscope_server.runs import reads as runs

# blob: in img-src: plotly's "Download plot as a png" draws the chart's SVG through a blob: image
# made by the page itself (nothing is fetched from elsewhere); without it the export did nothing.
ANCESTOR = re.compile(r"https?://[A-Za-z0-9.\-\[\]:*]+")
"""An origin allowed to frame the pages (`http://localhost:8888`, `https://*.lab.example`)."""


def csp(frame_ancestors: Sequence[str] = ()) -> str:
    """The pages' policy. Framing is refused (clickjacking) unless origins are named, e.g. a
    Jupyter server showing `mon.show()` (AMPSCOPE_FRAME_ANCESTORS)."""
    bad = [origin for origin in frame_ancestors if not ANCESTOR.fullmatch(origin)]
    if bad:
        raise ValueError(f"AMPSCOPE_FRAME_ANCESTORS: {bad[0]!r} is not an origin such as "
                         "http://localhost:8888")
    ancestors = " ".join(frame_ancestors) or "'none'"
    return ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: "
            "blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
            f"frame-ancestors {ancestors}")


CSP = csp()

router = APIRouter(include_in_schema=False, dependencies=[requires(TokenScope.READ)])
assets = APIRouter(include_in_schema=False)
"""Files every page needs before sign-in (the login page's too): public, under /static/."""


def page(name: str, status_code: int = 200) -> FileResponse:
    path = web_root() / name
    if not path.is_file():
        raise NotFound(f"page {name} is not installed")
    # no-store: a page must reach the server each time, so that once signed out (or revoked)
    # the browser is sent to sign in instead of showing a cached page.
    return FileResponse(path, status_code=status_code, media_type="text/html; charset=utf-8",
                        headers={"Cache-Control": "no-store"})


@router.get("/")
def index_page() -> FileResponse:
    return page("index.html")


@router.get("/runs/{run_id}")
def run_page(run_id: str, session: SessionDep, principal: PrincipalDep) -> FileResponse:
    """The run page; 404 (the same page, which says the run is unknown) for an id that is no
    run this principal can see, malformed ones included."""
    try:
        runs.load_run(session, run_id, principal)
    except RunNotFound:
        return page("run.html", status_code=404)
    return page("run.html")


@router.get("/compare")
def compare_page() -> FileResponse:
    return page("compare.html")


@router.get("/settings")
def settings_page() -> FileResponse:
    """Alert rules, destinations and history of a project (?project=P); managing takes admin."""
    return page("settings.html")


@assets.get("/static/vendor/plotly.min.js")
def plotly_bundle() -> FileResponse:
    return FileResponse(plotly_js(), media_type="text/javascript; charset=utf-8")


# The only Swagger UI files the /docs page loads; nothing else of that package is served.
SWAGGER_FILES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
}


@router.get("/docs")
def api_docs_page() -> FileResponse:
    """The OpenAPI page, offline and under the strict CSP (FastAPI's default loads a CDN)."""
    return page("api-docs.html")


@assets.get("/static/vendor/swagger-ui/{name}")
def swagger_file(name: str) -> FileResponse:
    folder = swagger_ui_dir()
    if name not in SWAGGER_FILES or folder is None or not (folder / name).is_file():
        raise NotFound(
            f"swagger-ui file {name!r} is not installed (pip install swagger-ui-bundle-v2)")
    return FileResponse(folder / name, media_type=SWAGGER_FILES[name])


def swagger_ui_dir() -> Path | None:
    try:
        import swagger_ui_bundle
    except ImportError:
        return None
    return Path(swagger_ui_bundle.swagger_ui_path)


def static_files() -> StaticFiles:
    """web/ under /static (mounted after `router`, whose plotly route must win)."""
    return StaticFiles(directory=web_root(), check_dir=False)


class SecurityHeaders:
    """Add the CSP and X-Content-Type-Options: nosniff to every HTTP response."""

    def __init__(self, app: ASGIApp, policy: str = CSP) -> None:
        self.app = app
        self.policy = policy.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                # A response with a policy of its own (the offline report) keeps it: a second
                # header would be enforced too, and the two together would block the report.
                if not any(name.lower() == b"content-security-policy" for name, _ in headers):
                    headers.append((b"content-security-policy", self.policy))
                headers.append((b"x-content-type-options", b"nosniff"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
