"""The live WebSockets (docs/contracts.md, "Live").

WS /api/runs/{run_id}/live: backfill after `after_id`, then push steps as they are ingested:
`{"type": "steps", ...}` (each step's scalars, per-layer statistics and wire v4's `ranks` and
`optimizers` as `GET /api/runs/{id}/steps` gives them) and `{"type": "status", ...}` (once
after the backfill, then whenever the status changes). An unknown run is closed with 4404.

WS /api/runs/live: the runs list. A snapshot on connect (and again every `_poll_interval`, since
a run turns `crashed` by silence): the first page of `GET /api/runs` and every active run, with
the next page's cursor; in between the summaries of the runs that changed, at most `RUNS_PER_S`
messages a second however fast batches arrive.

The gate has authenticated the socket (cookie or bearer header, never the query string) and
checked its Origin; a principal without the read scope is closed with 1008 here, and a run of a
project it cannot see is "not found" (4404), as an unknown one. The database going away closes
the socket with 1013 (try again later).

Database reads run in the threadpool; the event loop only waits on the hub and the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from typing import Annotated

from fastapi import APIRouter, Query, WebSocket, WebSocketDisconnect
from pydantic import BaseModel
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.concurrency import run_in_threadpool

from ampscope_server.access.principal import Principal, Scope
from ampscope_server.api.deps import HubDep, PrincipalDep, SessionFactoryDep, SettingsDep
from ampscope_server.live.hub import ALL_RUNS
from ampscope_server.live.schemas import LiveRuns, LiveStatus, LiveSteps
from ampscope_server.runs import reads as runs

router = APIRouter(prefix="/api", tags=["live"])

CLOSE_UNKNOWN_RUN = 4404
CLOSE_POLICY = 1008
CLOSE_TRY_AGAIN = 1013
CHUNK = 1000
"""Most steps read and sent in one message."""
STATUS_POLL_S = 15.0
"""Without notifications the status is re-read this often (a run turns `crashed` by silence)."""
RUNS_PER_S = 2.0
"""The runs list's message rate cap: a burst of batches from many runs becomes one message, and
a long run's summary (a count over its steps) is read at most this often per open list."""


class _Listener:
    """The client's side of a push socket: a pending receive that notices the client leaving
    (anything else it sends is ignored), raced against the hub's change event."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.receiver: asyncio.Future[object] = asyncio.ensure_future(websocket.receive())
        self.waiter: asyncio.Future[object] | None = None

    async def wait(self, changed: asyncio.Event, timeout: float) -> bool:
        """Until `changed` is set, the client sends something or `timeout` passes; False when
        the client disconnected."""
        waiter: asyncio.Future[object] = asyncio.ensure_future(changed.wait())
        self.waiter = waiter
        await asyncio.wait({self.receiver, waiter}, timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self.receiver.done():
            message = self.receiver.result()
            if isinstance(message, dict) and message.get("type") == "websocket.disconnect":
                return False
            self.receiver = asyncio.ensure_future(self.websocket.receive())  # chatter: ignored
        return True

    def close(self) -> None:
        self.receiver.cancel()
        if self.waiter is not None:
            self.waiter.cancel()


async def _send(websocket: WebSocket, message: BaseModel) -> None:
    # allow_nan=False: a non-finite float that escaped the codec fails here, not in a browser.
    await websocket.send_text(json.dumps(message.model_dump(mode="json"), allow_nan=False))


@router.websocket("/runs/{run_id}/live")
async def live_updates(
    websocket: WebSocket,
    run_id: str,
    factory: SessionFactoryDep,
    hub: HubDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    after_id: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
) -> None:
    if not await _accept(websocket, principal):
        return
    listener = _Listener(websocket)
    try:
        with hub.subscribe(run_id) as subscription:
            last_id, last_status = after_id, None
            while True:
                subscription.changed.clear()
                update = await run_in_threadpool(
                    runs.live_update, factory, run_id, last_id, CHUNK, settings.crash_timeout_s,
                    principal,
                )
                if update is None:
                    reason = f"run '{run_id}' not found"
                    await websocket.close(code=CLOSE_UNKNOWN_RUN, reason=reason)
                    return
                steps, status = update
                if steps:
                    last_id = steps[-1].id
                    await _send(websocket, LiveSteps(run_id=run_id, steps=steps, last_id=last_id))
                    if len(steps) == CHUNK:
                        continue
                if status != last_status:
                    last_status = status
                    await _send(websocket, LiveStatus(status=status))
                if not await listener.wait(subscription.changed,
                                           _poll_interval(settings.crash_timeout_s)):
                    return
    except (WebSocketDisconnect, OSError):
        return
    except (OperationalError, InterfaceError):
        await _close_unavailable(websocket)
    finally:
        listener.close()


@router.websocket("/runs/live")
async def runs_live(
    websocket: WebSocket,
    factory: SessionFactoryDep,
    hub: HubDep,
    settings: SettingsDep,
    principal: PrincipalDep,
) -> None:
    if not await _accept(websocket, principal):
        return
    listener = _Listener(websocket)
    try:
        with hub.subscribe(ALL_RUNS) as subscription:
            loop = asyncio.get_running_loop()
            interval = _poll_interval(settings.crash_timeout_s)
            last_full = -math.inf
            while True:
                # Everything again every `interval`, busy or not: idle runs' statuses age.
                full = loop.time() - last_full >= interval
                if full:
                    last_full = loop.time()
                # Both on this loop, as are the hub's notifications: none slips in between.
                changed = subscription.take_runs()
                subscription.changed.clear()
                if ALL_RUNS in changed:  # the hub may have missed notifications: all again
                    full, last_full = True, loop.time()
                found = await run_in_threadpool(
                    runs.live_summaries, factory, None if full else changed,
                    settings.crash_timeout_s, principal,
                )
                if full or found.runs:
                    await _send(websocket, LiveRuns(full=full, runs=found.runs,
                                                    next_cursor=found.next_cursor,
                                                    total=found.total, active=found.active))
                await asyncio.sleep(1 / RUNS_PER_S)  # what arrives meanwhile goes in one message
                timeout = max(0.0, last_full + interval - loop.time())
                if not await listener.wait(subscription.changed, timeout):
                    return
    except (WebSocketDisconnect, OSError):
        return
    except (OperationalError, InterfaceError):
        await _close_unavailable(websocket)
    finally:
        listener.close()


async def _accept(websocket: WebSocket, principal: Principal) -> bool:
    """Accept the socket; close it at once (1008) when the principal may not read."""
    await websocket.accept()
    if principal.may(Scope.READ):
        return True
    await websocket.close(code=CLOSE_POLICY,
                          reason=f"this token's scope is '{principal.scope.value}'; reading "
                                 "needs 'read'")
    return False


async def _close_unavailable(websocket: WebSocket) -> None:
    """The database went away: tell the page to come back later (its reconnect backs off)."""
    with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
        await websocket.close(code=CLOSE_TRY_AGAIN, reason="the database is unavailable")


def _poll_interval(crash_timeout_s: float) -> float:
    return max(0.5, min(STATUS_POLL_S, crash_timeout_s / 2))
