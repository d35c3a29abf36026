"""Signing in from a browser: the login page, POST /api/login, POST /api/logout, GET /api/session.

The token travels in the login request's JSON body (never a URL) and is exchanged for an
HttpOnly, SameSite=Strict session cookie; the page learns the session's CSRF token from
/api/session and sends it back as `X-CSRF-Token` on state-changing requests (`gate`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from ampscope_server.access import tokens
from ampscope_server.access.admission import SignInThrottle
from ampscope_server.access.gate import SESSION_COOKIE, cookie_of
from ampscope_server.access.principal import Principal, Via
from ampscope_server.api.deps import PrincipalDep, SessionDep, SettingsDep
from ampscope_server.api.pages import page
from ampscope_server.api.schemas import AUTH_RESPONSES
from ampscope_server.config import auth_required
from ampscope_server.errors import Unauthorized

router = APIRouter(tags=["auth"])


class LoginBody(BaseModel):
    token: str = Field(min_length=1, max_length=200)


class SessionRead(BaseModel):
    name: str
    scope: str
    project: str | None
    """null: every project."""
    via: str
    """none (auth is off), bearer, cookie or proxy."""
    csrf: str | None
    """Send it as X-CSRF-Token on state-changing requests (cookie sessions only)."""
    auth: bool
    """Whether this server requires credentials."""


def session_read(principal: Principal, auth: bool) -> SessionRead:
    return SessionRead(name=principal.name, scope=principal.scope.value,
                       project=principal.project, via=principal.via.value,
                       csrf=principal.csrf, auth=auth)


@router.get("/login", include_in_schema=False)
def login_page() -> FileResponse:
    return page("login.html")


@router.post("/api/login", responses=AUTH_RESPONSES)
def post_login(body: LoginBody, request: Request, response: Response, session: SessionDep,
               settings: SettingsDep) -> SessionRead:
    """Exchange a read or admin token for a session cookie (an ingest token cannot sign in)."""
    throttle: SignInThrottle = request.app.state.sign_in_throttle
    throttle.check(request.scope)
    try:
        created = tokens.login(session, body.token, settings.session_ttl_s)
    except Unauthorized:
        throttle.failed(request.scope)
        raise
    response.set_cookie(
        SESSION_COOKIE, created.cookie, max_age=int(settings.session_ttl_s), path="/",
        httponly=True, samesite="strict",
        secure=settings.cookie_secure or request.url.scheme == "https",
    )
    return session_read(created.principal, auth_required(settings))


@router.post("/api/logout", responses=AUTH_RESPONSES, status_code=204)
def post_logout(request: Request, session: SessionDep, principal: PrincipalDep) -> Response:
    """End this browser's session (CSRF-checked by the gate, like every cookie write)."""
    cookie = cookie_of(request.headers, SESSION_COOKIE)
    if cookie is not None and principal.via is Via.COOKIE:
        tokens.logout(session, cookie)
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


@router.get("/api/session", responses=AUTH_RESPONSES)
def get_auth_session(principal: PrincipalDep, settings: SettingsDep) -> SessionRead:
    """Who this request acts as."""
    return session_read(principal, auth_required(settings))
