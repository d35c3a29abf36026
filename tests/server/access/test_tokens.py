"""Tokens and browser sessions as a service, on a real migrated database of each dialect."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.access import tokens
from ampscope_server.access.principal import Scope, Via
from ampscope_server.errors import Forbidden, InvalidPayload, NotFound, Unauthorized
from ampscope_server.store.models import ApiToken, BrowserSession, Project


def _create(sessions: sessionmaker[Session], scope: Scope = Scope.READ,
            project: str | None = "vision") -> tokens.CreatedToken:
    with sessions() as session, session.begin():
        return tokens.create_token(session, scope, project, "label", now=1000.0)


class TestTokens:
    def test_only_the_hash_is_stored(self, sessions: sessionmaker[Session]) -> None:
        created = _create(sessions)
        assert tokens.SECRET_PATTERN.match(created.secret)
        with sessions() as session:
            row = session.scalars(select(ApiToken)).one()
            assert row.secret_hash == tokens.hash_secret(created.secret) != created.secret
            assert session.get(Project, "vision") is not None

    def test_authenticate(self, sessions: sessionmaker[Session]) -> None:
        created = _create(sessions, Scope.INGEST)
        with sessions() as session, session.begin():
            principal = tokens.authenticate_bearer(session, created.secret, now=2000.0)
        assert (principal.scope, principal.project, principal.via, principal.name) == (
            Scope.INGEST, "vision", Via.BEARER, "label")
        assert principal.may(Scope.INGEST) and not principal.may(Scope.READ)
        with sessions() as session, session.begin():
            tokens.authenticate_bearer(session, created.secret, now=2030.0)
            token = session.get(ApiToken, created.token.id)
            assert token is not None and token.last_used_at == 2000.0  # within the minute
            tokens.authenticate_bearer(session, created.secret, now=2060.0)
            assert token.last_used_at == 2060.0

    @pytest.mark.parametrize(("secret", "message"), [
        ("amps_short", "the token is malformed: ampscope tokens look like amps_…"),
        ("amps_" + "A" * 43, "the token is not valid"),
    ])
    def test_bad_secrets(self, sessions: sessionmaker[Session], secret: str, message: str
                         ) -> None:
        with sessions() as session, pytest.raises(Unauthorized, match=message):
            tokens.authenticate_bearer(session, secret)

    def test_revoke_ends_the_token_and_its_sessions(self, sessions: sessionmaker[Session]
                                                   ) -> None:
        created = _create(sessions)
        with sessions() as session, session.begin():
            browser = tokens.login(session, created.secret, ttl_s=3600.0)
        with sessions() as session, session.begin():
            tokens.revoke_token(session, created.token.id)
        with sessions() as session:
            with pytest.raises(Unauthorized, match="the token has been revoked"):
                tokens.authenticate_bearer(session, created.secret)
            with pytest.raises(Unauthorized, match="the session has expired or was ended"):
                tokens.authenticate_cookie(session, browser.cookie)
            assert session.scalars(select(BrowserSession)).all() == []
            with pytest.raises(NotFound, match="token 'nope' not found"):
                tokens.revoke_token(session, "nope")

    def test_names_and_projects(self, sessions: sessionmaker[Session]) -> None:
        with sessions() as session:
            with pytest.raises(InvalidPayload, match="project name 'a/b' is not valid"):
                tokens.create_token(session, Scope.READ, "a/b")
            with pytest.raises(InvalidPayload, match="at most 200 characters"):
                tokens.create_token(session, Scope.READ, "p", "x" * 201)
        every = _create(sessions, Scope.ADMIN, None)
        assert every.token.project is None
        with sessions() as session:  # the refused ones created no project either
            assert session.scalars(select(Project.name)).all() == []


class TestSessions:
    def test_login_cookie_and_csrf(self, sessions: sessionmaker[Session]) -> None:
        created = _create(sessions)
        with sessions() as session, session.begin():
            browser = tokens.login(session, created.secret, ttl_s=60.0, now=1000.0)
        assert browser.cookie != created.secret and browser.expires_at == 1060.0
        with sessions() as session:
            principal = tokens.authenticate_cookie(session, browser.cookie, now=1059.0)
            assert principal.via is Via.COOKIE and principal.ambient
            assert tokens.csrf_matches(principal, principal.csrf)
            assert not tokens.csrf_matches(principal, "forged")
            assert not tokens.csrf_matches(principal, None)
            with pytest.raises(Unauthorized):
                tokens.authenticate_cookie(session, browser.cookie, now=1060.0)  # expired
            stored = session.scalars(select(BrowserSession)).one()
            assert stored.id == tokens.hash_secret(browser.cookie)

    def test_an_ingest_token_cannot_sign_in(self, sessions: sessionmaker[Session]) -> None:
        created = _create(sessions, Scope.INGEST)
        with sessions() as session, pytest.raises(Forbidden, match="cannot sign in"):
            tokens.login(session, created.secret, ttl_s=60.0)

    def test_logout(self, sessions: sessionmaker[Session]) -> None:
        created = _create(sessions)
        with sessions() as session, session.begin():
            browser = tokens.login(session, created.secret, ttl_s=60.0)
        with sessions() as session, session.begin():
            tokens.logout(session, browser.cookie)
        with sessions() as session, pytest.raises(Unauthorized):
            tokens.authenticate_cookie(session, browser.cookie)
