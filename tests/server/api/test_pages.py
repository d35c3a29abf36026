"""Pages, static files and the vendored plotly.js, with their security headers."""

from __future__ import annotations

import re
from pathlib import Path

import httpx2
import pytest
from starlette.testclient import TestClient

from ampscope_server.api.pages import CSP, csp, swagger_ui_dir
from ampscope_server.export.assets import plotly_js, web_root
from tests.server.wire import batch, new_id, record
from tests.support.app import app_client
from tests.support.ingest import post_batch

REPO = Path(__file__).resolve().parents[3]


def _assert_secure(response: httpx2.Response) -> None:
    assert response.headers["content-security-policy"] == CSP
    assert response.headers["x-content-type-options"] == "nosniff"


def test_csp_is_strict() -> None:
    assert CSP == (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    )


def test_web_root_is_the_web_folder() -> None:
    assert web_root().resolve() == (REPO / "web").resolve()


@pytest.mark.parametrize(("path", "page", "status"), [
    ("/", "index.html", 200), ("/runs/RUN", "run.html", 200), ("/docs", "api-docs.html", 200),
    # An unknown run is the same page (it says so) under a 404, not a 200 over empty charts.
    ("/runs/abc-123", "run.html", 404), ("/runs/" + "f" * 65, "run.html", 404),
])
def test_pages(api: TestClient, path: str, page: str, status: int) -> None:
    if "RUN" in path:
        run_id = new_id()
        post_batch(api, batch([record(0)], run_id=run_id))
        path = path.replace("RUN", run_id)
    response = api.get(path)
    _assert_secure(response)
    assert response.status_code == status
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.content == (web_root() / page).read_bytes()


def test_fastapis_cdn_backed_doc_pages_are_off(api: TestClient) -> None:
    assert api.get("/redoc").status_code == 404
    assert "cdn" not in api.get("/docs").text.lower()


@pytest.mark.parametrize(("name", "content_type"), [
    ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    ("swagger-ui.css", "text/css; charset=utf-8"),
])
def test_swagger_ui_comes_from_the_installed_package(
    api: TestClient, name: str, content_type: str
) -> None:
    folder = swagger_ui_dir()
    assert folder is not None
    response = api.get(f"/static/vendor/swagger-ui/{name}")
    assert response.status_code == 200
    assert response.headers["content-type"] == content_type
    assert response.content == (folder / name).read_bytes()
    _assert_secure(response)


def test_only_the_two_swagger_files_are_served(api: TestClient) -> None:
    response = api.get("/static/vendor/swagger-ui/index.html")
    assert response.status_code == 404
    assert response.json() == {
        "detail": "swagger-ui file 'index.html' is not installed (pip install swagger-ui-bundle-v2)"
    }


def test_plotly_is_the_vendored_cartesian_bundle(api: TestClient) -> None:
    path = plotly_js()
    assert path.read_text(encoding="utf-8")[:60].startswith(
        "/**\n* plotly.js (cartesian - minified) v")
    response = api.get("/static/vendor/plotly.min.js")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/javascript; charset=utf-8"
    assert response.content == path.read_bytes()
    _assert_secure(response)


def test_static_files(api: TestClient) -> None:
    response = api.get("/static/css/app.css")
    assert response.status_code == 200
    assert response.content == (web_root() / "css" / "app.css").read_bytes()
    _assert_secure(response)
    missing = api.get("/static/js/does-not-exist.js")
    assert missing.status_code == 404
    _assert_secure(missing)


def test_api_responses_carry_the_headers_too(api: TestClient) -> None:
    _assert_secure(api.get("/api/health"))


_IMPORT = re.compile(r"""^\s*import\s[^'"]*?from\s+['"]\./([\w.]+)['"]""", re.MULTILINE)


def _imports(module: str, found: set[str]) -> set[str]:
    """Every module `module` imports, directly or not (web/js's relative static imports)."""
    for name in _IMPORT.findall((web_root() / "js" / module).read_text(encoding="utf-8")):
        if name not in found:
            found.add(name)
            _imports(name, found)
    return found


def test_the_run_page_preloads_exactly_the_modules_its_scripts_import() -> None:
    """run.html asks for its module graph at once (`modulepreload`) instead of one level of
    imports per round trip: the list must follow the imports, none missing, none stale."""
    html = (web_root() / "run.html").read_text(encoding="utf-8")
    scripts = re.findall(r'<script type="module" src="/static/js/([\w.]+)"', html)
    preloaded = re.findall(r'<link rel="modulepreload" href="/static/js/([\w.]+)"', html)
    imported: set[str] = set()
    for script in scripts:
        _imports(script, imported)
    assert scripts == ["run.js", "section_bar.js", "session.js", "shortcuts.js", "run_admin.js",
                       "run_alerts.js", "run_notes.js"]
    assert len(preloaded) == len(set(preloaded))
    assert set(preloaded) == imported - set(scripts)
    assert "plot.js" in preloaded and "codec.js" in preloaded  # a direct and a deeper import


def test_framing_is_refused_unless_origins_are_named() -> None:
    assert csp([]) == CSP
    assert csp(["http://localhost:8888", "https://*.lab.example"]).endswith(
        "; frame-ancestors http://localhost:8888 https://*.lab.example")
    for bad in ("localhost:8888", "http://x; script-src *", "'self'", "javascript:x"):
        with pytest.raises(ValueError, match="is not an origin such as http://localhost:8888"):
            csp([bad])


def test_a_named_notebook_origin_may_frame_the_pages(migrated_url: str) -> None:
    with app_client(migrated_url, frame_ancestors="http://localhost:8888") as client:
        policy = client.get("/api/health").headers["content-security-policy"]
    assert policy == csp(["http://localhost:8888"])
