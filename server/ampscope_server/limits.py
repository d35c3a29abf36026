"""The body cap and the body read timeout, enforced while the body is read (before any
parsing): 413 or 408, nothing stored.

A declared Content-Length over the cap is refused before a byte is read; a chunked body is
counted as it arrives and refused when it passes the cap (the route reading it gets
`PayloadTooLarge`, which the error handler renders). A body whose next part does not arrive
within `timeout_s` is `RequestTimeout` (a client trickling its body cannot hold a connection);
once the body is complete, waiting for the client to leave has no timeout.
"""

from __future__ import annotations

import asyncio

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ampscope_server.errors import PayloadTooLarge, RequestTimeout


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the request body is over the server's limit of {limit} bytes "
                           "(AMPSCOPE_MAX_BODY_BYTES); send smaller batches")


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            error = too_large(self.max_bytes)
            await JSONResponse({"detail": error.message}, status_code=error.status_code)(
                scope, receive, send)
            return
        seen, complete = 0, False

        async def counted() -> Message:
            nonlocal seen, complete
            if complete:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except TimeoutError:
                raise RequestTimeout(f"no part of the request body arrived for "
                                     f"{self.timeout_s:g} s") from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise too_large(self.max_bytes)
                complete = not message.get("more_body", False)
            else:
                complete = True
            return message

        await self.app(scope, counted, send)
