"""The budget of large bodies in flight (the cap and the deadline against real sockets:
test_serving, test_hostile)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from ampscope_server.access import limits
from ampscope_server.access.limits import LARGE_BODY, BodyBudget, BodyLimit
from ampscope_server.errors import ServiceUnavailable


async def _budget() -> None:
    budget = BodyBudget(capacity=10, wait_s=0.05)
    await budget.acquire(6)
    with pytest.raises(ServiceUnavailable) as refused:
        await budget.acquire(6)  # 12 > 10: waits, then gives up
    assert refused.value.headers == {"Retry-After": "1"}
    assert refused.value.message == (
        "the server is reading 6 bytes of large request bodies, its budget "
        "(AMPSCOPE_BODIES_IN_FLIGHT_BYTES); retry shortly")
    await budget.acquire(4)  # fits beside
    waiting = asyncio.create_task(budget.acquire(6))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await budget.release(6)
    await asyncio.wait_for(waiting, 1.0)  # admitted as soon as there is room
    assert budget.held == 10
    await budget.release(4)
    await budget.release(6)
    assert budget.held == 0


def test_large_bodies_wait_for_room_then_are_refused() -> None:
    asyncio.run(_budget())


async def _limit() -> None:
    release = asyncio.Event()
    bodies: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        bodies.append(len(message.get("body", b"")))
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    limit = BodyLimit(app, max_bytes=4 * LARGE_BODY, timeout_s=5.0,
                      budget=BodyBudget(capacity=3 * LARGE_BODY, wait_s=0.05))

    def request(headers: list[tuple[bytes, bytes]], size: int) -> Any:
        sent: list[Message] = []
        inbox = [{"type": "http.request", "body": b"x" * size, "more_body": False}]

        async def receive() -> Message:
            return inbox.pop(0) if inbox else {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/api/ingest", "headers": headers}
        return asyncio.create_task(limit(scope, receive, send)), sent

    large = 2 * LARGE_BODY
    first, first_sent = request([(b"content-length", str(large).encode())], large)
    await asyncio.sleep(0)
    # 2 MiB + 2 MiB > 3 MiB: refused; a chunked body counts as the cap (4 MiB): refused;
    # a small body never waits.
    second, second_sent = request([(b"content-length", str(large).encode())], large)
    chunked, chunked_sent = request([(b"transfer-encoding", b"chunked")], 10)
    small, small_sent = request([(b"content-length", b"10")], 10)
    await asyncio.gather(second, chunked)
    assert [second_sent[0]["status"], chunked_sent[0]["status"]] == [503, 503]
    release.set()
    await asyncio.gather(first, small)
    assert [first_sent[0]["status"], small_sent[0]["status"]] == [200, 200]
    assert sorted(bodies) == [10, large]
    assert limit.budget.held == 0


def test_bodies_over_a_mib_take_their_size_from_the_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[None] = []
    monkeypatch.setattr(limits, "give_back_memory", lambda: trims.append(None))
    asyncio.run(_limit())
    assert len(trims) == 1  # once, when the one large body admitted was done
