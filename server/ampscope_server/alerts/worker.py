"""The alert loop of one server process: every `alert_interval_s`, if this process is the
alerts leader, evaluate (alerts.evaluation) and deliver (alerts.delivery).

One leader among all workers and instances on one database: on Postgres the process that holds
the session-level advisory lock LEADER_LOCK on a connection of its own; when that process dies
its connection closes, the lock is released, and another process takes over within one
interval. SQLite serves one process, which is the leader. Evaluation and delivery run on this
thread, never on a request's: an unreachable webhook slows nothing but the next alert.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import psycopg
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.alerts import delivery as alert_delivery
from ampscope_server.alerts import evaluation
from ampscope_server.config import Settings
from ampscope_server.live.postgres import conninfo
from ampscope_server.store.db import is_sqlite

log = logging.getLogger("ampscope_server.alerts")

LEADER_LOCK = 0x616D7073  # "amps": the advisory lock key of the alerts leader


class Leadership:
    """Whether this process is the alerts leader, held through Postgres' advisory lock."""

    def __init__(self, db_url: str) -> None:
        self._conninfo = None if is_sqlite(db_url) else conninfo(db_url)
        self._connection: psycopg.Connection[tuple[object, ...]] | None = None
        self._leading = False

    def held(self) -> bool:
        """Whether this process leads; a follower keeps its connection and asks again."""
        if self._conninfo is None:
            return True
        try:
            if self._connection is None:
                self._connection = psycopg.connect(self._conninfo, autocommit=True)
            if self._leading:
                self._connection.execute("SELECT 1")  # the lock lives as long as this session
                return True
            row = self._connection.execute("SELECT pg_try_advisory_lock(%s)",
                                           (LEADER_LOCK,)).fetchone()
            self._leading = bool(row is not None and row[0])
            if self._leading:
                log.info("this process delivers the alerts")
            return self._leading
        except psycopg.Error as exc:
            if self._leading:
                log.warning("alerts leadership lost (%s)", type(exc).__name__)
            self.release()
            return False

    def release(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(psycopg.Error):
                self._connection.close()
            self._connection = None
        self._leading = False


class AlertWorker:
    def __init__(self, factory: sessionmaker[Session], settings: Settings) -> None:
        self._factory = factory
        self._settings = settings
        self._leadership = Leadership(settings.db_url)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ampscope-alerts", daemon=True)
        self.passes = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        self._leadership.release()

    def public_url(self) -> str:
        if self._settings.public_url:
            return self._settings.public_url
        host = self._settings.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self._settings.port}"

    def _run(self) -> None:
        while not self._stop.wait(self._settings.alert_interval_s if self.passes else 0):
            try:
                if not self._leadership.held():
                    continue
                evaluation.evaluate(self._factory, now=time.time(),
                                  crash_timeout_s=self._settings.crash_timeout_s)
                alert_delivery.deliver_due(self._factory, now=time.time,
                                           public_url=self.public_url())
            except Exception:  # the loop outlives a database away or a bug in one pass
                log.exception("alert pass failed")
            finally:
                self.passes += 1
