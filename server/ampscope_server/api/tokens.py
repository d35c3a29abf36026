"""Token management for admins: GET/POST /api/tokens, DELETE /api/tokens/{id}.

The same operations as `ampscope token …`, for an admin without a shell on the server. An admin
token of one project manages that project's tokens only (another project's token is 404); only
an all-projects admin makes all-projects tokens. A secret is in the creation's answer only.
"""

from __future__ import annotations

from fastapi import APIRouter

from ampscope_server.access import tokens
from ampscope_server.access.principal import Scope
from ampscope_server.access.schemas import TokenCreate, TokenCreated, TokenRead
from ampscope_server.api.deps import HexId, PrincipalDep, SessionDep, requires
from ampscope_server.api.schemas import AUTH_RESPONSES, ErrorBody

router = APIRouter(prefix="/api", tags=["tokens"], dependencies=[requires(Scope.ADMIN)],
                   responses=AUTH_RESPONSES)


@router.get("/tokens")
def list_tokens(session: SessionDep, principal: PrincipalDep) -> list[TokenRead]:
    return [TokenRead.model_validate(t) for t in tokens.tokens_seen_by(session, principal)]


@router.post("/tokens", status_code=201, responses={
    422: {"model": ErrorBody, "description": "A project name or label that is not valid"}})
def create_token(body: TokenCreate, session: SessionDep, principal: PrincipalDep
                 ) -> TokenCreated:
    created = tokens.create_token_for(session, principal, Scope(body.scope), body.project,
                                      body.name)
    return TokenCreated(**TokenRead.model_validate(created.token).model_dump(),
                        secret=created.secret)


@router.delete("/tokens/{token_id}", responses={
    404: {"model": ErrorBody, "description": "Unknown token, or another project's"}})
def revoke_token(token_id: HexId, session: SessionDep, principal: PrincipalDep) -> TokenRead:
    return TokenRead.model_validate(tokens.revoke_token(session, token_id, viewer=principal))
