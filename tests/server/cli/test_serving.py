"""How `ampscope serve` runs: half-sent requests are cut off, the access log drops query strings,
a refused WebSocket handshake is an HTTP answer, and the trusted-proxy (SSO) mode believes its
header only from the proxy's address."""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from ampscope_server.cli.serving import Redact, log_config
from tests.support.team import Team, make_tokens, team_server

pytestmark = pytest.mark.slow


SECRET = "amps_" + "Ab-_9" * 8 + "xyz"


def _redacted(name: str, msg: str, args: tuple[object, ...]) -> str:
    record = logging.LogRecord(name, logging.INFO, __file__, 1, msg, args, None)
    assert Redact().filter(record)
    return record.getMessage()


def test_redact() -> None:
    assert _redacted("uvicorn.access", '%s - "%s %s HTTP/%s" %d',
                     ("127.0.0.1:5", "GET", f"/api/runs?token={SECRET}", "1.1", 400)) == (
        '127.0.0.1:5 - "GET /api/runs HTTP/1.1" 400')
    assert _redacted("uvicorn.error", '%s - "WebSocket %s" [accepted]',
                     ("127.0.0.1:5", f"/api/runs/live?token={SECRET}&x=1")) == (
        '127.0.0.1:5 - "WebSocket /api/runs/live" [accepted]')
    assert _redacted("uvicorn.error", '%s - "WebSocket %s" %d',
                     ("127.0.0.1:5", f"/api/runs/live?t={SECRET}", 1008)) == (
        '127.0.0.1:5 - "WebSocket /api/runs/live" 1008')
    assert _redacted("ampscope_server.alerts", "delivery failed: %s",
                     (f"https://hooks.example/x Authorization: Bearer {SECRET}",)) == (
        "delivery failed: https://hooks.example/x Authorization: Bearer amps_…")
    assert _redacted("uvicorn.error", "Started server process [%d]", (42,)) == (
        "Started server process [42]")
    config = log_config()
    assert {name: handler["filters"] for name, handler in config["handlers"].items()} == {
        "default": ["redact"], "access": ["redact"]}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    env = {"AMPSCOPE_HEADER_TIMEOUT_S": "1", "AMPSCOPE_BODY_TIMEOUT_S": "1",
           "AMPSCOPE_TRUSTED_PROXY_HEADER": "X-Forwarded-User",
           "AMPSCOPE_TRUSTED_PROXIES": "127.0.0.1"}
    with team_server("sqlite", tmp_path_factory.mktemp("serving"), env=env) as team:
        yield team


def _half_sent(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    return sock


def test_half_sent_requests_are_closed_and_starve_nobody(guarded: Team) -> None:
    sockets = [_half_sent(guarded.server.port) for _ in range(300)]
    try:
        with httpx.Client(base_url=guarded.url, timeout=10.0) as client:
            assert [client.get("/api/health").status_code for _ in range(5)] == [200] * 5
        for sock in sockets:  # the 1 s header timeout passes: the server closes every one
            sock.settimeout(10)
            assert sock.recv(100) == b""
    finally:
        for sock in sockets:
            sock.close()


def test_a_complete_slow_request_is_served(guarded: Team) -> None:
    sock = _half_sent(guarded.server.port)
    try:
        sock.sendall(b"1\r\n\r\n")  # headers done within the timeout
        sock.settimeout(10)
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
    finally:
        sock.close()


def test_a_trickled_body_is_408(guarded: Team) -> None:
    token = guarded.tokens["alpha-ingest"]
    with socket.create_connection(("127.0.0.1", guarded.server.port), timeout=10) as sock:
        sock.sendall(f"POST /api/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                     f"{token}\r\nContent-Type: application/json\r\nContent-Length: 100"
                     "\r\n\r\n{\"schema".encode())
        answer = b""
        while not answer.endswith(b"}"):
            answer += sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408")
    assert b'{"detail":"the request body did not arrive whole within 1 s"}' in answer


def test_a_client_leaving_mid_body_is_one_line(guarded: Team) -> None:
    token = guarded.tokens["alpha-ingest"]
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", guarded.server.port), timeout=10) as sock:
            sock.sendall(f"POST /api/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: "
                         f"Bearer {token}\r\nContent-Type: application/json\r\n"
                         "Content-Length: 1000\r\n\r\n{\"schema".encode())
            time.sleep(0.2)  # the body has begun: the route is reading it
    with guarded.client("root") as client:  # the server serves on
        assert client.get("/api/runs").status_code == 200
    log = guarded.server.log()
    assert log.count("client left during its request body: POST /api/ingest") == 3
    assert "Traceback" not in log and "ClientDisconnect" not in log


def test_a_websocket_handshake_the_app_refuses_is_403(guarded: Team) -> None:
    """FastAPI closes a socket whose parameters fail validation before accepting it (1008:
    test_hostile.test_websocket_parameters, in process, both dialects); uvicorn answers that
    handshake with HTTP 403, logs no traceback, and serves on."""
    auth = {"Authorization": f"Bearer {guarded.tokens['root']}"}
    with pytest.raises(InvalidStatus) as refused:
        connect(f"ws://127.0.0.1:{guarded.server.port}/api/runs/{uuid.uuid4()}/live"
                f"?after_id={2**63}", additional_headers=auth, open_timeout=10)
    assert refused.value.response.status_code == 403
    with guarded.client("root") as client:
        assert client.get("/api/runs").status_code == 200
    assert "Traceback" not in guarded.server.log()


def test_no_log_line_holds_a_secret_however_it_was_passed(guarded: Team) -> None:
    """Every way a client may put a token where it does not belong, and the right ones: the
    server's whole log (access, WebSocket and error lines) never shows a secret."""
    secrets = [guarded.tokens[name] for name in ("root", "alpha-read", "alpha-ingest")]
    root, read, ingest = secrets
    ws = f"ws://127.0.0.1:{guarded.server.port}"
    with httpx.Client(base_url=guarded.url, timeout=10.0) as client:
        for path in (f"/api/runs?token={read}", f"/api/runs?access_token={read}",
                     f"/api/runs/{read}", f"/{root}", f"/runs/{read}/export.json"):
            assert client.get(path).status_code in (400, 401, 404), path
        assert client.get("/api/runs", headers={"Authorization": f"Bearer {read}"}
                          ).status_code == 200
        assert client.get("/api/runs", headers={"Authorization": f"Token {read}",
                                                "Cookie": f"ampscope_session={read}",
                                                "X-Forwarded-User": read,
                                                "Referer": f"{guarded.url}/?token={root}"}
                          ).status_code == 401
        assert client.post("/api/login", json={"token": ingest}).status_code == 403
        assert client.post("/api/login", json={"token": read + "x"}).status_code == 401
        assert client.post("/api/ingest", content=f'{{"token": "{ingest}"}}',
                           headers={"Authorization": f"Bearer {ingest}",
                                    "Content-Type": "application/json"}).status_code == 422
    for query in (f"token={read}", f"access_token={root}"):
        with (pytest.raises((InvalidStatus, ConnectionClosed)),
              connect(f"{ws}/api/runs/live?{query}", open_timeout=10) as socket_):
            socket_.recv(timeout=10)
    with connect(f"{ws}/api/runs/live", open_timeout=10,
                 additional_headers={"Authorization": f"Bearer {read}"}):
        pass
    log = guarded.server.log()
    assert '"WebSocket /api/runs/live" [accepted]' in log  # the lines are there, redacted
    assert '"GET /api/runs HTTP/1.1" 401' in log
    assert [secret for secret in secrets if secret in log] == []
    assert [line for line in log.splitlines() if "amps_" in line and "amps_…" not in line] == []


class TestTrustedProxy:
    def test_the_proxys_user_reads(self, guarded: Team) -> None:
        with httpx.Client(base_url=guarded.url, timeout=10.0) as client:
            headers = {"X-Forwarded-User": "ada@example.com"}
            who = client.get("/api/session", headers=headers).json()
            assert who == {"name": "ada@example.com", "scope": "read", "project": None,
                           "via": "proxy", "csrf": None, "auth": True}
            assert client.get("/api/runs", headers=headers).status_code == 200
            # Writes through the proxy need an Origin (CSRF), and the read scope cannot delete.
            delete = client.delete(f"/api/runs/{'0' * 8}", headers=headers)
            assert delete.status_code == 403
            assert delete.json() == {
                "detail": "a state-changing request through the proxy needs an Origin"}
            assert client.get("/api/runs").status_code == 401


def test_the_proxy_header_from_elsewhere_is_ignored(tmp_path: Path) -> None:
    env = {"AMPSCOPE_TRUSTED_PROXY_HEADER": "X-Forwarded-User",
           "AMPSCOPE_TRUSTED_PROXIES": "10.9.9.9"}
    with team_server("sqlite", tmp_path, env=env) as team, httpx.Client(
            base_url=team.url, timeout=10.0) as client:
        response = client.get("/api/runs", headers={"X-Forwarded-User": "mallory"})
        assert response.status_code == 401


# --- floods: every cap low, so that a few dozen sockets reach them -------------------------
CAPS = {"AMPSCOPE_MAX_CONNECTIONS": "40", "AMPSCOPE_MAX_CONNECTIONS_PER_CLIENT": "16",
        "AMPSCOPE_MAX_REQUESTS_PER_CREDENTIAL": "4", "AMPSCOPE_MAX_SOCKETS_PER_CREDENTIAL": "4",
        "AMPSCOPE_BODY_TIMEOUT_S": "3", "AMPSCOPE_HEADER_TIMEOUT_S": "60",
        "AMPSCOPE_LOGIN_FAILURES_PER_MIN": "5"}
"""The header timeout is long: here only the caps close idle sockets."""


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    with team_server("sqlite", tmp_path_factory.mktemp("crowded"), env=CAPS) as team:
        team.tokens.update(make_tokens(team.db_url, (("spare-read", None, "read"),)))
        yield team


def _connect(port: int, address: str) -> socket.socket:
    """A TCP connection to the server from `address` (any of 127.0.0.0/8 is this machine)."""
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(address, 0))


def _closed(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (its end-of-file or reset has arrived)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def _settled(team: Team, sockets: list[socket.socket]) -> list[int]:
    """The indices of `sockets` still open once the server has caught up with them."""
    with team.client("root") as client:  # one round trip: every earlier accept is handled
        assert client.get("/api/health").status_code == 200
    time.sleep(0.3)
    return [i for i, sock in enumerate(sockets) if not _closed(sock)]


def _polls(team: Team, token: str = "root", rounds: int = 10) -> list[int]:
    """A second client's view: health and the runs list, each on a fresh connection."""
    codes = []
    for _ in range(rounds):
        for path in ("/api/health", "/api/runs"):
            with team.client(token) as client:
                codes.append(client.get(path).status_code)
    return codes


class TestFloods:
    def test_idle_sockets_from_many_addresses_never_take_a_requests_place(
            self, crowded: Team) -> None:
        port = crowded.server.port
        flood = [_connect(port, f"127.0.0.{2 + i % 8}") for i in range(120)]
        try:
            assert _polls(crowded) == [200] * 20
            # 40 at most: each connection past it closed the longest-idle one, oldest first.
            assert _settled(crowded, flood) == list(range(81, 120))
        finally:
            for sock in flood:
                sock.close()

    def test_one_address_closes_its_own_idle_sockets_first(self, crowded: Team) -> None:
        port = crowded.server.port
        others = [_connect(port, "127.0.0.10") for _ in range(3)]
        flood = [_connect(port, "127.0.0.11") for _ in range(20)]
        try:
            assert _settled(crowded, others + flood) == [0, 1, 2, *range(3 + 4, 3 + 20)]
        finally:
            for sock in others + flood:
                sock.close()

    def test_a_connection_past_an_address_cap_of_busy_sockets_is_503(self,
                                                                      crowded: Team) -> None:
        """WebSockets are never idle: 16 from one address (4 credentials x 4 sockets) fill its
        cap, and the 17th connection gets a whole 503 with Retry-After."""
        ws = f"ws://127.0.0.1:{crowded.server.port}/api/runs/live"
        with ExitStack() as sockets:
            for name in ("alpha-read", "beta-read", "alpha-admin", "root"):
                for _ in range(4):
                    sock = _connect(crowded.server.port, "127.0.0.12")
                    sockets.enter_context(connect(
                        ws, sock=sock, open_timeout=10,
                        additional_headers={"Authorization": f"Bearer {crowded.tokens[name]}"}))
            with _connect(crowded.server.port, "127.0.0.12") as extra:
                extra.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                answer = extra.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
            assert b"retry-after: 1\r\n" in answer
            assert answer.endswith(b'{"detail": "too many connections from 127.0.0.12 '
                                   b'(AMPSCOPE_MAX_CONNECTIONS_PER_CLIENT); close idle ones '
                                   b'and retry"}')
            assert _polls(crowded, rounds=3) == [200] * 6

    def test_one_token_holds_at_most_its_share_of_live_sockets(self, crowded: Team) -> None:
        ws = f"ws://127.0.0.1:{crowded.server.port}/api/runs/live"
        auth = {"Authorization": f"Bearer {crowded.tokens['spare-read']}"}
        opened, refused = [], []
        with ExitStack() as sockets:
            for _ in range(10):
                websocket = sockets.enter_context(connect(
                    ws, additional_headers=auth, open_timeout=10,
                    sock=_connect(crowded.server.port, "127.0.0.13")))
                try:
                    while True:  # what the socket sends at once (the runs), then silence
                        websocket.recv(timeout=0.5)
                except TimeoutError:
                    opened.append(websocket)
                except ConnectionClosed as closed:
                    refused.append((closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else None)
            assert len(opened) == 4
            assert refused == [(1013, "this credential has too many live sockets open")] * 6
            assert _polls(crowded, "spare-read", rounds=3) == [200] * 6  # its requests still go

    def test_trickled_bodies_hold_a_tokens_share_only_and_end_at_the_deadline(
            self, crowded: Team) -> None:
        token = crowded.tokens["alpha-ingest"]
        head = (f"POST /api/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}"
                "\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{").encode()
        trickles = []
        for _ in range(10):
            sock = _connect(crowded.server.port, "127.0.0.14")
            sock.sendall(head)
            trickles.append(sock)
            time.sleep(0.05)
        try:
            assert _polls(crowded, rounds=3) == [200] * 6
            statuses = []
            for sock in trickles:
                sock.settimeout(10)
                statuses.append(sock.recv(4096).split(b"\r\n", 1)[0])
            assert sorted(statuses) == ([b"HTTP/1.1 408 Request Timeout"] * 4
                                        + [b"HTTP/1.1 429 Too Many Requests"] * 6)
        finally:
            for sock in trickles:
                sock.close()

    def test_failed_sign_ins_are_throttled_per_address(self, crowded: Team) -> None:
        def client(address: str, token: str) -> httpx.Client:
            return httpx.Client(base_url=crowded.url, timeout=10.0,
                                transport=httpx.HTTPTransport(local_address=address),
                                headers={"Authorization": f"Bearer {token}"})

        good = crowded.tokens["alpha-read"]
        with client("127.0.0.15", good[:-1] + ("A" if good[-1] != "A" else "B")) as wrong:
            assert [wrong.get("/api/runs").status_code for _ in range(5)] == [401] * 5
            limited = wrong.get("/api/runs")
            assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
            assert limited.json() == {
                "detail": "too many failed sign-ins from this address; retry later"}
            login = wrong.post("/api/login", json={"token": good})
            assert login.status_code == 429
        with client("127.0.0.15", good) as right:  # the address waits, whatever it sends
            assert right.get("/api/runs").status_code == 429
        with client("127.0.0.16", good) as elsewhere:
            assert elsewhere.get("/api/runs").status_code == 200
