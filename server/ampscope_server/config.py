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
    """Evaluate alert rules and deliver alerts (alert_worker.py); off: rules are kept, unused."""
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
    limit_concurrency: int = 512
    """Connections served at once; beyond it new ones get 503 (uvicorn)."""
    timeout_keep_alive_s: float = 5.0
    body_timeout_s: float = 30.0
    """A request body whose next part takes longer than this is refused (408)."""
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
