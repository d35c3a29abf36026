"""Wire v6 `records[].shadow` (#30), on both dialects: the FP32 shadow step of an applied step
(rel_err, cosine and the FP32 norm per layer) is stored and read back bit for bit through
`/export` and a `nonfinite` event's `shadow`; a v5 batch carrying one is refused by name; the
per-layer arrays must match each other and the layer table."""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.server.wire import batch_v2, new_id, record_v2, strict_json
from tests.support.ingest import post_batch

TINY = 2.0**-1074
SHADOW: dict[str, Any] = {"status": "ok", "loss": 0.6931471805599453,
                          "rel_err": [1.0000000000000002e-3, "nan"], "cosine": [-0.0, None],
                          "norm": [0.30000000000000004, 0.0], "detail": None}
EXTREMES: dict[str, Any] = {"status": "ok", "loss": "-inf", "rel_err": [TINY, "inf"],
                            "cosine": [None, 1.7976931348623157e308],
                            "norm": [TINY, "nan"], "detail": None}
FAILED: dict[str, Any] = {"status": "failed", "loss": None, "rel_err": None, "cosine": None,
                          "norm": None, "detail": "ValueError: bad batch"}


def _batch(version: int, *shadows: dict[str, Any] | None, **record: Any) -> dict[str, Any]:
    records = []
    for seq, shadow in enumerate(shadows):
        rec = record_v2(seq, **record)
        if shadow is not None:
            rec["shadow"] = shadow
        records.append(rec)
    payload = batch_v2(records, run_id=new_id())
    payload["schema_version"] = version
    return payload


def _get(api: TestClient, path: str) -> Any:
    response = api.get(path)
    assert response.status_code == 200, response.text
    return strict_json(response.text)


def _bits(values: list[Any]) -> list[Any]:
    return [v if not isinstance(v, float) else struct.pack("<d", v) for v in values]


class TestStored:
    def test_read_back_bit_exact_through_the_export(self, api: TestClient) -> None:
        payload = _batch(6, None, SHADOW, EXTREMES, FAILED)
        run_id = payload["run"]["id"]
        assert post_batch(api, payload)["accepted"] == 4
        steps = _get(api, f"/api/runs/{run_id}/export")["steps"]
        # A step without one carries no key, as the hook sends it.
        assert [s.get("shadow", "absent") for s in steps] == ["absent", SHADOW, EXTREMES, FAILED]
        # -0.0 == 0.0 and the smallest subnormal: compare the float64 bits too.
        assert _bits(steps[1]["shadow"]["cosine"]) == _bits([-0.0, None])
        assert _bits(steps[2]["shadow"]["rel_err"]) == _bits([TINY, "inf"])
        assert _bits(steps[1]["shadow"]["norm"]) == _bits([0.30000000000000004, 0.0])
        assert _bits(steps[2]["shadow"]["norm"]) == _bits([TINY, "nan"])
        assert math.copysign(1.0, steps[1]["shadow"]["cosine"][0]) == -1.0

    def test_an_applied_non_finite_step_carries_its_shadow_in_its_event(
        self, api: TestClient
    ) -> None:
        """No scaler (BF16): a step whose gradient held inf is applied, a `nonfinite` event;
        its shadow step says what FP32 made of the same batch."""
        payload = _batch(6, SHADOW, None, found_inf=True, skipped=False, scale_before=None,
                         scale_after=None, growth_tracker=None)
        run_id = payload["run"]["id"]
        assert post_batch(api, payload)["accepted"] == 2
        events = _get(api, f"/api/runs/{run_id}/events")["events"]
        assert [(e["kind"], e["step"], e.get("shadow", "absent")) for e in events] == [
            ("nonfinite", 0, SHADOW), ("nonfinite", 1, "absent")]


class TestRefused:
    def test_a_v5_batch_carrying_one_is_422_naming_it(self, api: TestClient) -> None:
        payload = _batch(5, None, SHADOW)
        assert post_batch(api, payload, status=422) == {
            "detail": "records[1].shadow: unknown field in schema_version 5"}
        assert api.get(f"/api/runs/{payload['run']['id']}").status_code == 404

    @pytest.mark.parametrize(("shadow", "detail"), [
        ({**SHADOW, "rel_err": [0.5]},
         "records[0].shadow.rel_err has 1 entries and cosine 2: "
         "one per layer each"),
        ({**SHADOW, "norm": [0.5, 0.5, 0.5]},
         "records[0].shadow.rel_err has 2 entries and norm 3: "
         "one per layer each"),
        ({**SHADOW, "detail": "why"},
         "records[0].shadow.detail: only a failed shadow step "
         "carries a detail"),
        ({**FAILED, "loss": 1.0},
         "records[0].shadow: a failed shadow step carries no "
         "loss, rel_err, cosine or norm"),
        ({**FAILED, "norm": [1.0, 1.0]},
         "records[0].shadow: a failed shadow step carries no "
         "loss, rel_err, cosine or norm"),
        ({**SHADOW, "cosine": None},
         "records[0].shadow: a shadow step that ran carries "
         "rel_err, cosine and norm"),
        ({key: value for key, value in SHADOW.items() if key != "norm"},
         "records[0].shadow: a shadow step that ran carries "
         "rel_err, cosine and norm"),
        ({**SHADOW, "rel_err": [0.5, "nan?"]},
         'records[0].shadow.rel_err[1]: expected a number or one of "nan", "inf", "-inf", got '
         "the string 'nan?'"),
        ({**SHADOW, "status": "vanished"}, "records[0].shadow.status: Input should be 'ok' or "
                                           "'failed'"),
    ])
    def test_an_inconsistent_shadow_is_422(
        self, api: TestClient, shadow: dict[str, Any], detail: str
    ) -> None:
        assert post_batch(api, _batch(6, shadow), status=422) == {"detail": detail}

    def test_arrays_longer_than_the_layer_table_are_422(self, api: TestClient) -> None:
        shadow = {**SHADOW, "rel_err": [0.1, 0.2, 0.3], "cosine": [1.0, 1.0, 1.0],
                  "norm": [1.0, 1.0, 1.0]}
        assert post_batch(api, _batch(6, shadow), status=422) == {
            "detail": "records[0].shadow.rel_err has 3 entries, but the run's layer table has "
                      "2 layers"}
