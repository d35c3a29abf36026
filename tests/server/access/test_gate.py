"""The gate's pure decisions (`Policy`): hosts, origins, proxies, public paths, credentials."""

from __future__ import annotations

import socket

import pytest
from starlette.datastructures import Headers

from ampscope_server.access.gate import Policy, bearer_of, cookie_of, is_public
from ampscope_server.config import Settings, auth_required, is_loopback
from ampscope_server.errors import Unauthorized


class TestHosts:
    def test_a_loopback_server_answers_to_loopback_names_only(self) -> None:
        policy = Policy(Settings(host="127.0.0.1"))
        for host in ("127.0.0.1:8765", "localhost:8765", "LOCALHOST", "[::1]:8765", "127.0.0.1"):
            assert policy.host_allowed(host), host
        for host in ("evil.example", "127.0.0.1.nip.io:8765", "", "localhost.evil"):
            assert not policy.host_allowed(host), host
        assert not policy.host_allowed(None)

    def test_configured_names_and_the_wildcard(self) -> None:
        policy = Policy(Settings(host="0.0.0.0", allowed_hosts="ampscope.lab, GPU-box"))
        assert policy.host_allowed("ampscope.lab:8765") and policy.host_allowed("gpu-box")
        assert policy.host_allowed(socket.gethostname())  # bound to every interface
        assert not policy.host_allowed("evil.example")
        assert Policy(Settings(allowed_hosts="*")).host_allowed("anything.example")

    def test_a_specific_bind_address_is_allowed(self) -> None:
        assert Policy(Settings(host="10.1.2.3")).host_allowed("10.1.2.3:8765")


class TestOrigins:
    def test_the_servers_own_origin(self) -> None:
        policy = Policy(Settings())
        assert policy.origin_allowed("http://127.0.0.1:8765", "127.0.0.1:8765")
        assert policy.origin_allowed("https://127.0.0.1:8765/", "127.0.0.1:8765")
        assert not policy.origin_allowed("http://127.0.0.1:9999", "127.0.0.1:8765")
        assert not policy.origin_allowed("null", "127.0.0.1:8765")
        assert not policy.origin_allowed("file://", "127.0.0.1:8765")
        assert not policy.origin_allowed("http://127.0.0.1:8765", None)

    def test_allowed_origins(self) -> None:
        policy = Policy(Settings(allowed_origins="https://Dash.example.com/"))
        assert policy.origin_allowed("https://dash.example.com", "127.0.0.1:8765")
        assert not policy.origin_allowed("http://dash.example.com", "127.0.0.1:8765")


class TestProxies:
    def test_only_configured_addresses_and_only_with_a_header(self) -> None:
        policy = Policy(Settings(trusted_proxy_header="X-Forwarded-User",
                                 trusted_proxies="10.0.0.5,192.168.0.0/16"))
        assert policy.trusted_proxy(("10.0.0.5", 4000))
        assert policy.trusted_proxy(("192.168.7.9", 4000))
        assert not policy.trusted_proxy(("10.0.0.6", 4000))
        assert not policy.trusted_proxy(None)
        assert not Policy(Settings(trusted_proxies="10.0.0.5")).trusted_proxy(("10.0.0.5", 1))


class TestCredentials:
    def test_bearer(self) -> None:
        assert bearer_of(Headers({"authorization": "Bearer  amps_x "})) == "amps_x"
        assert bearer_of(Headers({"authorization": "bearer amps_x"})) == "amps_x"
        assert bearer_of(Headers({})) is None
        for value in ("Basic dTpw", "Bearer", "Bearer   "):
            with pytest.raises(Unauthorized):
                bearer_of(Headers({"authorization": value}))

    def test_cookie(self) -> None:
        headers = Headers({"cookie": "a=1; ampscope_session=xyz; b=2"})
        assert cookie_of(headers, "ampscope_session") == "xyz"
        assert cookie_of(Headers({"cookie": "ampscope_session="}), "ampscope_session") is None
        assert cookie_of(Headers({}), "ampscope_session") is None

    def test_public_paths(self) -> None:
        assert all(is_public(p) for p in ("/api/health", "/login", "/api/login",
                                          "/static/js/api.js"))
        assert not any(is_public(p) for p in ("/", "/api/runs", "/api/logout", "/docs",
                                              "/openapi.json", "/staticx"))


class TestAuthMode:
    @pytest.mark.parametrize(("host", "auth", "insecure", "required"), [
        ("127.0.0.1", "auto", False, False), ("localhost", "auto", False, False),
        ("::1", "auto", False, False), ("0.0.0.0", "auto", False, True),
        ("10.0.0.1", "auto", False, True), ("127.0.0.1", "required", False, True),
        ("0.0.0.0", "auto", True, False),
    ])
    def test_auth_required(self, host: str, auth: str, insecure: bool, required: bool) -> None:
        settings = Settings(host=host, auth=auth, insecure_no_auth=insecure)  # type: ignore[arg-type]
        assert auth_required(settings) is required

    def test_contradiction(self) -> None:
        with pytest.raises(ValueError, match="contradict"):
            auth_required(Settings(auth="required", insecure_no_auth=True))

    def test_is_loopback(self) -> None:
        assert is_loopback("127.3.4.5") and is_loopback("[::1]") and not is_loopback("0.0.0.0")
