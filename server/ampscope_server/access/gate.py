"""The gate every HTTP request and WebSocket passes before any route: deny unless authorised.

In order, for each connection:
1. `Host` must be one this server answers to (DNS rebinding), else 400 / close 1008.
2. A token in the query string is refused (URLs end up in logs and browser history).
3. An `Origin` (browsers send one on WebSockets and cross-origin writes) must be the server's
   own or an allowed one, else 403 / close 1008 — even with auth off, so no web page a
   teammate opens can read the runs socket or post to ingest.
4. Authentication: `Authorization: Bearer`, else the session cookie, else the trusted proxy's
   user header (from a trusted address only). With auth off everyone is `ANONYMOUS`. An
   address with too many failed attempts gets 429 before its credentials are read
   (`admission.SignInThrottle`).
   No principal on a non-public path: 401, a redirect to /login for a browser asking for a
   page (Accept: text/html), close 1008 for a WebSocket.
5. CSRF: a state-changing request carried by ambient credentials (cookie, proxy) needs the
   session's token in `X-CSRF-Token` (cookie) or an allowed `Origin` (proxy).
The principal is left in `scope["state"]["principal"]`; routes check its scope (`deps`).
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ampscope_server.access import tokens
from ampscope_server.access.admission import SignInThrottle
from ampscope_server.access.principal import ANONYMOUS, Principal, Via
from ampscope_server.access.principal import Scope as TokenScope
from ampscope_server.config import LOOPBACK_NAMES, Settings, auth_required, split_list
from ampscope_server.errors import (
    AmpscopeError,
    BadRequest,
    DatabaseUnavailable,
    Forbidden,
    HostNotAllowed,
    Unauthorized,
    error_response,
)

SESSION_COOKIE = "ampscope_session"
CSRF_HEADER = "x-csrf-token"
PUBLIC_PATHS = frozenset({"/api/health", "/login", "/api/login"})
PUBLIC_PREFIXES = ("/static/",)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
QUERY_SECRETS = frozenset({"token", "access_token", "api_key", "apikey", "key", "secret"})
CLOSE_POLICY = 1008


class Policy:
    """The gate's decisions that need no database: hosts, origins, proxies (pure)."""

    def __init__(self, settings: Settings) -> None:
        self.auth = auth_required(settings)
        hosts = {*LOOPBACK_NAMES, *(h.lower() for h in split_list(settings.allowed_hosts))}
        if settings.host not in ("", "0.0.0.0", "::"):
            hosts.add(settings.host.lower())
        else:  # bound to every interface: the machine's own name is an expected Host
            hosts.add(socket.gethostname().lower())
        self.any_host = "*" in hosts
        self.hosts = frozenset(hosts)
        self.origins = frozenset(origin.rstrip("/").lower()
                                 for origin in split_list(settings.allowed_origins))
        self.proxy_header = settings.trusted_proxy_header.lower()
        self.proxy_networks = [ipaddress.ip_network(n, strict=False)
                               for n in split_list(settings.trusted_proxies)]
        self.proxy_scope = TokenScope(settings.proxy_scope)
        self.session_ttl_s = settings.session_ttl_s

    def host_allowed(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        name = urllib.parse.urlsplit(f"//{host_header}").hostname
        return self.any_host or (name is not None and name.lower() in self.hosts)

    def origin_allowed(self, origin: str, host_header: str | None) -> bool:
        """The server's own origin (same host and port as the request's Host) or an allowed
        one. `null` (a sandboxed frame, a file://) is never allowed."""
        normalized = origin.rstrip("/").lower()
        if normalized in self.origins:
            return True
        parts = urllib.parse.urlsplit(normalized)
        return (parts.scheme in ("http", "https") and host_header is not None
                and parts.netloc == host_header.lower())

    def trusted_proxy(self, client: tuple[str, int] | None) -> bool:
        if not self.proxy_header or client is None:
            return False
        try:
            address = ipaddress.ip_address(client[0])
        except ValueError:
            return False
        return any(address in network for network in self.proxy_networks)


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def bearer_of(headers: Headers) -> str | None:
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, credentials = value.partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise Unauthorized("send the token as `Authorization: Bearer <token>`")
    return credentials.strip()


def cookie_of(headers: Headers, name: str) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name and value:
            return value
    return None


class Gate:
    def __init__(self, app: ASGIApp, settings: Settings, throttle: SignInThrottle) -> None:
        self.app = app
        self.policy = Policy(settings)
        self.throttle = throttle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            principal = await self._admit(scope)
        except AmpscopeError as exc:
            await self._refuse(scope, receive, send, exc)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)

    async def _admit(self, scope: Scope) -> Principal | None:
        headers = Headers(scope=scope)
        policy = self.policy
        host = headers.get("host")
        if not policy.host_allowed(host):
            raise HostNotAllowed(host or "")
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if QUERY_SECRETS & {key.lower() for key in query}:
            raise BadRequest("credentials are never accepted in a URL; send the token as "
                             "`Authorization: Bearer <token>`")
        websocket = scope["type"] == "websocket"
        unsafe = not websocket and scope["method"] not in SAFE_METHODS
        origin = headers.get("origin")
        if origin is not None and (websocket or unsafe) and not policy.origin_allowed(origin, host):
            raise Forbidden(f"requests from the origin {origin!r} are not allowed")
        if not policy.auth:
            return ANONYMOUS
        if is_public(scope["path"]):  # no database read: health answers while it is away
            return None
        presented = "authorization" in headers or cookie_of(headers, SESSION_COOKIE) is not None
        if presented:
            self.throttle.check(scope)
        try:
            principal = await run_in_threadpool(self._authenticate, scope, headers)
        except Unauthorized:
            self.throttle.failed(scope)
            raise
        if principal is None:
            raise Unauthorized("authentication required: send `Authorization: Bearer <token>` "
                               "or sign in at /login")
        if unsafe and principal.ambient:
            if principal.via is Via.COOKIE and not tokens.csrf_matches(
                    principal, headers.get(CSRF_HEADER)):
                raise Forbidden("missing or wrong X-CSRF-Token for this session")
            if principal.via is Via.PROXY and origin is None:
                raise Forbidden("a state-changing request through the proxy needs an Origin")
        return principal

    def _authenticate(self, scope: Scope, headers: Headers) -> Principal | None:
        """Runs in the threadpool: the token and session lookups are database reads."""
        bearer = bearer_of(headers)
        cookie = cookie_of(headers, SESSION_COOKIE)
        policy = self.policy
        user = (headers.get(policy.proxy_header) if policy.trusted_proxy(scope.get("client"))
                else None)
        if bearer is None and cookie is None:
            if user:
                return Principal(scope=policy.proxy_scope, project=None, via=Via.PROXY,
                                 name=user[:200])
            return None
        factory: sessionmaker[Session] = scope["app"].state.session_factory
        try:
            with factory() as session, session.begin():
                if bearer is not None:
                    return tokens.authenticate_bearer(session, bearer)
                assert cookie is not None
                return tokens.authenticate_cookie(session, cookie)
        except (OperationalError, InterfaceError) as exc:
            raise DatabaseUnavailable(f"the database is unavailable ({type(exc.orig).__name__})"
                                      ) from None

    async def _refuse(self, scope: Scope, receive: Receive, send: Send,
                      exc: AmpscopeError) -> None:
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": CLOSE_POLICY,
                        "reason": exc.message[:120]})
            return
        response: Response
        # A browser navigating (it asks for HTML) is sent to sign in; an API client gets 401.
        page = (scope["method"] in ("GET", "HEAD")
                and "text/html" in Headers(scope=scope).get("accept", ""))
        if isinstance(exc, Unauthorized) and page:
            target = urllib.parse.quote(scope["path"], safe="/")
            response = RedirectResponse(f"/login?next={target}", status_code=303)
        else:
            response = error_response(exc)
        await response(scope, receive, send)


def principal_in_state(state: dict[str, Any]) -> Principal | None:
    """The principal the gate stored in a request's state (None where it stored none)."""
    principal = state.get("principal")
    return principal if isinstance(principal, Principal) else None
