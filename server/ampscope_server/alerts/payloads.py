"""What an alert looks like on the wire of each destination: pure functions, no I/O.

    slack    an incoming webhook's Block Kit message (header, text, context, a button to the run)
    discord  a webhook message with one embed, coloured by level
    webhook  ampscope's own JSON, signed: `X-Ampscope-Signature-256: sha256=<hex>` is the
             HMAC-SHA256 of the exact body under the destination's signing secret (as GitHub's
             `X-Hub-Signature-256`); `X-Ampscope-Delivery` is the alert's dedup key, the same on
             every retry, so a receiver can drop a redelivery.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import asdict, dataclass
from typing import Any, Literal
from urllib.parse import quote, urlencode

DestinationKind = Literal["slack", "discord", "webhook"]
SIGNATURE_HEADER = "X-Ampscope-Signature-256"
DELIVERY_HEADER = "X-Ampscope-Delivery"
EVENT_HEADER = "X-Ampscope-Event"
# Discord embed colours, by level; a recovery is green whatever the level it recovers from.
COLOURS = {"error": 0xDC2626, "warning": 0xF59E0B, "info": 0x2563EB, "recovered": 0x16A34A}
LEVEL_MARK = {"error": "🔴", "warning": "🟠", "info": "🔵", "recovered": "🟢"}


@dataclass(frozen=True)
class AlertMessage:
    """Everything an alert says, whatever the destination."""

    delivery_id: str
    event: str
    """`fired`, `recovered` or `test`."""
    severity: str
    project: str
    run_id: str | None
    run_name: str | None
    rule: str | None
    title: str
    explanation: str
    recommendation: str
    step_start: int | None
    step_end: int | None
    link: str
    """The run page, zoomed to the steps (the server's address without a run)."""
    created_at: float


def run_link(public_url: str, run_id: str | None, start: int | None, end: int | None) -> str:
    base = public_url.rstrip("/")
    if run_id is None:
        return base + "/"
    link = f"{base}/runs/{quote(run_id, safe='')}"
    if start is not None and end is not None:
        # A little context either side, so a one-step event is not the whole chart.
        pad = max(10, (end - start) // 10)
        link += "?" + urlencode({"start": max(0, start - pad), "end": end + pad})
    return link


def _steps(m: AlertMessage) -> str:
    if m.step_start is None:
        return ""
    return f"step {m.step_start}" if m.step_end in (None, m.step_start) else (
        f"steps {m.step_start}-{m.step_end}")


def _level(m: AlertMessage) -> str:
    return "recovered" if m.event == "recovered" else m.severity


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _where(m: AlertMessage) -> str:
    """Where the alert is from; a message about no run (a test alert) names none (it read
    "run no run")."""
    run = m.run_name or m.run_id
    return " · ".join(p for p in (f"project {m.project}", run and f"run {run}", _steps(m)) if p)


def _mrkdwn(text: str) -> str:
    """Slack's escaping: `<…>` would be a link or a mention (`<!channel>`), `&` an entity."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(m: AlertMessage) -> dict[str, Any]:
    heading = f"{LEVEL_MARK[_level(m)]} {m.severity.upper()}: {m.title}"
    text = f"{_mrkdwn(m.explanation)}\n*What to do:* {_mrkdwn(m.recommendation)}"
    return {
        "text": _cut(_mrkdwn(heading), 3000),  # the notification's text, and what old clients show
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": _cut(heading, 150)}},
            {"type": "section", "text": {"type": "mrkdwn", "text": _cut(text, 3000)}},
            {"type": "context", "elements": [
                {"type": "mrkdwn", "text": _cut(_mrkdwn(_where(m)), 3000)}]},
            {"type": "actions", "elements": [{
                "type": "button", "text": {"type": "plain_text", "text": "Open the run"},
                "url": m.link}]},
        ],
    }


def discord_body(m: AlertMessage) -> dict[str, Any]:
    return {
        "content": None,
        "allowed_mentions": {"parse": []},  # never ping @everyone from a run name
        "embeds": [{
            "title": _cut(f"{m.severity.upper()}: {m.title}", 256),
            "description": _cut(m.explanation, 4096),
            "url": m.link,
            "color": COLOURS[_level(m)],
            "fields": [
                {"name": "What to do", "value": _cut(m.recommendation, 1024) or "—"},
                {"name": "Where", "value": _cut(_where(m), 1024)},
            ],
        }],
    }


def webhook_body(m: AlertMessage) -> dict[str, Any]:
    return {"type": "ampscope.alert", "alert": asdict(m)}


def request_body(kind: DestinationKind, message: AlertMessage) -> bytes:
    body = {"slack": slack_body, "discord": discord_body, "webhook": webhook_body}[kind](message)
    # allow_nan=False: an alert carries no number a strict JSON parser would refuse.
    return json.dumps(body, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode()


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def headers(kind: DestinationKind, message: AlertMessage, body: bytes,
            secret: str | None) -> dict[str, str]:
    out = {"Content-Type": "application/json", DELIVERY_HEADER: message.delivery_id,
           EVENT_HEADER: message.event}
    if kind == "webhook" and secret:
        out[SIGNATURE_HEADER] = signature(secret, body)
    return out
