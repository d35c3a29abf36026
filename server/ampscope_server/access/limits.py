"""The body cap, the body deadline and the budget of large bodies in flight, enforced before
any parsing: 413, 408 or 503, nothing stored.

A declared Content-Length over the cap is refused before a byte is read; a chunked body is
counted as it arrives and refused when it passes the cap (the route reading it gets
`PayloadTooLarge`, which the error handler renders). The whole body must arrive within
`timeout_s` of the first wait for it, else `RequestTimeout`: a client trickling a byte at a
time cannot hold a connection. Once the body is complete, waiting for the client to leave has
no timeout.

Memory: a body is held while its request runs, and a batch's parsed form (floats as Python
objects, the ORM rows) takes about 12 times its bytes. A body over `LARGE_BODY` (its declared
length, or the cap for a chunked one) is admitted only while the sizes of those in flight fit
in `BodyBudget`'s capacity; one that waits longer than `wait_s` is 503 with Retry-After. Small
bodies (a hook's usual batch) never wait.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import sys
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ampscope_server.config import MiB
from ampscope_server.errors import (
    PayloadTooLarge,
    RequestTimeout,
    ServiceUnavailable,
    error_response,
)

LARGE_BODY = 1 * MiB


def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(
            ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        return trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


MALLOC_TRIM = _malloc_trim()


def give_back_memory() -> None:
    """Return the heap's free pages to the system. glibc keeps what a parsed batch freed (its
    floats and rows, ~12 times the body) for reuse, so without this a burst of large batches
    leaves the process at its peak for good."""
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the request body is over the server's limit of {limit} bytes "
                           "(AMPSCOPE_MAX_BODY_BYTES); send smaller batches")


class BodyBudget:
    """Bytes of large bodies in flight in this process, at most `capacity` (one body larger
    than the whole budget waits until it has all of it)."""

    def __init__(self, capacity: int, wait_s: float) -> None:
        self.capacity = capacity
        self.wait_s = wait_s
        self.held = 0
        self._changed = asyncio.Condition()

    async def acquire(self, size: int) -> None:
        """Wait until `size` fits (at most `wait_s`: then `ServiceUnavailable`) and take it."""
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.held + size <= self.capacity),
                    self.wait_s)
            except TimeoutError:
                raise ServiceUnavailable(
                    f"the server is reading {self.held} bytes of large request bodies, its "
                    "budget (AMPSCOPE_BODIES_IN_FLIGHT_BYTES); retry shortly",
                    retry_after_s=1) from None
            self.held += size

    async def release(self, size: int) -> None:
        async with self._changed:
            self.held -= size
            self._changed.notify_all()
            idle = self.held == 0
        if idle:  # the last large body of a burst is done (a thread: it walks the heap)
            await asyncio.to_thread(give_back_memory)


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float,
                 budget: BodyBudget) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.budget = budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        size = int(declared) if declared is not None and declared.isdigit() else None
        if size is None and "chunked" in headers.get("transfer-encoding", "").lower():
            size = self.max_bytes
        if size is not None and size > self.max_bytes:
            await error_response(too_large(self.max_bytes))(scope, receive, send)
            return
        if size is None or size <= LARGE_BODY:
            await self.app(scope, self._deadlined(receive), send)
            return
        size = min(size, self.budget.capacity)
        try:
            await self.budget.acquire(size)
        except ServiceUnavailable as refused:
            await error_response(refused)(scope, receive, send)
            return
        try:
            await self.app(scope, self._deadlined(receive), send)
        finally:
            await self.budget.release(size)

    def _deadlined(self, receive: Receive) -> Receive:
        """`receive`, counting the body against the cap and the whole-body deadline."""
        seen, complete, deadline = 0, False, 0.0

        async def counted() -> Message:
            nonlocal seen, complete, deadline
            if complete:
                return await receive()
            loop = asyncio.get_running_loop()
            deadline = deadline or loop.time() + self.timeout_s
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise RequestTimeout(f"the request body did not arrive whole within "
                                     f"{self.timeout_s:g} s") from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise too_large(self.max_bytes)
                complete = not message.get("more_body", False)
            else:
                complete = True
            return message

        return counted

