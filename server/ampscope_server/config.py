"""Settings, read once from the environment (prefix AMPSCOPE_) or given by the CLI.

Team mode (DESIGN.md §7): `auth="auto"` requires a token unless the server binds to loopback
only, which keeps `make demo` and a laptop zero-config; binding beyond loopback without auth
needs `insecure_no_auth`. Lists (`allowed_hosts`, `allowed_origins`, `trusted_proxies`) are
comma-separated strings, as an environment variable gives them.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DB_URL = "sqlite:///./.ampscope/ampscope.db"
DB_HELP = f"SQLAlchemy database URL (default: $AMPSCOPE_DB_URL, else {DEFAULT_DB_URL})"
"""Every command's `--db` help: where the database is when the option is left out."""
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
MiB = 2**20


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AMPSCOPE_", extra="ignore")

    db_url: str = DEFAULT_DB_URL
    host: str = "127.0.0.1"
    port: int = 8765
    crash_timeout_s: float = 300.0
    """An active run with no ingest for this long is reported as crashed."""

    # --- alerts -----------------------------------------------------------------------------
    alerts: bool = True
    """Evaluate alert rules and deliver alerts (alerts.worker); off: rules are kept, unused."""
    alert_interval_s: float = 1.0
    """How often the alerts leader evaluates the rules and sends what is due."""
    public_url: str = ""
    """The address users reach this server at, for the links in alerts (default: the bind
    address, e.g. http://127.0.0.1:8765)."""

    # --- team mode --------------------------------------------------------------------------
    auth: Literal["required", "auto"] = "auto"
    insecure_no_auth: bool = False
    """Serve beyond loopback with no access control at all (loudly): for a trusted network."""
    allowed_hosts: str = ""
    """Host names (or `*`) this server answers to, beside the loopback names and its bind
    address: a request naming another Host is refused (DNS rebinding)."""
    allowed_origins: str = ""
    """Origins (`https://dash.example.com`) allowed beside the server's own, for WebSockets and
    state-changing requests."""
    frame_ancestors: str = ""
    """Origins whose pages may show this server's pages in a frame (a Jupyter server for
    `mon.show()`: `http://localhost:8888`); none by default (clickjacking)."""
    trusted_proxy_header: str = ""
    """SSO through a proxy (oauth2-proxy): this request header names the signed-in user..."""
    trusted_proxies: str = ""
    """...and is believed only from these addresses or networks (`10.0.0.5,10.1.0.0/16`)."""
    proxy_scope: Literal["read", "admin"] = "read"
    session_ttl_s: float = 12 * 3600.0
    cookie_secure: bool = False
    """Mark the session cookie `Secure` (set it when users reach the server over https; a
    request that arrives over https gets it anyway)."""

    # --- limits -----------------------------------------------------------------------------
    max_body_bytes: int = 8 * MiB
    ingest_rate_per_s: float = 20.0
    """Ingest requests per second per token (a hook sends about 2), with bursts of..."""
    ingest_burst: int = 60
    max_connections: int = 1000
    """Connections one server process holds. A new one beyond it closes the longest-idle
    connection (keep-alive, or headers not yet complete); with none idle it is answered 503."""
    max_connections_per_client: int = 64
    """The same, per client address: one machine's flood closes its own idle sockets first."""
    max_requests: int = 256
    """Requests in progress at once in one process (WebSockets apart); beyond it 503 with
    Retry-After. /api/health is never counted nor refused."""
    max_requests_per_credential: int = 32
    """Requests in progress at once for one token, session or proxy user (anonymous: per
    address); beyond it 429 with Retry-After."""
    max_sockets_per_credential: int = 32
    """Live WebSockets open at once for one credential; beyond it the socket is closed 1013."""
    bodies_in_flight_bytes: int = 24 * MiB
    """Request bodies over 1 MiB are admitted while their declared sizes fit in this budget
    (a batch's parsed form takes ~12 times its bytes): memory stays bounded however many
    large batches arrive at once..."""
    body_wait_s: float = 10.0
    """...and one that finds no room this long is answered 503 with Retry-After."""
    timeout_keep_alive_s: float = 5.0
    body_timeout_s: float = 30.0
    """The whole request body must arrive within this long after its first byte is awaited, else
    408 (a body trickled a byte at a time cannot hold a connection)."""
    login_failures_per_min: float = 30.0
    """Failed sign-ins (bad token, bad session) per client address and minute, with bursts of
    as many; beyond it 429 with Retry-After, before any database read."""
    workers: int = 1
    """Worker processes (`ampscope serve --workers`): each enforces 1/workers of the per-token
    ingest rate, so together they accept at most the configured rate."""
    header_timeout_s: float = 10.0
    """A connection that has not sent a complete request this long after it opened (or after
    its previous response) is closed, so half-sent requests cannot pile up."""


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def auth_required(settings: Settings) -> bool:
    """Whether requests need credentials; raises ValueError for a contradictory setting."""
    if settings.insecure_no_auth:
        if settings.auth == "required":
            raise ValueError("--auth required and --insecure-no-auth contradict each other")
        return False
    return settings.auth == "required" or not is_loopback(settings.host)


def split_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]
