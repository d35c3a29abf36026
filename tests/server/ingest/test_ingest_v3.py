"""Wire v3 on both dialects: the FP32 re-check and the swallowed-update fractions round trip
unchanged in kind (NaN/inf loss included), duplicates store no v3 children, 422/409s, the
re-check on skipped events and the `swallowed_frac` heatmap."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from ampscope_server.errors import InvalidPayload, LayerTableMissing
from ampscope_server.store.models import StepRecheck, SwallowedStat
from tests.server.wire import batch_v2, new_id, record_v2, strict_json
from tests.support.ingest import ingest_payload, post_batch

PERSISTED: dict[str, Any] = {"status": "persisted", "loss": "nan",
             "layers": [{"layer": 1, "kind": "nan"}, {"layer": 0, "kind": "inf"}], "detail": None}
VANISHED: dict[str, Any] = {"status": "vanished", "loss": 0.25, "layers": [], "detail": None}
FAILED: dict[str, Any] = {"status": "failed", "loss": None, "layers": [],
          "detail": "RuntimeError: mat1 and mat2 shapes cannot be multiplied"}
INF_LOSS: dict[str, Any] = {"status": "persisted", "loss": "inf", "layers": [], "detail": None}


ORIGIN: dict[str, Any] = {"module": "encoder.layers.0.linear1", "input_finite": True,
                          "format": "fp16"}


def _read(recheck: dict[str, Any] | None) -> dict[str, Any] | None:
    """A v3 re-check as read back: the v6 `origin` null (not sent)."""
    return None if recheck is None else {**recheck, "origin": None}


def _v3(seq: int, *, with_layers: bool = True, **overrides: Any) -> dict[str, Any]:
    rec = record_v2(seq, with_layers=with_layers, recheck=None, swallowed=None)
    rec.update(overrides)
    return rec


def _batch(records: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    payload = batch_v2(records, **kwargs)
    payload["schema_version"] = 3
    return payload


def _records() -> list[dict[str, Any]]:
    skipped: dict[str, Any] = {"found_inf": True, "skipped": True, "scale_after": 32768.0}
    return [
        _v3(0, swallowed=[0.5, None]),
        _v3(1, recheck=PERSISTED, **skipped),
        _v3(2, recheck=VANISHED, with_layers=False, **skipped),
        _v3(3, recheck=FAILED, **skipped),
        _v3(4, recheck=INF_LOSS, **skipped),
        _v3(5, swallowed=[1.0, 0.0]),
        _v3(6, swallowed=[None, None]),
    ]


def _get(api: TestClient, path: str) -> Any:
    response = api.get(path)
    assert response.status_code == 200, response.text
    return strict_json(response.text)


class TestRoundTrip:
    def test_export_gives_back_every_v3_field_as_sent(self, api: TestClient) -> None:
        run_id = new_id()
        records = _records()
        post_batch(api, _batch(records, run_id=run_id))
        export = _get(api, f"/api/runs/{run_id}/export")
        assert [{k: v for k, v in got.items() if k not in ("id", "attempt")}
                for got in export["steps"]] == [
            {**sent, "ranks": None, "optimizers": None, "recheck": _read(sent["recheck"])}
            for sent in records]  # v4 and v6 (the re-check's origin): not sent

    def test_v2_batches_read_back_with_v3_fields_null(self, api: TestClient) -> None:
        run_id = new_id()
        post_batch(api, batch_v2([record_v2(0)], run_id=run_id))
        step = _get(api, f"/api/runs/{run_id}/export")["steps"][0]
        assert (step["recheck"], step["swallowed"]) == (None, None)

    def test_skipped_events_carry_the_recheck(self, api: TestClient) -> None:
        run_id = new_id()
        post_batch(api, _batch(_records(), run_id=run_id))
        events = _get(api, f"/api/runs/{run_id}/events")["events"]
        skipped = {e["step"]: e["recheck"] for e in events if e["kind"] == "skipped"}
        assert skipped == {1: _read(PERSISTED), 2: _read(VANISHED), 3: _read(FAILED),
                           4: _read(INF_LOSS)}

    def test_swallowed_heatmap(self, api: TestClient) -> None:
        run_id = new_id()
        post_batch(api, _batch(_records(), run_id=run_id))
        heat = _get(api, f"/api/runs/{run_id}/layer-stats?stat=swallowed_frac")
        assert heat == {"stat": "swallowed_frac", "source": "param",
                        "layers": ["fc1.weight", "fc1.bias"], "steps": [0, 5, 6],
                        "z": [[0.5, 1.0, None], [None, 0.0, None]], "downsampled": False,
                        "rows": None}
        narrow = _get(api, f"/api/runs/{run_id}/layer-stats?stat=swallowed_frac&start=1&end=5")
        assert (narrow["steps"], narrow["z"]) == ([5], [[1.0], [0.0]])
        down = _get(api, f"/api/runs/{run_id}/layer-stats?stat=swallowed_frac&max_points=2")
        # Contiguous groups of two columns, each cell the group's max (a spike survives).
        assert (down["steps"], down["z"], down["downsampled"]) == (
            [0, 6], [[1.0, None], [0.0, None]], True)


class TestOrigin:
    """Where a forward overflow began (wire v6 `recheck.origin`, #30)."""

    def test_stored_and_read_back_on_the_export_and_the_events(self, api: TestClient) -> None:
        run_id = new_id()
        payload = _batch(_records(), run_id=run_id)
        payload["schema_version"] = 6
        payload["records"][4]["recheck"] = {**INF_LOSS, "origin": ORIGIN}
        post_batch(api, payload)
        export = _get(api, f"/api/runs/{run_id}/export")
        assert [s["recheck"] and s["recheck"]["origin"] for s in export["steps"]] == [
            None, None, None, None, ORIGIN, None, None]
        events = _get(api, f"/api/runs/{run_id}/events")["events"]
        assert [e["recheck"]["origin"] for e in events
                if e["kind"] == "skipped" and e["step"] == 4] == [ORIGIN]

    @pytest.mark.parametrize(("origin", "version", "message"), [
        (ORIGIN, 4, "records[4].recheck.origin: unknown field in schema_version 4"),
        (ORIGIN, 5, "records[4].recheck.origin: unknown field in schema_version 5"),
        ({**ORIGIN, "format": "fp8"}, 6,
         "records[4].recheck.origin.format: Input should be 'fp16', 'bf16' or 'fp32'"),
        ({**ORIGIN, "module": "m" * 501}, 6,
         "records[4].recheck.origin.module: String should have at most 500 characters"),
        ({**ORIGIN, "input_finite": 1}, 6,
         "records[4].recheck.origin.input_finite: Input should be a valid boolean"),
        ({"module": "0", "format": "fp16"}, 6,
         "records[4].recheck.origin.input_finite: field required"),
    ])
    def test_refused_with_422(self, api: TestClient, origin: dict[str, Any], version: int,
                              message: str) -> None:
        payload = _batch(_records(), run_id=new_id())
        payload["schema_version"] = version
        payload["records"][4]["recheck"] = {**INF_LOSS, "origin": origin}
        assert message in post_batch(api, payload, status=422)["detail"]

    def test_a_failed_recheck_carries_no_origin(self, api: TestClient) -> None:
        payload = _batch(_records(), run_id=new_id())
        payload["schema_version"] = 6
        payload["records"][3]["recheck"] = {**FAILED, "origin": ORIGIN}
        assert post_batch(api, payload, status=422)["detail"] == (
            "records[3].recheck: a failed re-check carries no loss, no layers and no origin")


def _invalid(mutate: Any, version: int = 3) -> dict[str, Any]:
    payload = _batch(_records(), run_id=new_id())
    payload["schema_version"] = version
    mutate(payload)
    return payload


class TestValidation:
    @pytest.mark.parametrize(("mutate", "version", "message"), [
        (lambda p: None, 2,
         "records[0].recheck: unknown field in schema_version 2; records[0].swallowed: unknown "
         "field in schema_version 2; records[1].recheck: unknown field in schema_version 2;"),
        (lambda p: p["records"][2].update(recheck={**VANISHED, "loss": "nan"}), 3,
         "records[2].recheck.status is 'vanished', but the FP32 loss is nan and 0 layers were "
         "non-finite: 'persisted' exactly when the loss is non-finite or a layer is listed"),
        (lambda p: p["records"][1].update(recheck={**PERSISTED, "loss": 1.0, "layers": []}), 3,
         "records[1].recheck.status is 'persisted', but the FP32 loss is 1.0 and 0 layers"),
        (lambda p: p["records"][3].update(recheck={**FAILED, "loss": 1.0}), 3,
         "records[3].recheck: a failed re-check carries no loss, no layers and no origin"),
        (lambda p: p["records"][2].update(recheck={**VANISHED, "detail": "x"}), 3,
         "records[2].recheck.detail: only a failed re-check carries a detail"),
        (lambda p: p["records"][1].update(recheck={**PERSISTED, "layers": [
            {"layer": 0, "kind": "nan"}, {"layer": 0, "kind": "inf"}]}), 3,
         "records[1].recheck.layers[1].layer 0 appears more than once"),
        (lambda p: p["records"][1].update(recheck={**PERSISTED, "status": "maybe"}), 3,
         "records[1].recheck.status: Input should be 'persisted', 'vanished' or 'failed'"),
        (lambda p: p["records"][0].update(swallowed=[1.5, None]), 3,
         "records[0].swallowed[0]: Input should be less than or equal to 1"),
        (lambda p: p["records"][0].update(swallowed=["nan", None]), 3,
         "records[0].swallowed[0]: Input should be a valid number"),
        (lambda p: p["records"][3].update(recheck={**FAILED, "detail": "x" * 1001}), 3,
         "records[3].recheck.detail: String should have at most 1000 characters"),
    ])
    def test_refused_with_422(self, api: TestClient, mutate: Any, version: int,
                              message: str) -> None:
        assert message in post_batch(api, _invalid(mutate, version), status=422)["detail"]

    @pytest.mark.parametrize(("mutate", "message"), [
        (lambda p: p["records"][0].update(swallowed=[0.5]),
         "records[0].swallowed has 1 entries, but the run's layer table has 2 layers"),
        (lambda p: p["records"][1].update(recheck={**PERSISTED, "layers": [
            {"layer": 2, "kind": "nan"}]}),
         "records[1].recheck.layers[0].layer is 2, but the run's layer table has 2 layers"),
    ])
    def test_not_fitting_the_layer_table_is_422(
        self, api: TestClient, mutate: Any, message: str
    ) -> None:
        assert post_batch(api, _invalid(mutate), status=422) == {"detail": message}

    def test_without_a_layer_table_is_409(self, api: TestClient) -> None:
        run_id = new_id()
        payload = _batch([_v3(0, with_layers=False, swallowed=[0.5, 0.5])], run_id=run_id,
                         layers=None)
        assert post_batch(api, payload, status=409) == {"detail": (
            f"records[0] carries swallowed fractions, but run '{run_id}' has no layer table yet "
            "and this batch sends none")}


def _counts(factory: sessionmaker[Session]) -> tuple[int, int]:
    with factory() as session:
        return (session.scalar(select(func.count()).select_from(StepRecheck)) or 0,
                session.scalar(select(func.count()).select_from(SwallowedStat)) or 0)


class TestStorage:
    def test_duplicates_store_no_v3_children(self, sessions: sessionmaker[Session]) -> None:
        payload = _batch(_records())
        first = ingest_payload(sessions, payload)
        # swallowed_stats: one packed row per step that carries fractions (0, 5 and 6)
        assert _counts(sessions) == (4, 3)
        second = ingest_payload(sessions, copy.deepcopy(payload))
        assert (first.accepted, second.duplicates) == (7, 7)
        assert _counts(sessions) == (4, 3)

    def test_a_bad_record_stores_no_v3_child(self, sessions: sessionmaker[Session]) -> None:
        records = _records()
        records[6]["swallowed"] = [0.5]
        with pytest.raises(InvalidPayload):
            ingest_payload(sessions, _batch(records))
        assert _counts(sessions) == (0, 0)

    def test_layer_table_missing(self, sessions: sessionmaker[Session]) -> None:
        records = [_v3(0, with_layers=False, recheck=PERSISTED, found_inf=True, skipped=True)]
        with pytest.raises(LayerTableMissing):
            ingest_payload(sessions, _batch(records, layers=None))
        assert _counts(sessions) == (0, 0)
