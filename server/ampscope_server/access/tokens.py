"""API tokens and browser sessions: making, checking and ending them (a service: no SQL here).

A token's secret is `amps_` + 43 URL-safe characters (256 random bits), shown once by
`create_token` and stored only as its SHA-256. A lookup hashes what was presented, finds the
row by the hash and compares the two hashes in constant time. Nothing is cached: a revoked
token fails on its next request, on every worker.

A browser signs in with a read or admin token (`login`) and gets a session: a second random
secret in an HttpOnly cookie (stored as its SHA-256 too) and a CSRF token that the page sends
back in a header on every state-changing request. Revoking the token ends its sessions.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session

from ampscope_server.access.principal import Principal, Scope, Via
from ampscope_server.errors import Forbidden, InvalidPayload, NotFound, Unauthorized
from ampscope_server.store import access_repository
from ampscope_server.store.models import ApiToken, BrowserSession

SECRET_PREFIX = "amps_"
SECRET_BYTES = 32
SECRET_PATTERN = re.compile(r"^amps_[A-Za-z0-9_-]{43}$")
LAST_USED_RESOLUTION_S = 60.0
"""`last_used_at` is written at most this often per token: not a write on every request."""
NAME_MAX = 200
PROJECT_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CreatedToken:
    token: ApiToken
    secret: str


def check_project_name(name: str) -> str:
    if not PROJECT_PATTERN.match(name):
        raise InvalidPayload(
            f"project name {name!r} is not valid: 1 to 200 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit")
    return name


def create_token(
    session: Session, scope: Scope, project: str | None, name: str = "", now: float | None = None
) -> CreatedToken:
    """A new token for `project` (None: every project); its secret is in the result only."""
    now = time.time() if now is None else now
    if len(name) > NAME_MAX or "\x00" in name:
        raise InvalidPayload(f"token name must be at most {NAME_MAX} characters without NUL")
    if project is not None:
        access_repository.ensure_project(session, check_project_name(project), now)
    secret = SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)
    token = ApiToken(
        id=secrets.token_hex(6), name=name, project=project, scope=scope.value,
        secret_hash=hash_secret(secret), created_at=now, revoked_at=None, last_used_at=None,
    )
    access_repository.insert_token(session, token)
    return CreatedToken(token, secret)


def tokens_seen_by(session: Session, viewer: Principal) -> list[ApiToken]:
    """The tokens an admin manages: its project's, or every one for an all-projects admin."""
    return [token for token in access_repository.list_tokens(session)
            if viewer.project is None or token.project == viewer.project]


def create_token_for(session: Session, viewer: Principal, scope: Scope, project: str | None,
                     name: str = "") -> CreatedToken:
    """`create_token` on behalf of an admin: only within its own project, unless it is an
    all-projects admin."""
    if viewer.project is not None and project != viewer.project:
        raise Forbidden(f"this admin token manages project '{viewer.project}' only")
    return create_token(session, scope, project, name)


def revoke_token(session: Session, token_id: str, now: float | None = None,
                 viewer: Principal | None = None) -> ApiToken:
    """Revoke the token (and end its sessions); a token `viewer` does not manage is not
    found."""
    token = access_repository.get_token(session, token_id)
    if token is None or (viewer is not None and viewer.project is not None
                         and token.project != viewer.project):
        raise NotFound(f"token '{token_id}' not found")
    if token.revoked_at is None:
        access_repository.revoke_token(session, token_id, time.time() if now is None else now)
    return token


def principal_of(token: ApiToken, via: Via, csrf: str | None = None) -> Principal:
    """Who a live token acts as, presented `via` a bearer header or a browser session."""
    return Principal(scope=Scope(token.scope), project=token.project, via=via,
                     name=token.name or token.id, token_id=token.id, csrf=csrf)


def authenticate_bearer(session: Session, secret: str, now: float | None = None) -> Principal:
    """The principal of a presented bearer secret, or Unauthorized."""
    now = time.time() if now is None else now
    token = _live_token(session, secret)
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION_S:
        access_repository.mark_token_used(session, token.id, now)
    return principal_of(token, Via.BEARER)


def _live_token(session: Session, secret: str) -> ApiToken:
    # The pattern check first: a malformed value never reaches the database.
    if not SECRET_PATTERN.match(secret):
        raise Unauthorized("the token is malformed: ampscope tokens look like amps_…")
    presented = hash_secret(secret)
    token = access_repository.token_by_hash(session, presented)
    if token is None or not hmac.compare_digest(token.secret_hash, presented):
        raise Unauthorized("the token is not valid")
    if token.revoked_at is not None:
        raise Unauthorized("the token has been revoked")
    return token


@dataclass(frozen=True)
class NewSession:
    cookie: str
    """The cookie's value: shown to the browser once, stored only as its hash."""
    principal: Principal
    expires_at: float


def login(session: Session, secret: str, ttl_s: float, now: float | None = None) -> NewSession:
    """Exchange a read or admin token for a browser session (an ingest token cannot sign in)."""
    now = time.time() if now is None else now
    token = _live_token(session, secret)
    if not principal_of(token, Via.COOKIE).may(Scope.READ):
        raise Forbidden("an ingest token cannot sign in; use a read or admin token")
    access_repository.delete_expired_sessions(session, now)
    cookie = secrets.token_urlsafe(SECRET_BYTES)
    csrf = secrets.token_urlsafe(SECRET_BYTES)
    access_repository.insert_session(session, BrowserSession(
        id=hash_secret(cookie), token_id=token.id, csrf=csrf, created_at=now,
        expires_at=now + ttl_s,
    ))
    return NewSession(cookie, principal_of(token, Via.COOKIE, csrf), now + ttl_s)


def authenticate_cookie(session: Session, cookie: str, now: float | None = None) -> Principal:
    found = access_repository.session_with_token(
        session, hash_secret(cookie), time.time() if now is None else now)
    if found is None:
        raise Unauthorized("the session has expired or was ended; sign in again")
    browser, token = found
    return principal_of(token, Via.COOKIE, browser.csrf)


def logout(session: Session, cookie: str) -> None:
    access_repository.delete_session(session, hash_secret(cookie))


def csrf_matches(principal: Principal, presented: str | None) -> bool:
    return (principal.csrf is not None and presented is not None
            and hmac.compare_digest(principal.csrf.encode(), presented.encode()))
