"""Sending alerts: deliver the outbox's due deliveries over HTTP, with retries and backoff.

At least once: a delivery is marked delivered only after its destination answered 2xx, in a
transaction of its own, so a server killed mid-request sends it again after restart (with the
same `X-Ampscope-Delivery` id, by which a receiver drops the repeat). A destination that is
away is retried after 2, 4, 8 … s (at most BACKOFF_MAX_S apart) and given up after
MAX_ATTEMPTS; a 4xx answer other than 408/429 is given up at once (the URL is wrong or revoked,
and retrying would not change that). Requests go out on the alert worker's thread, never on a
request's, so a slow webhook cannot slow ingest.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from ampscope_server import __version__
from ampscope_server.alerts import payloads as alert_payloads
from ampscope_server.alerts.payloads import AlertMessage
from ampscope_server.store import alerts_repository
from ampscope_server.store.db import unit_of_work
from ampscope_server.store.models import Alert, AlertDestination

log = logging.getLogger("ampscope_server.alerts")

TIMEOUT_S = 5.0
BACKOFF_BASE_S = 2.0
BACKOFF_MAX_S = 600.0
MAX_ATTEMPTS = 12
BATCH = 20
RETRYABLE_4XX = (408, 429)


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    retry: bool
    error: str | None


@dataclass(frozen=True)
class Request:
    url: str
    body: bytes
    headers: dict[str, str]


Send = Callable[[Request], Outcome]


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A webhook answers; it does not send the alert (and its secret URL) elsewhere."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirects)


def http_send(request: Request) -> Outcome:
    """POST the body. The error text never holds the URL (Slack's and Discord's are secret)."""
    call = urllib.request.Request(request.url, data=request.body, method="POST",
                                  headers={**request.headers,
                                           "User-Agent": f"ampscope/{__version__}"})
    try:
        with _opener.open(call, timeout=TIMEOUT_S) as answer:
            answer.read(65536)
            return Outcome(delivered=True, retry=False, error=None)
    except urllib.error.HTTPError as exc:
        retry = exc.code >= 500 or exc.code in RETRYABLE_4XX  # not a refused redirect
        return Outcome(delivered=False, retry=retry, error=f"HTTP {exc.code}")
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        text = getattr(reason, "strerror", None) or reason
        return Outcome(delivered=False, retry=True,
                       error=f"{type(reason).__name__}: {text}"[:500])


def backoff_s(attempts: int) -> float:
    """The wait after the `attempts`-th failed attempt."""
    return float(min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (attempts - 1)))


def message_of(alert: Alert, run_name: str | None, public_url: str) -> AlertMessage:
    return AlertMessage(
        delivery_id=alert.dedup_key, event=alert.event, severity=alert.severity,
        project=alert.project, run_id=alert.run_id, run_name=run_name,
        rule=alert.rule_id, title=alert.title, explanation=alert.explanation,
        recommendation=alert.recommendation, step_start=alert.step_start,
        step_end=alert.step_end,
        link=alert_payloads.run_link(public_url, alert.run_id, alert.step_start, alert.step_end),
        created_at=alert.created_at)


def request_of(destination: AlertDestination, message: AlertMessage) -> Request:
    kind = destination.kind
    body = alert_payloads.request_body(kind, message)  # type: ignore[arg-type]
    return Request(url=destination.url, body=body, headers=alert_payloads.headers(
        kind, message, body, destination.signing_secret))  # type: ignore[arg-type]


def deliver_due(factory: sessionmaker[Session], *, now: Callable[[], float], public_url: str,
                send: Send = http_send, limit: int = BATCH) -> int:
    """Send what is due now; returns how many were delivered."""
    with unit_of_work(factory) as session:
        due = [(delivery.id, delivery.attempts, request_of(destination, message_of(
                    alert, run_name, public_url)))
               for delivery, alert, destination, run_name
               in alerts_repository.due_deliveries(session, now(), limit)]
    delivered = 0
    for delivery_id, attempts, request in due:
        outcome = send(request)  # outside any transaction: a slow webhook holds no lock
        attempts += 1
        at = now()
        if outcome.delivered:
            status, next_at = "delivered", at
            delivered += 1
        elif outcome.retry and attempts < MAX_ATTEMPTS:
            status, next_at = "pending", at + backoff_s(attempts)
        else:
            status, next_at = "failed", at
        if not outcome.delivered:
            log.warning("alert delivery %s failed (attempt %d): %s", delivery_id, attempts,
                        outcome.error)
        with unit_of_work(factory) as session:
            alerts_repository.record_attempt(
                session, delivery_id, status=status, attempts=attempts, next_attempt_at=next_at,
                error=outcome.error, delivered_at=at if outcome.delivered else None)
    return delivered
