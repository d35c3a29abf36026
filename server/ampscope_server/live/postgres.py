"""Live updates across processes: Postgres LISTEN/NOTIFY behind the in-process `live.Hub`.

With several workers (`ampscope serve --workers N`) or several instances on one database, a
batch ingested by one process must wake the sockets held by every other. On Postgres:

- `install_notify`: a committing session's marked runs (`live.notify_after_commit`) are sent as
  `pg_notify(CHANNEL, run_id)` inside the transaction, so they are delivered exactly when it
  commits and never for a rollback; Postgres folds identical notifications of one transaction,
  so a batch is one notification per run. Payloads are run ids only (36 bytes, far below the
  8000-byte limit); readers then read what is new, as with the local hub.
- `Listener`: one thread and one connection per process, `LISTEN CHANNEL`, turning each
  notification into `hub.publish(run_id)` (its own process's notifications included, so the
  local after-commit publish is off). After a (re)connect it wakes every subscriber once, since
  notifications sent while it was away are lost.
"""

from __future__ import annotations

import logging
import threading

import psycopg
from sqlalchemy import event, make_url, text
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.live.hub import Hub, pending_runs

CHANNEL = "ampscope_runs"
RECONNECT_S = (0.5, 5.0)
"""First and longest wait before reconnecting the listener (doubling in between)."""
WAKE_S = 0.5
"""How often the listener checks whether it should stop."""

logger = logging.getLogger("ampscope_server")


def install_notify(factory: sessionmaker[Session]) -> None:
    """Send each committing session's marked runs as notifications, inside its transaction."""
    event.listen(factory, "before_commit", _notify)


def _notify(session: Session) -> None:
    for run_id in sorted(pending_runs(session)):
        session.execute(text("SELECT pg_notify(:channel, :run_id)"),
                        {"channel": CHANNEL, "run_id": run_id})


def conninfo(db_url: str) -> str:
    """The SQLAlchemy URL as a libpq connection string for psycopg."""
    return make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)


class Listener:
    def __init__(self, db_url: str, hub: Hub) -> None:
        self._conninfo = conninfo(db_url)
        self._hub = hub
        self._stop = threading.Event()
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ampscope-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        wait = RECONNECT_S[0]
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    self.connected.set()
                    wait = RECONNECT_S[0]
                    self._hub.publish_all()
                    while not self._stop.is_set():
                        for notification in connection.notifies(timeout=WAKE_S):
                            self._hub.publish(notification.payload)
            except psycopg.Error as exc:
                self.connected.clear()
                logger.warning("live listener lost Postgres (%s); reconnecting in %.1f s",
                               type(exc).__name__, wait)
                self._stop.wait(wait)
                wait = min(RECONNECT_S[1], wait * 2)
