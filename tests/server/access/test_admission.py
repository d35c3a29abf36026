"""The process's request limit, the per-credential limits and the sign-in throttle, driven as
ASGI apps in process (the caps against real sockets: test_serving.TestFloods)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from ampscope_server.access.admission import (
    CredentialLimit,
    RequestLimit,
    SignInThrottle,
    credential_of,
)
from ampscope_server.access.principal import ANONYMOUS, Principal, Via
from ampscope_server.access.principal import Scope as TokenScope
from ampscope_server.config import Settings
from ampscope_server.errors import RateLimited


class Held:
    """An app that holds every request until `release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.entered += 1
        await self.release.wait()
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})


def http(path: str = "/api/runs", principal: Principal | None = None,
         client: str = "10.0.0.1") -> Scope:
    return {"type": "http", "method": "GET", "path": path, "headers": [],
            "client": (client, 5000), "state": {"principal": principal}}


async def call(app: Any, scope: Scope, inbox: list[Message] | None = None) -> list[Message]:
    sent: list[Message] = []
    messages = list(inbox or [{"type": "http.request", "body": b"", "more_body": False}])

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def status(sent: list[Message]) -> int:
    return int(sent[0]["status"])


def body(sent: list[Message]) -> Any:
    return json.loads(sent[1]["body"])


def token(token_id: str) -> Principal:
    return Principal(TokenScope.READ, None, Via.BEARER, "t", token_id=token_id)


async def _past_the_process_limit() -> None:
    held = Held()
    limit = RequestLimit(held, max_requests=2)
    first = [asyncio.create_task(call(limit, http())) for _ in range(2)]
    await asyncio.sleep(0)
    refused = await call(limit, http())
    assert status(refused) == 503
    assert dict(refused[0]["headers"])[b"retry-after"] == b"1"
    assert body(refused) == {"detail": "the server has 2 requests in progress "
                                       "(AMPSCOPE_MAX_REQUESTS); retry shortly"}
    health = asyncio.create_task(call(limit, http("/api/health")))
    await asyncio.sleep(0)
    assert held.entered == 3  # health is neither refused nor counted
    held.release.set()
    assert [status(sent) for sent in await asyncio.gather(*first, health)] == [200] * 3
    assert limit.in_progress == 0
    assert status(await call(limit, http())) == 200


def test_past_the_process_limit_is_503_and_health_still_answers() -> None:
    asyncio.run(_past_the_process_limit())


async def _per_credential() -> None:
    held = Held()
    limit = CredentialLimit(held, max_requests=2, max_sockets=1)
    mine = [asyncio.create_task(call(limit, http(principal=token("a")))) for _ in range(2)]
    await asyncio.sleep(0)
    refused = await call(limit, http(principal=token("a")))
    assert status(refused) == 429
    assert body(refused) == {"detail": "this credential has 2 requests in progress "
                                       "(AMPSCOPE_MAX_REQUESTS_PER_CREDENTIAL); retry when "
                                       "one is answered"}
    other = asyncio.create_task(call(limit, http(principal=token("b"))))
    await asyncio.sleep(0)
    assert held.entered == 3  # another token keeps its share
    socket = asyncio.create_task(call(limit, {**http(principal=token("a")), "type": "websocket"},
                                      [{"type": "websocket.connect"}]))
    await asyncio.sleep(0)
    second = await call(limit, {**http(principal=token("a")), "type": "websocket"},
                        [{"type": "websocket.connect"}])
    assert second == [{"type": "websocket.accept"},
                      {"type": "websocket.close", "code": 1013,
                       "reason": "this credential has too many live sockets open"}]
    held.release.set()
    await asyncio.gather(*mine, other, socket)
    assert limit.held == {"http": {}, "websocket": {}}


def test_each_credential_holds_its_share_of_requests_and_sockets() -> None:
    asyncio.run(_per_credential())


def test_credentials_are_told_apart_by_what_identifies_them() -> None:
    scope = http(client="10.1.2.3")
    assert credential_of(token("ab12"), scope) == "token:ab12"
    assert credential_of(Principal(TokenScope.READ, None, Via.COOKIE, "t", token_id="ab12",
                                   csrf="c0ffee"), scope) == "session:c0ffee"
    assert credential_of(Principal(TokenScope.READ, None, Via.PROXY, "ada"), scope) == "proxy:ada"
    assert credential_of(ANONYMOUS, scope) == "address:10.1.2.3"


def test_failed_sign_ins_are_counted_per_address() -> None:
    throttle = SignInThrottle(Settings(login_failures_per_min=3))
    mallory, ada = http(client="10.0.0.9"), http(client="10.0.0.8")
    for _ in range(3):
        throttle.check(mallory)
        throttle.failed(mallory)
    with pytest.raises(RateLimited) as limited:
        throttle.check(mallory)
    assert limited.value.headers == {"Retry-After": "20"}  # 3 a minute: one back in 20 s
    throttle.check(ada)
