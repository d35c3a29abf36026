"""The live hub: "this run has new rows" from the ingest threads to the WebSocket tasks.

A notification carries only the run id; subscribers then read what is new from the database.
On Postgres the notifications travel through LISTEN/NOTIFY (`live.postgres`), so that every worker
and instance hears every ingest; the hub then only fans them out within its process.
A subscription to `ALL_RUNS` (the runs list) is woken for every run and collects the
ids it was woken for, so its reader re-reads only those runs.

Publishing is thread-safe: ingest runs in the threadpool, each subscriber's Event belongs to its
event loop and is set through `loop.call_soon_threadsafe`.

Ingest marks the run on its session (`notify_after_commit`); the hub, installed on the session
factory, publishes on `after_commit` and forgets the marks on rollback, so nobody is woken for
rows that were never committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

_PENDING = "ampscope.live.pending"
ALL_RUNS = "*"
"""The subscription key of the runs list, woken for every run."""


def notify_after_commit(session: Session, run_id: str) -> None:
    """Tell the run's subscribers once this session's transaction has committed."""
    session.info.setdefault(_PENDING, set()).add(run_id)


def pending_runs(session: Session) -> set[str]:
    """The runs this session's transaction has marked so far."""
    runs: set[str] = session.info.get(_PENDING, set())
    return runs


@dataclass(eq=False)
class Subscription:
    run_id: str
    loop: asyncio.AbstractEventLoop
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    runs: set[str] = field(default_factory=set)
    """The runs notified since the last `take_runs` (touched on the subscriber's loop only)."""

    def notify(self, run_id: str) -> None:
        self.runs.add(run_id)
        self.changed.set()

    def take_runs(self) -> set[str]:
        """The runs notified since the last call, and forget them."""
        taken, self.runs = self.runs, set()
        return taken

    async def wait(self, timeout: float) -> bool:
        """Wait for a notification (True) or the timeout (False); clears the flag."""
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        self.changed.clear()
        return True


class Hub:
    def __init__(self) -> None:
        self._local = True
        self._lock = threading.Lock()
        self._subscribers: dict[str, set[Subscription]] = {}

    def install(self, factory: sessionmaker[Session], local: bool = True) -> None:
        """Forget the runs a session marked when it commits or rolls back; with `local`,
        publish them on commit (off when LISTEN/NOTIFY brings them back, `live.postgres`)."""
        self._local = local
        event.listen(factory, "after_commit", self._after_commit)
        event.listen(factory, "after_soft_rollback", self._after_rollback)

    def _after_commit(self, session: Session) -> None:
        for run_id in session.info.pop(_PENDING, ()):
            if self._local:
                self.publish(run_id)

    def _after_rollback(self, session: Session, _previous: object) -> None:
        session.info.pop(_PENDING, None)

    @contextmanager
    def subscribe(self, run_id: str) -> Iterator[Subscription]:
        """Subscribe the current event loop's task to a run's notifications."""
        subscription = Subscription(run_id, asyncio.get_running_loop())
        with self._lock:
            self._subscribers.setdefault(run_id, set()).add(subscription)
        try:
            yield subscription
        finally:
            with self._lock:
                subscribers = self._subscribers.get(run_id)
                if subscribers is not None:
                    subscribers.discard(subscription)
                    if not subscribers:
                        del self._subscribers[run_id]

    def publish(self, run_id: str) -> None:
        """Wake every subscriber of `run_id`; callable from any thread."""
        with self._lock:
            subscribers = [*self._subscribers.get(run_id, ()),
                           *self._subscribers.get(ALL_RUNS, ())]
        for subscription in subscribers:
            # RuntimeError: its loop has closed, the subscriber is going away.
            with contextlib.suppress(RuntimeError):
                subscription.loop.call_soon_threadsafe(subscription.notify, run_id)

    def publish_all(self) -> None:
        """Wake every subscriber (after notifications may have been missed)."""
        with self._lock:
            run_ids = [run_id for run_id in self._subscribers if run_id != ALL_RUNS]
        for run_id in run_ids:
            self.publish(run_id)
        self.publish(ALL_RUNS)  # a runs list woken for "*" reads every run again
