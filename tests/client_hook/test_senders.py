from __future__ import annotations

import email.utils
import json
import socket
import threading
import time

import pytest

from ampscope.senders import HttpSender, MemorySender, Outcome, SendResult, _retry_after
from tests.client_hook.httpstub import Reply, StubServer, blackhole


class TestHttpSender:
    def test_2xx_is_acked_with_the_body(self) -> None:
        with StubServer([Reply(202, body=b'{"accepted": 3}')]) as server:
            sender = HttpSender(server.url + "/base/")
            result = sender.send(b'{"x": 1}', 5.0)
            sender.close()
        assert result == SendResult(Outcome.ACKED, 202, detail='{"accepted": 3}',
                                    body=b'{"accepted": 3}')
        assert [(path, body) for _, path, body in server.requests] == [
            ("/base/api/ingest", b'{"x": 1}')]

    @pytest.mark.parametrize("status", [408, 429, 500, 503])
    def test_retryable_statuses(self, status: int) -> None:
        with StubServer([Reply(status, {"Retry-After": "7"}, b"busy")]) as server:
            result = HttpSender(server.url).send(b"{}", 5.0)
        assert result == SendResult(Outcome.RETRY, status, 7.0, "busy")

    def test_other_4xx_is_rejected_with_the_servers_reason(self) -> None:
        with StubServer([Reply(422, body=b'{"detail": "bad record"}')]) as server:
            result = HttpSender(server.url).send(b"{}", 5.0)
        assert result == SendResult(Outcome.REJECTED, 422, detail='{"detail": "bad record"}',
                                    body=b'{"detail": "bad record"}')

    def test_a_server_that_closes_gets_a_fresh_connection(self) -> None:
        with StubServer() as server:  # HTTP/1.0: the server closes after every answer
            sender = HttpSender(server.url)
            assert sender.send(b"{}", 5.0).outcome is Outcome.ACKED
            assert sender._conn is None  # closed with the response, not left half-dead
            assert sender.send(b"{}", 5.0).outcome is Outcome.ACKED
        assert len(server.requests) == 2

    def test_a_refused_connection_is_retried_never_raised(self) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()  # nothing listens there now
        result = HttpSender(f"http://127.0.0.1:{port}").send(b"{}", 2.0)
        assert result.outcome is Outcome.RETRY and result.status is None
        assert result.detail.startswith("ConnectionRefusedError")

    def test_abort_ends_a_blackholed_request_at_once(self) -> None:
        with blackhole() as url:
            sender = HttpSender(url)
            timer = threading.Timer(0.3, sender.abort)
            timer.start()
            start = time.monotonic()
            result = sender.send(b"{}", 30.0)
            timer.join()
        assert result.outcome is Outcome.RETRY
        assert time.monotonic() - start < 10.0  # far below the 30 s timeout

    @pytest.mark.parametrize("server", ["127.0.0.1:8765", "ftp://host", "http://"])
    def test_a_bad_url_is_refused(self, server: str) -> None:
        with pytest.raises(ValueError, match="server must be an http"):
            HttpSender(server)


class TestRetryAfter:
    def test_seconds_and_http_dates(self) -> None:
        assert _retry_after("3") == 3.0
        assert _retry_after("-5") == 0.0
        soon = email.utils.formatdate(time.time() + 60, usegmt=True)
        got = _retry_after(soon)
        assert got is not None and 55.0 < got <= 60.0
        past = email.utils.formatdate(time.time() - 60, usegmt=True)
        assert _retry_after(past) == 0.0

    @pytest.mark.parametrize("value", [None, "", "soon", "Mon, 99 Foo"])
    def test_unreadable_values_are_none(self, value: str | None) -> None:
        assert _retry_after(value) is None


class TestMemorySender:
    def test_scripted_results_then_acks(self) -> None:
        sender = MemorySender([SendResult(Outcome.RETRY, 503)])
        assert sender.send(b'{"a": 1}', 1.0) == SendResult(Outcome.RETRY, 503)
        assert sender.send(b'{"b": "nan"}', 1.0) == SendResult(Outcome.ACKED, 200)
        assert sender.payloads() == [{"a": 1}, {"b": "nan"}]
        assert json.loads(sender.bodies[1]) == {"b": "nan"}
        sender.close()
        assert sender.closed


class TestToken:
    def test_the_token_goes_in_the_authorization_header_only(self) -> None:
        with StubServer() as server:
            sender = HttpSender(server.url, token="s3cret-token")
            assert sender.send(b"{}", 5.0).outcome is Outcome.ACKED
            assert "s3cret-token" not in repr(sender)
        assert server.headers[0]["Authorization"] == "Bearer s3cret-token"
        assert "s3cret-token" not in server.requests[0][1]  # not in the URL

    def test_no_token_no_header(self) -> None:
        with StubServer() as server:
            assert HttpSender(server.url).send(b"{}", 5.0).outcome is Outcome.ACKED
        assert "Authorization" not in server.headers[0]

    @pytest.mark.parametrize("status", [401, 403, 410])
    def test_denied_statuses_are_not_retried(self, status: int) -> None:
        with StubServer([Reply(status, body=b"no")]) as server:
            result = HttpSender(server.url, token="t").send(b"{}", 5.0)
        assert result == SendResult(Outcome.DENIED, status, detail="no")

    @pytest.mark.parametrize("token", ["", "a\r\nX-Evil: 1"])
    def test_a_bad_token_is_refused(self, token: str) -> None:
        with pytest.raises(ValueError, match="token must be a non-empty single-line string"):
            HttpSender("http://127.0.0.1:1", token=token)
