"""Negotiating the wire version down (`ampscope.negotiate`, issue #30): the refusal it reads and
the bodies it rewrites, then the transport and sync against a real server of each dialect.

An older server is the real one behind `OlderServer`, which answers a version past its newest
as a server of that build does (the body checked against the pre-#30 server's own validation:
`schema_version: Input should be 1, 2, 3, 4 or 5; run.target_format_reason: unknown field; …`)
and passes every other body on, so a downgraded batch meets the real server's validation of
that version (v5 refuses the v6 fields by name, v4 refuses packed blocks).
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ampscope import wire
from ampscope.negotiate import lower_version, refuses_version, rewrite
from ampscope.spool import Spool
from ampscope.sync import sync
from ampscope.transport import HttpSender, Outcome, SendResult, Transport, TransportStats
from tests.server.wire import LAYERS, strict_json
from tests.support.servers import ServerProcess

REASON = "32 of 32 parameter tensors are FP16"
ORIGIN: dict[str, Any] = {"module": "encoder.layers.0.linear1", "input_finite": True,
                          "format": "fp16"}
N = 10
NO_SCALES = "the formats probe's block scale exponents are not sent"
NO_FORMATS = f"{NO_SCALES}; the formats probe's statistics are not sent"
LEFT_OUT = f"{NO_FORMATS}; target_format_reason, recheck origins and shadow steps are not sent"
WARNING_V7 = f"ampscope server accepts wire v7, not v8: {NO_SCALES}"
WARNING_V6 = f"ampscope server accepts wire v6, not v8: {NO_FORMATS}"
WARNING_V5 = f"ampscope server accepts wire v5, not v8: {LEFT_OUT}"
WARNING_V4 = (f"ampscope server accepts wire v4, not v8: {LEFT_OUT}; statistics travel as JSON "
              "arrays")


@pytest.fixture(autouse=True)
def spool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "spool"
    monkeypatch.setenv("AMPSCOPE_SPOOL_DIR", str(directory))
    return directory


def _record(seq: int) -> dict[str, Any]:
    """A record whose values test the codecs: -0.0, NaN, ±inf, a NaN amin_nz (null), and on
    every odd step an overflow with an FP32 re-check that found where it began, on every
    step 2 mod 4 an FP32 shadow step (v6) with NaN, ±inf and a layer without a gradient, on
    every step 0 mod 4 the formats probe's block (v7, its scales v8) with NaN, ±inf and
    -0.0."""
    nan, inf = math.nan, math.inf
    odd = seq % 2 == 1
    return wire.step_record(
        seq=seq, step=seq, wall_time=1764430001.25 + seq, loss=(-0.0, nan, 2.5)[seq % 3],
        scale_before=65536.0, scale_after=32768.0 if odd else 65536.0, growth_tracker=seq,
        found_inf=odd, skipped=odd, grad_norm=inf if odd else 0.75, lr=-inf if seq == 4 else 1e-3,
        duration=None,
        layers={"amax": [0.5 + seq, -0.0], "amin_nz": [2.0**-1074, nan],
                "zero_frac": [-0.0, 0.5], "subnormal_frac": [0.0, 1 / 3],
                "underflow_frac": [0.0, 0.125], "nan_count": [0.0, 3.0],
                "inf_count": [0.0, float(2**40)], "l2": [1.7976931348623157e308, nan]},
        recheck={"status": "persisted", "loss": "inf", "layers": [], "detail": None,
                 "origin": ORIGIN} if odd else None,
        shadow={"status": "ok", "loss": 0.25 + seq, "rel_err": ["nan", 2.0**-1074 * seq],
                "cosine": ["-inf", None], "norm": [0.5, None], "detail": None}
        if seq % 4 == 2 else None,
        formats=_formats(seq) if seq % 4 == 0 else None,
    )


def _formats(seq: int) -> dict[str, Any]:
    """One layer (fc1.weight), two recipes: 3 operands x 2 x 5 values, 3 x 4 moments, 3 x 2 x
    17 scale exponents (a NaN top: no block held a value)."""
    values = [math.nan, math.inf, -0.0, 0.125 + seq, 2.0**-1074] * 6
    moments = [448.0 * seq, -math.inf, 3.0, 0.0] * 3
    scales = ([-8.0 - seq, *map(float, range(16))] + [math.nan] + [0.0] * 16) * 3
    return {"recipes": ["mxfp8", "nvfp4"], "layers": [0],
            "values": wire.packed(array("d", values).tobytes()),
            "operands": wire.packed(array("d", moments).tobytes()),
            "scales": wire.packed(array("d", scales).tobytes())}


@dataclass
class Item:
    seq: int
    malformed: bool = False

    def to_wire(self) -> dict[str, Any]:
        record = _record(self.seq)
        if self.malformed:
            record["wall_time"] = "soon"
        return record


class Encoder:
    """The hook's encoding of a batch (`Monitor._encode`): the real wire, at its top version."""

    def __init__(self) -> None:
        self.run_id = str(uuid.uuid4())
        self.run = {"id": self.run_id, "name": "negotiate", "target_format": "fp16",
                    "target_format_reason": REASON, "world_size": 1}
        self.attempt = {"id": str(uuid.uuid4()), "pid": 4242, "started_at": 1764430000.0}

    def __call__(self, records: list[dict[str, Any]], include_layers: bool,
                 final: bool) -> bytes:
        return wire.dumps(wire.build_payload(
            run=self.run, attempt=self.attempt, layers=LAYERS if include_layers else None,
            records=records, final=final))


def _refusal(payload: dict[str, Any], newest: int) -> bytes:
    """What a server whose newest version is `newest` answers a batch of a later version."""
    versions = ", ".join(map(str, range(1, newest)))
    parts = [f"schema_version: Input should be {versions} or {newest}"]
    if newest < 6 and "target_format_reason" in payload["run"]:
        parts.append("run.target_format_reason: unknown field")
    parts += [f"records[{i}].recheck.origin: unknown field"
              for i, record in enumerate(payload["records"])
              if newest < 6 and "origin" in (record.get("recheck") or {})]
    parts += [f"records[{i}].shadow: unknown field"
              for i, record in enumerate(payload["records"]) if newest < 6 and "shadow" in record]
    parts += [f"records[{i}].formats: unknown field"
              for i, record in enumerate(payload["records"]) if newest < 7 and "formats" in record]
    parts += [f"records[{i}].formats.scales: unknown field"
              for i, record in enumerate(payload["records"])
              if newest == 7 and "scales" in (record.get("formats") or {})]
    return json.dumps({"detail": "; ".join(parts)}).encode()


class OlderServer:
    """A sender to the real server that answers as a server built before v`newest + 1` does;
    it keeps every body it forwards, and answers the first `away` sends with a 503."""

    def __init__(self, url: str, newest: int, away: int = 0) -> None:
        self.http = HttpSender(url)
        self.newest = newest
        self.away = away
        self.forwarded: list[dict[str, Any]] = []
        self.refused: list[int] = []

    def send(self, body: bytes, timeout: float) -> SendResult:
        if self.away:
            self.away -= 1
            return SendResult(Outcome.RETRY, 503, detail="away")
        payload = json.loads(body)
        if payload["schema_version"] > self.newest:
            self.refused.append(payload["schema_version"])
            answer = _refusal(payload, self.newest)
            return SendResult(Outcome.REJECTED, 422, detail=answer.decode(), body=answer)
        self.forwarded.append(payload)
        return self.http.send(body, timeout)

    def close(self) -> None:
        self.http.close()


def _transport(sender: Any, encode: Encoder, **kw: Any) -> Transport:
    kw.setdefault("flush_interval", 0.02)
    kw.setdefault("backoff_base", 0.01)
    kw.setdefault("batch_size", 4)
    return Transport(sender, encode, **kw)


def _send_all(transport: Transport, items: list[Item]) -> None:
    for item in items:
        transport.put(item)
    transport.close(30.0)


def _get(server: ServerProcess, path: str) -> Any:
    response = httpx.get(f"{server.url}{path}", timeout=30.0)
    assert response.status_code == 200, response.text
    return strict_json(response.text)


def _sent(seqs: range, *, version: int) -> list[dict[str, Any]]:
    """The records as the server should give them back after a batch at `version`: their JSON
    form, below v8 without the formats' scales, below v7 without formats, below v6 without
    shadow steps and the re-check's origin null."""
    records = wire.unpack_payload({"records": [_record(s) for s in seqs]})["records"]
    out: list[dict[str, Any]] = json.loads(json.dumps(records, allow_nan=False))
    for record in out:
        if version < 8 and record.get("formats") is not None:
            del record["formats"]["scales"]
        if version < 7:
            record.pop("formats", None)
        if version < 6:
            record.pop("shadow", None)
            if record["recheck"] is not None:
                record["recheck"]["origin"] = None
    return out


def _stored(server: ServerProcess, run_id: str) -> list[dict[str, Any]]:
    steps = _get(server, f"/api/runs/{run_id}/export")["steps"]
    return [{k: v for k, v in step.items() if k not in ("id", "attempt")} for step in steps]


def _bit_exact(stored: list[dict[str, Any]]) -> None:
    """What `==` cannot see: the sign of a zero."""
    for step in stored:
        if step["seq"] % 3 == 0:
            assert math.copysign(1.0, step["loss"]) == -1.0
        assert math.copysign(1.0, step["layers"]["zero_frac"][0]) == -1.0
        assert math.copysign(1.0, step["layers"]["amax"][1]) == -1.0


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "accepts wire" in r.getMessage()]


# --- pure --------------------------------------------------------------------------------------

def _answer(status: int, detail: object) -> SendResult:
    body = json.dumps({"detail": detail}).encode()
    return SendResult(Outcome.REJECTED, status, detail=body.decode(), body=body)


class TestRefusesVersion:
    @pytest.mark.parametrize(("result", "expected"), [
        (_answer(422, "schema_version: Input should be 1, 2, 3, 4 or 5"), True),
        (_answer(422, "schema_version: Input should be 1, 2, 3, 4 or 5; "
                      "run.target_format_reason: unknown field"), True),
        (_answer(422, "run.world_size: unknown field; schema_version: Input should be 1"), True),
        (_answer(422, [{"loc": ["body", "schema_version"], "msg": "Input should be 1"}]), True),
        (_answer(422, "records[0].wall_time: Input should be a valid number"), False),
        (_answer(422, "run.target_format_reason: unknown field in schema_version 5"), False),
        (_answer(422, "records[0].layers: packed statistics need schema_version 5, not 4"),
         False),
        (_answer(422, [{"loc": ["body", "records", 0, "seq"], "msg": "schema_version"}]), False),
        (_answer(400, "schema_version: Input should be 1, 2, 3, 4 or 5"), False),
        (SendResult(Outcome.REJECTED, 422, detail="<html>", body=b"<html>"), False),
        (SendResult(Outcome.REJECTED, 422, body=b'["schema_version"]'), False),
    ])
    def test_only_a_422_at_the_location_schema_version(
        self, result: SendResult, expected: bool
    ) -> None:
        assert refuses_version(result) is expected


class TestRewrite:
    def _body(self) -> bytes:
        return Encoder()([_record(0), _record(1), _record(2)], True, False)

    def test_v7_drops_the_scales_and_nothing_else(self) -> None:
        body = self._body()
        original = json.loads(body)
        rewritten = rewrite(body, 7)
        assert rewritten is not None
        got = json.loads(rewritten)
        assert "scales" in original["records"][0]["formats"]
        assert "scales" not in got["records"][0]["formats"]
        del original["records"][0]["formats"]["scales"]
        assert got == {**original, "schema_version": 7}

    def test_v6_drops_the_formats_and_nothing_else(self) -> None:
        body = self._body()
        original = json.loads(body)
        rewritten = rewrite(body, 6)
        assert rewritten is not None
        got = json.loads(rewritten)
        assert "formats" in original["records"][0] and "formats" not in got["records"][0]
        del original["records"][0]["formats"]
        assert got == {**original, "schema_version": 6}

    def test_v5_drops_the_v6_fields_and_keeps_the_blocks_packed(self) -> None:
        body = self._body()
        original = json.loads(body)
        rewritten = rewrite(body, 5)
        assert rewritten is not None
        got = json.loads(rewritten)
        assert got["schema_version"] == 5 and "target_format_reason" not in got["run"]
        assert "origin" not in got["records"][1]["recheck"]
        assert [r["layers"] for r in got["records"]] == [
            r["layers"] for r in original["records"]]
        assert set(got["records"][0]["layers"]) == {wire.PACKED}
        assert "shadow" not in got["records"][2] and "shadow" in original["records"][2]
        del original["run"]["target_format_reason"], original["records"][1]["recheck"]["origin"]
        del original["records"][2]["shadow"], original["records"][0]["formats"]
        assert got == {**original, "schema_version": 5}  # nothing else changed

    def test_v4_unpacks_the_blocks_into_arrays(self) -> None:
        rewritten = rewrite(self._body(), 4)
        assert rewritten is not None
        got = json.loads(rewritten)
        assert got["schema_version"] == 4
        assert [r["layers"] for r in got["records"]] == [
            r["layers"] for r in _sent(range(3), version=4)]

    def test_a_body_at_the_version_or_below_is_itself(self) -> None:
        body = rewrite(self._body(), 5)
        assert body is not None and rewrite(body, 5) is body and rewrite(body, 6) is body

    @pytest.mark.parametrize("body", [b"{}", b"[]", b"not json", b'{"schema_version": "6"}'])
    def test_what_is_not_a_batch_is_not_rewritten(self, body: bytes) -> None:
        assert rewrite(body, 5) is None

    def test_the_ladder_stops_at_v4(self) -> None:
        assert [lower_version(v) for v in (10, 9, 8, 7, 6, 5, 4)] == [8, 8, 7, 6, 5, 4, None]


# --- against a real server ---------------------------------------------------------------------

class TestTransport:
    def test_a_version_the_server_refuses_is_sent_one_lower_once(
        self, module_server: ServerProcess, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture
    ) -> None:
        """A top version of 9, which this server refuses with its own 422: one downgrade to
        v8 for the whole run, every record arrives, nothing is left out."""
        caplog.set_level(logging.WARNING, logger="ampscope")
        monkeypatch.setattr(wire, "SCHEMA_VERSION", 9)
        encode = Encoder()
        sender = OlderServer(module_server.url, newest=9)  # forwards all: the server refuses
        t = _transport(sender, encode)
        _send_all(t, [Item(s) for s in range(N)])
        assert t.stats() == TransportStats(N, N, 0, 0, failed_requests=1)
        assert [p["schema_version"] for p in sender.forwarded] == [9] + [8] * (
            len(sender.forwarded) - 1)
        assert _stored(module_server, encode.run_id) == _sent(range(N), version=8)
        assert _get(module_server, f"/api/runs/{encode.run_id}")["target_format_reason"] == (
            REASON)
        assert _warnings(caplog) == ["ampscope server accepts wire v8, not v9; nothing is left out"]

    def test_at_v7_the_scales_are_left_out_and_nothing_else(
        self, module_server: ServerProcess, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.WARNING, logger="ampscope")
        encode = Encoder()
        sender = OlderServer(module_server.url, newest=7)
        t = _transport(sender, encode)
        _send_all(t, [Item(s) for s in range(N)])
        assert t.stats() == TransportStats(N, N, 0, 0, failed_requests=1)
        assert sender.refused == [8]
        assert {p["schema_version"] for p in sender.forwarded} == {7}
        formats = [r["formats"] for p in sender.forwarded for r in p["records"] if "formats" in r]
        assert len(formats) == 3 and not any("scales" in f for f in formats)
        assert _stored(module_server, encode.run_id) == _sent(range(N), version=7)
        assert _warnings(caplog) == [WARNING_V7]

    def test_at_v6_the_formats_are_left_out_and_nothing_else(
        self, module_server: ServerProcess, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.WARNING, logger="ampscope")
        encode = Encoder()
        sender = OlderServer(module_server.url, newest=6)
        t = _transport(sender, encode)
        _send_all(t, [Item(s) for s in range(N)])
        assert t.stats() == TransportStats(N, N, 0, 0, failed_requests=2)
        assert sender.refused == [8, 7]
        assert {p["schema_version"] for p in sender.forwarded} == {6}
        assert not any("formats" in r for p in sender.forwarded for r in p["records"])
        stored = _stored(module_server, encode.run_id)
        assert stored == _sent(range(N), version=6)
        assert [s["seq"] for s in stored if "shadow" in s] == [2, 6]
        assert _warnings(caplog) == [WARNING_V6]

    def test_at_v5_no_v6_field_is_sent_and_the_blocks_stay_packed(
        self, module_server: ServerProcess, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.WARNING, logger="ampscope")
        encode = Encoder()
        sender = OlderServer(module_server.url, newest=5)
        t = _transport(sender, encode)
        _send_all(t, [Item(s) for s in range(N)])
        assert t.stats() == TransportStats(N, N, 0, 0, failed_requests=3)
        assert sender.refused == [8, 7, 6]
        assert {p["schema_version"] for p in sender.forwarded} == {5}
        assert not any("target_format_reason" in p["run"] for p in sender.forwarded)
        records = [r for p in sender.forwarded for r in p["records"]]
        assert [r["seq"] for r in records] == list(range(N))
        assert all(set(r["layers"]) == {wire.PACKED} for r in records)
        assert not any("origin" in r["recheck"] for r in records if r["recheck"] is not None)
        stored = _stored(module_server, encode.run_id)
        assert stored == _sent(range(N), version=5)
        _bit_exact(stored)
        assert _get(module_server, f"/api/runs/{encode.run_id}")["target_format_reason"] is None
        assert _warnings(caplog) == [WARNING_V5]

    def test_at_v4_the_statistics_arrive_as_arrays_bit_exact(
        self, module_server: ServerProcess, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.WARNING, logger="ampscope")
        encode = Encoder()
        sender = OlderServer(module_server.url, newest=4)
        t = _transport(sender, encode)
        _send_all(t, [Item(s) for s in range(N)])
        assert t.stats() == TransportStats(N, N, 0, 0, failed_requests=4)
        assert sender.refused == [8, 7, 6, 5]  # the first batch 4 times, then each one at v4
        assert {p["schema_version"] for p in sender.forwarded} == {4}
        records = [r for p in sender.forwarded for r in p["records"]]
        assert all(type(r["layers"]["amax"]) is list for r in records)
        stored = _stored(module_server, encode.run_id)
        assert stored == _sent(range(N), version=4)
        _bit_exact(stored)
        assert stored[0]["layers"]["amin_nz"] == [2.0**-1074, None]
        assert stored[1]["layers"]["l2"] == [1.7976931348623157e308, None]
        assert (stored[1]["loss"], stored[1]["grad_norm"], stored[4]["lr"]) == (
            "nan", "inf", "-inf")
        assert _warnings(caplog) == [WARNING_V4]

    def test_a_spooled_v8_frame_is_replayed_at_the_accepted_version(
        self, module_server: ServerProcess, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.WARNING, logger="ampscope")
        encode = Encoder()
        sender = OlderServer(module_server.url, newest=5, away=1)
        t = _transport(sender, encode, retry_window=0.0)
        _send_all(t, [Item(s) for s in range(N)])
        stats = t.stats()
        assert (stats.produced, stats.acknowledged, stats.dropped, stats.pending,
                stats.spooled) == (N, N, 0, 0, 0)
        assert stats.replayed > 0 and stats.failed_requests == 4  # the 503, three refusals
        assert sender.refused == [8, 7, 6]
        assert _stored(module_server, encode.run_id) == _sent(range(N), version=5)
        assert _warnings(caplog) == [WARNING_V5]

    def test_a_422_for_another_reason_is_rejected_and_downgrades_nothing(
        self, module_server: ServerProcess, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.WARNING, logger="ampscope")
        encode = Encoder()
        sender = OlderServer(module_server.url, newest=8)  # the server as it is
        t = _transport(sender, encode, batch_size=5, flush_interval=30.0)
        for seq in range(5):
            t.put(Item(seq, malformed=seq == 2))
        assert t.flush(30.0)
        _send_all(t, [Item(s) for s in range(5, N)])
        assert t.stats() == TransportStats(N, 5, 5, 0, failed_requests=1)
        assert {p["schema_version"] for p in sender.forwarded} == {8}
        assert sender.refused == []
        assert [s["seq"] for s in _stored(module_server, encode.run_id)] == list(range(5, N))
        assert _get(module_server, f"/api/runs/{encode.run_id}")["target_format_reason"] == (
            REASON)
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == 1 and messages[0].startswith(
            "ampscope server rejected a batch of 5 records with HTTP 422: ")
        assert "records[2].wall_time: Input should be a valid number" in messages[0]


class TestSync:
    def test_a_v8_spool_reaches_an_older_server(
        self, module_server: ServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.WARNING, logger="ampscope")
        encode = Encoder()
        spool = Spool(tmp_path / "left", 1 << 20, fsync=False)
        for start in range(0, N, 4):
            records = [_record(s) for s in range(start, min(N, start + 4))]
            assert spool.append(encode(records, True, False), len(records))
        spool.close()
        sender = OlderServer(module_server.url, newest=4)
        report = sync(tmp_path / "left", sender=sender)
        assert report.ok and (report.frames_sent, report.accepted) == (3, N)
        assert sender.refused == [8, 7, 6, 5]
        assert _stored(module_server, encode.run_id) == _sent(range(N), version=4)
        assert _warnings(caplog) == [WARNING_V4]
