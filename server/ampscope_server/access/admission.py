"""How much of one process a request, a credential or an address may hold at once.

- `RequestLimit` (outside the gate, so authentication's database reads count too): at most
  `max_requests` requests in progress; beyond it 503 with Retry-After at once, never a queue.
  `/api/health` is neither counted nor refused: a load balancer's probe must answer while the
  app is at its limit.
- `CredentialLimit` (inside the gate, which names the principal): at most
  `max_requests_per_credential` requests in progress per token, browser session or proxy user
  (429 with Retry-After), and `max_sockets_per_credential` live WebSockets (closed 1013, "try
  again later"). A second client of the same team keeps its share whatever one token does.
- `SignInThrottle`: failed authentications per client address, a token bucket of
  `login_failures_per_min` a minute; an address past it gets 429 before any database read.

All counts are per worker process, in memory: they bound what one process holds, which is what
a flood exhausts.
"""

from __future__ import annotations

from collections import Counter

from starlette.types import ASGIApp, Receive, Scope, Send

from ampscope_server.access.principal import Principal, Via
from ampscope_server.access.ratelimit import RateLimiter
from ampscope_server.config import Settings
from ampscope_server.errors import RateLimited, ServiceUnavailable, error_response

EXEMPT_PATHS = frozenset({"/api/health"})
CLOSE_TRY_AGAIN_LATER = 1013


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def credential_of(principal: Principal, scope: Scope) -> str:
    """One key per credential: a token, a browser session (its CSRF token is per session), a
    proxy's user; with auth off, the client's address."""
    if principal.token_id is not None and principal.via is Via.BEARER:
        return f"token:{principal.token_id}"
    if principal.via is Via.COOKIE and principal.csrf is not None:
        return f"session:{principal.csrf}"
    if principal.via is Via.PROXY:
        return f"proxy:{principal.name}"
    return f"address:{client_address(scope)}"


class RequestLimit:
    def __init__(self, app: ASGIApp, max_requests: int) -> None:
        self.app = app
        self.max_requests = max_requests
        self.in_progress = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_progress >= self.max_requests:
            await error_response(ServiceUnavailable(
                f"the server has {self.max_requests} requests in progress "
                "(AMPSCOPE_MAX_REQUESTS); retry shortly", retry_after_s=1))(scope, receive, send)
            return
        self.in_progress += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_progress -= 1


class CredentialLimit:
    def __init__(self, app: ASGIApp, max_requests: int, max_sockets: int) -> None:
        self.app = app
        self.caps = {"http": max_requests, "websocket": max_sockets}
        self.held: dict[str, Counter[str]] = {"http": Counter(), "websocket": Counter()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        principal = scope.get("state", {}).get("principal")  # the gate's
        if kind not in self.held or not isinstance(principal, Principal) \
                or scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        key, held = credential_of(principal, scope), self.held[kind]
        if held[key] >= self.caps[kind]:
            await self._refuse(scope, receive, send)
            return
        held[key] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            held[key] -= 1
            if not held[key]:
                del held[key]

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": CLOSE_TRY_AGAIN_LATER,
                        "reason": "this credential has too many live sockets open"})
            return
        await error_response(RateLimited(
            f"this credential has {self.caps['http']} requests in progress "
            "(AMPSCOPE_MAX_REQUESTS_PER_CREDENTIAL); retry when one is answered", 1.0))(
            scope, receive, send)


class SignInThrottle:
    """Failed authentications per client address (pure but for the clock of its bucket)."""

    def __init__(self, settings: Settings) -> None:
        per_min = settings.login_failures_per_min
        self.failures = RateLimiter(per_min / 60.0, max(1, int(per_min)))

    def check(self, scope: Scope) -> None:
        """Raise 429 while this address is past its failures, before any credential is read."""
        wait = self.failures.waiting(client_address(scope))
        if wait > 0:
            raise self._limited(wait)

    def failed(self, scope: Scope) -> None:
        self.failures.acquire(client_address(scope))

    @staticmethod
    def _limited(wait: float) -> RateLimited:
        return RateLimited("too many failed sign-ins from this address; retry later", wait)
