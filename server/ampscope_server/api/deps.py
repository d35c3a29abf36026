"""Named dependencies for the routers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request, params
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import HTTPConnection

from ampscope_server.access.gate import principal_in_state
from ampscope_server.access.principal import Principal, Scope
from ampscope_server.config import Settings
from ampscope_server.errors import Forbidden, Unauthorized
from ampscope_server.live.hub import Hub
from ampscope_server.runs import reads as runs
from ampscope_server.store.db import session_scope
from ampscope_server.store.models import Run


def get_settings(connection: HTTPConnection) -> Settings:
    settings: Settings = connection.app.state.settings
    return settings


def get_session_factory(connection: HTTPConnection) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = connection.app.state.session_factory
    return factory


def get_hub(connection: HTTPConnection) -> Hub:
    hub: Hub = connection.app.state.hub
    return hub


def get_session(request: Request) -> Iterator[Session]:
    """The request's unit of work; committed before the response is sent."""
    yield from session_scope(get_session_factory(request))


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]
HubDep = Annotated[Hub, Depends(get_hub)]
# scope="function": commit (or roll back) when the handler returns, before the response goes out,
# so a client never sees 200 for a batch whose commit then failed.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def get_principal(connection: HTTPConnection) -> Principal:
    """Who the gate admitted; a public path reached without credentials has nobody."""
    principal = principal_in_state(connection.scope.get("state", {}))
    if principal is None:
        raise Unauthorized("authentication required")
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def requires(scope: Scope) -> params.Depends:
    """A router dependency: the principal's scope must grant `scope`, else 403."""

    def check(principal: PrincipalDep) -> None:
        if not principal.may(scope):
            raise Forbidden(f"this token's scope is '{principal.scope.value}'; this needs "
                            f"'{scope.value}'")

    dependency: params.Depends = Depends(check)
    return dependency


def get_run(run_id: str, session: SessionDep, principal: PrincipalDep) -> Run:
    """The path's run, or 404 (also when it belongs to a project the principal cannot see)."""
    return runs.load_run(session, run_id, principal)


RunDep = Annotated[Run, Depends(get_run, scope="function")]


HexId = Annotated[str, Path(pattern=r"^[0-9a-f]{1,32}$", description=(
    "A token's, alert rule's or destination's id (lower-case hex, as the server made it)"))]
"""Ids the server makes (`secrets.token_hex`): checked before any SQL, so a NUL or an
over-long id is a 422 on both dialects (Postgres refuses a NUL in a query parameter)."""
