"""Negotiating the wire version down with an older server (issue #30): never a step lost to it.

An older server answers an unknown ``schema_version`` with a 422 naming it; rather than lose the
batch, the sender (``Transport``, ``ampscope sync``) resends it one version lower and keeps the
accepted version for the run, warning once what is lost (v8 → v7: ``formats.scales``; v7 → v6:
``formats``; v6 → v5: ``target_format_reason``, ``recheck.origin``, ``shadow``; v5 → v4:
nothing, the packed blocks go as JSON arrays). v4 is the floor. A downgrade rewrites an encoded
body's JSON (``rewrite``), since the spool keeps exact request bytes: one path for fresh,
spooled and synced batches.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ampscope import wire
from ampscope.senders import SendResult

__all__ = ["LOWEST_VERSION", "Negotiation", "lower_version", "refuses_version", "rewrite"]

logger = logging.getLogger("ampscope")

LOWEST_VERSION = 4
"""The lowest version the hook falls back to (v3 has no ranks and no per-optimizer steps)."""

_DROPPED = {
    8: "the formats probe's block scale exponents are not sent",
    7: "the formats probe's statistics are not sent",
    6: "target_format_reason, recheck origins and shadow steps are not sent",
    5: "statistics travel as JSON arrays",
}
"""Per version: what re-encoding below it leaves out (for the warning)."""


def refuses_version(result: SendResult) -> bool:
    """A 422 whose detail names ``schema_version`` first: the server does not accept the
    batch's version (any other 422 is about the batch). Reads the server's ``{"detail":
    "<location>: <message>; …"}`` and FastAPI's default list of errors with a ``loc``."""
    if result.status != 422:
        return False
    try:
        detail = json.loads(result.body).get("detail")
    except (ValueError, AttributeError):
        return False
    if isinstance(detail, str):
        return any(part.startswith("schema_version:") for part in detail.split("; "))
    if isinstance(detail, list):
        return any(isinstance(error, dict)
                   and error.get("loc") in (["body", "schema_version"], ["schema_version"])
                   for error in detail)
    return False


def lower_version(version: int) -> int | None:
    """The next version below ``version`` that the hook speaks, None below ``LOWEST_VERSION``."""
    lower = min(version, wire.SCHEMA_VERSION + 1) - 1
    return lower if lower >= LOWEST_VERSION else None


def _version(payload: Any) -> int | None:
    version = payload.get("schema_version") if isinstance(payload, dict) else None
    return version if type(version) is int else None


def rewrite(body: bytes, version: int) -> bytes | None:
    """``body`` (one ingest batch) at ``version``: later fields dropped, below v5 the packed
    blocks unpacked; ``body`` itself at ``version`` or below; None when it cannot be rewritten."""
    try:
        payload = json.loads(body)
        current = _version(payload)
        if current is None:
            return None
        if current <= version:
            return body
        payload["schema_version"] = version
        if version < 8:
            for record in payload.get("records") or ():
                formats = record.get("formats")
                if isinstance(formats, dict):
                    formats.pop("scales", None)
        if version < 7:
            for record in payload.get("records") or ():
                record.pop("formats", None)
        if version < 6:
            run = payload.get("run")
            if isinstance(run, dict):
                run.pop("target_format_reason", None)
            for record in payload.get("records") or ():
                record.pop("shadow", None)
                recheck = record.get("recheck")
                if isinstance(recheck, dict):
                    recheck.pop("origin", None)
        if version < 5:
            wire.unpack_payload(payload)
            return json.dumps(payload, allow_nan=False, separators=(",", ":")).encode("utf-8")
        return wire.dumps(payload)
    except (ValueError, TypeError, AttributeError, KeyError):
        return None


class Negotiation:
    """The version the server accepts, learnt from its refusals; one per sender thread:
    ``prepare`` puts a body at that version, ``refused`` turns a refusal into the same body one
    version lower (None: not one, or no version left), ``accepted`` says once what is lost."""

    def __init__(self) -> None:
        self.version: int | None = None
        """None until a refusal: bodies go as encoded."""
        self._top: int | None = None
        self._announced: int | None = None

    def prepare(self, body: bytes) -> bytes:
        if self.version is None:
            return body
        rewritten = rewrite(body, self.version)
        return body if rewritten is None else rewritten

    def refused(self, body: bytes, result: SendResult) -> bytes | None:
        if not refuses_version(result):
            return None
        try:
            current = _version(json.loads(body))
        except ValueError:
            return None
        lower = None if current is None else lower_version(current)
        rewritten = None if lower is None else rewrite(body, lower)
        if lower is None or rewritten is None:
            return None
        if self._top is None:
            self._top = current
        self.version = lower
        return rewritten

    def accepted(self) -> None:
        version, top = self.version, self._top
        if version is None or top is None or self._announced == version:
            return
        self._announced = version
        dropped = [_DROPPED[v] for v in range(top, version, -1) if v in _DROPPED]
        logger.warning("ampscope server accepts wire v%d, not v%d%s", version, top,
                       f": {'; '.join(dropped)}" if dropped else "; nothing is left out")
