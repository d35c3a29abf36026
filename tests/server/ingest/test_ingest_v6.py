"""Wire v6 on both dialects: `run.target_format_reason` and `records[].recheck.origin` (#30),
first shipped as optional fields inside v5, are v6's. A v6 batch carrying them is stored and
read back; a v5 batch carrying either is refused by name, as any earlier version carrying a
later field is; a v5 batch without them is accepted as before."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.server.ingest.test_ingest_packed import as_floats, pack
from tests.server.wire import batch_v2, layer_stats, new_id, record_v2, strict_json
from tests.support.ingest import post_batch

REASON = "32 of 32 parameter tensors are BF16"
ORIGIN: dict[str, Any] = {"module": "encoder.layers.0.linear1", "input_finite": True,
                          "format": "fp16"}
RECHECK: dict[str, Any] = {"status": "persisted", "loss": "inf", "layers": [], "detail": None}


def _batch(version: int, *, reason: bool, origin: bool) -> dict[str, Any]:
    """Two v5-shaped records (packed layers), the second an overflow step with a re-check."""
    skipped: dict[str, Any] = {"found_inf": True, "skipped": True, "scale_after": 32768.0}
    recheck = {**RECHECK, "origin": ORIGIN} if origin else dict(RECHECK)
    records = [record_v2(0, layers=pack(as_floats(layer_stats(1.0)))),
               record_v2(1, layers=pack(as_floats(layer_stats(2.0))), recheck=recheck,
                         **skipped)]
    payload = batch_v2(records, run_id=new_id(), target_format="bf16")
    payload["schema_version"] = version
    if reason:
        payload["run"]["target_format_reason"] = REASON
    return payload


def _get(api: TestClient, path: str) -> Any:
    response = api.get(path)
    assert response.status_code == 200, response.text
    return strict_json(response.text)


class TestV6:
    def test_both_fields_are_stored_and_read_back(self, api: TestClient) -> None:
        payload = _batch(6, reason=True, origin=True)
        run_id = payload["run"]["id"]
        assert post_batch(api, payload)["accepted"] == 2
        run = _get(api, f"/api/runs/{run_id}")
        assert (run["target_format"], run["target_format_reason"]) == ("bf16", REASON)
        steps = _get(api, f"/api/runs/{run_id}/export")["steps"]
        assert [s["recheck"] for s in steps] == [None, {**RECHECK, "origin": ORIGIN}]
        assert [s["layers"] for s in steps] == [layer_stats(1.0), layer_stats(2.0)]
        events = _get(api, f"/api/runs/{run_id}/events")["events"]
        assert [e["recheck"] for e in events if e["kind"] == "skipped"] == [
            {**RECHECK, "origin": ORIGIN}]

    def test_a_v6_batch_without_them_reads_back_null(self, api: TestClient) -> None:
        payload = _batch(6, reason=False, origin=False)
        run_id = payload["run"]["id"]
        post_batch(api, payload)
        assert _get(api, f"/api/runs/{run_id}")["target_format_reason"] is None
        steps = _get(api, f"/api/runs/{run_id}/export")["steps"]
        assert steps[1]["recheck"] == {**RECHECK, "origin": None}


class TestV5:
    @pytest.mark.parametrize(("reason", "origin", "detail"), [
        (True, False, "run.target_format_reason: unknown field in schema_version 5"),
        (False, True, "records[1].recheck.origin: unknown field in schema_version 5"),
        (True, True, "run.target_format_reason: unknown field in schema_version 5; "
                     "records[1].recheck.origin: unknown field in schema_version 5"),
    ])
    def test_carrying_a_v6_field_is_422_naming_it(
        self, api: TestClient, reason: bool, origin: bool, detail: str
    ) -> None:
        payload = _batch(5, reason=reason, origin=origin)
        assert post_batch(api, payload, status=422) == {"detail": detail}
        assert api.get(f"/api/runs/{payload['run']['id']}").status_code == 404  # none stored

    def test_without_them_is_accepted_as_before(self, api: TestClient) -> None:
        payload = _batch(5, reason=False, origin=False)
        run_id = payload["run"]["id"]
        assert post_batch(api, payload)["accepted"] == 2
        assert _get(api, f"/api/runs/{run_id}")["target_format_reason"] is None
        steps = _get(api, f"/api/runs/{run_id}/export")["steps"]
        assert [s["layers"] for s in steps] == [layer_stats(1.0), layer_stats(2.0)]
        assert steps[1]["recheck"] == {**RECHECK, "origin": None}

    def test_a_version_past_the_newest_is_refused_by_its_schema_version(
        self, api: TestClient
    ) -> None:
        """What a newer hook's negotiation reads (`ampscope.negotiate`): the location
        `schema_version` first in the detail (v8, issue #33, is the newest now)."""
        payload = _batch(9, reason=True, origin=True)
        assert post_batch(api, payload, status=422) == {
            "detail": "schema_version: Input should be 1, 2, 3, 4, 5, 6, 7 or 8"}
