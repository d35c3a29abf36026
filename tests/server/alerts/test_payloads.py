"""alert_payloads: the body each destination gets, the signature, the link (pure)."""

from __future__ import annotations

import hashlib
import hmac
import json

from ampscope_server.alerts.payloads import (
    AlertMessage,
    headers,
    request_body,
    run_link,
    signature,
)

MESSAGE = AlertMessage(
    delivery_id="rule1:run1:overflow_storm#1:fired", event="fired", severity="error",
    project="vision", run_id="run1", run_name="<b>resnet</b> @everyone", rule="rule1",
    title="Overflow storm: 6 optimizer steps skipped between steps 200 and 250",
    explanation="Up to 6 of 100 consecutive steps overflowed.",
    recommendation="Lower the learning rate.", step_start=200, step_end=250,
    link="https://amp.example.com/runs/run1?start=190&end=260", created_at=1764430000.5)


def test_the_link_zooms_to_the_steps_with_context() -> None:
    assert run_link("https://amp.example.com/", "run 1", 200, 250) == (
        "https://amp.example.com/runs/run%201?start=190&end=260")
    assert run_link("http://h:1", "r", 5, 5) == "http://h:1/runs/r?start=0&end=15"
    assert run_link("http://h:1", "r", 1000, 3000) == "http://h:1/runs/r?start=800&end=3200"
    assert run_link("http://h:1", "r", None, None) == "http://h:1/runs/r"
    assert run_link("http://h:1", None, None, None) == "http://h:1/"


def test_slack_block_kit() -> None:
    body = json.loads(request_body("slack", MESSAGE))
    heading = "🔴 ERROR: Overflow storm: 6 optimizer steps skipped between steps 200 and 250"
    assert body["text"] == heading
    assert [b["type"] for b in body["blocks"]] == ["header", "section", "context", "actions"]
    assert body["blocks"][0]["text"] == {"type": "plain_text", "text": heading}
    assert body["blocks"][1]["text"]["text"] == (
        "Up to 6 of 100 consecutive steps overflowed.\n*What to do:* Lower the learning rate.")
    assert body["blocks"][2]["elements"][0]["text"] == (
        "project vision · run &lt;b&gt;resnet&lt;/b&gt; @everyone · steps 200-250")
    assert body["blocks"][3]["elements"][0]["url"] == MESSAGE.link


def test_discord_embed_is_coloured_by_level_and_pings_nobody() -> None:
    body = json.loads(request_body("discord", MESSAGE))
    assert body["allowed_mentions"] == {"parse": []}
    [embed] = body["embeds"]
    assert (embed["color"], embed["url"]) == (0xDC2626, MESSAGE.link)
    assert embed["title"].startswith("ERROR: Overflow storm")
    assert embed["fields"][0] == {"name": "What to do", "value": "Lower the learning rate."}
    warning = json.loads(request_body("discord", AlertMessage(**{**MESSAGE.__dict__,
                                                           "severity": "warning"})))
    recovered = json.loads(request_body("discord", AlertMessage(**{**MESSAGE.__dict__,
                                                             "event": "recovered"})))
    assert (warning["embeds"][0]["color"], recovered["embeds"][0]["color"]) == (
        0xF59E0B, 0x16A34A)


def test_the_generic_webhook_is_signed_over_the_exact_body() -> None:
    body = request_body("webhook", MESSAGE)
    sent = headers("webhook", MESSAGE, body, "s3cret-signing-key-0123")
    expected = hmac.new(b"s3cret-signing-key-0123", body, hashlib.sha256).hexdigest()
    assert sent == {"Content-Type": "application/json",
                    "X-Ampscope-Delivery": MESSAGE.delivery_id, "X-Ampscope-Event": "fired",
                    "X-Ampscope-Signature-256": f"sha256={expected}"}
    assert signature("other-key-0123456789", body) != sent["X-Ampscope-Signature-256"]
    assert json.loads(body) == {"type": "ampscope.alert", "alert": {
        **MESSAGE.__dict__}}
    # Slack and Discord are not signed (they authenticate by their URL).
    assert "X-Ampscope-Signature-256" not in headers("slack", MESSAGE, body, None)


def test_a_message_about_no_run_names_none() -> None:
    """A destination's test alert has no run: its context is the project alone (it read
    "run no run")."""
    test = AlertMessage(**{**MESSAGE.__dict__, "run_id": None, "run_name": None,
                           "step_start": None, "step_end": None})
    body = json.loads(request_body("slack", test))
    assert body["blocks"][2]["elements"][0]["text"] == "project vision"
