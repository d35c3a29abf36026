"""Who is asking: the scopes of DESIGN.md §7 and the principal a request acts as.

    read    every read route, pages and live sockets, of its project(s)
    ingest  POST /api/ingest of its project(s), nothing else (a training job's token)
    admin   read + ingest + delete runs + manage tokens

A principal bound to a project sees only that project's runs: another project's run is "not
found" to it, so existence is not leaked. `project=None` means every project.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Scope(str, enum.Enum):
    READ = "read"
    INGEST = "ingest"
    ADMIN = "admin"


GRANTS: dict[Scope, frozenset[Scope]] = {
    Scope.READ: frozenset({Scope.READ}),
    Scope.INGEST: frozenset({Scope.INGEST}),
    Scope.ADMIN: frozenset({Scope.READ, Scope.INGEST, Scope.ADMIN}),
}
"""What each token scope may do: `ingest` implies nothing else."""


class Via(str, enum.Enum):
    """How the principal was established; ambient credentials (cookie, proxy) need CSRF checks."""

    NONE = "none"  # auth is off: everyone acts as an anonymous admin
    BEARER = "bearer"
    COOKIE = "cookie"
    PROXY = "proxy"


@dataclass(frozen=True)
class Principal:
    scope: Scope
    project: str | None
    via: Via
    name: str
    """The token's label, the proxy's user name, or "anonymous"."""
    token_id: str | None = None
    csrf: str | None = None
    """The browser session's CSRF token (cookie sessions only)."""

    def may(self, needed: Scope) -> bool:
        return needed in GRANTS[self.scope]

    def sees(self, project: str) -> bool:
        return self.project is None or self.project == project

    @property
    def ambient(self) -> bool:
        """Credentials the browser attaches by itself: a cross-site request could carry them."""
        return self.via in (Via.COOKIE, Via.PROXY)


ANONYMOUS = Principal(scope=Scope.ADMIN, project=None, via=Via.NONE, name="anonymous")
"""Every request's principal when auth is off (a loopback-only server, `make demo`)."""
