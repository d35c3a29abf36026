"""Ingest on both dialects: through the service, and over HTTP to the app (both in process)."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import httpx2
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from ampscope_server.errors import InvalidPayload, LayerTableConflict, LayerTableMissing
from ampscope_server.ingest import batches as ingest
from ampscope_server.ingest.wire import IngestBatch
from ampscope_server.live.hub import Hub
from ampscope_server.store.db import session_scope
from ampscope_server.store.models import LayerStat, Run, Step
from tests.server.wire import (
    LAYERS,
    batch,
    layer_stats,
    layers_read,
    new_id,
    record,
    strict_json,
)
from tests.support.ingest import ingest_payload


def _counts(factory: sessionmaker[Session]) -> tuple[int, int, int]:
    with factory() as session:
        return (
            session.scalar(select(func.count()).select_from(Run)) or 0,
            session.scalar(select(func.count()).select_from(Step)) or 0,
            # per-layer statistics stored: a packed row per step holds `layers` of them
            session.scalar(select(func.coalesce(func.sum(LayerStat.layers), 0))) or 0,
        )


class TestIngestService:
    def test_stores_records_and_layer_stats(self, sessions: sessionmaker[Session]) -> None:
        result = ingest_payload(sessions,
                                batch([record(0), record(1), record(2, with_layers=False)]))
        assert (result.attempt, result.accepted, result.duplicates) == (1, 3, 0)
        assert _counts(sessions) == (1, 3, 4)

    def test_same_batch_twice_is_stored_once(self, sessions: sessionmaker[Session]) -> None:
        payload = batch([record(0), record(1)])
        first = ingest_payload(sessions, payload)
        second = ingest_payload(sessions, payload)
        assert (first.accepted, first.duplicates) == (2, 0)
        assert (second.accepted, second.duplicates) == (0, 2)
        assert _counts(sessions) == (1, 2, 4)

    def test_partly_new_batch_stores_only_the_new(self, sessions: sessionmaker[Session]) -> None:
        ingest_payload(sessions, batch([record(0), record(1)]))
        result = ingest_payload(sessions, batch([record(1), record(2)], layers=None))
        assert (result.accepted, result.duplicates) == (1, 1)
        assert _counts(sessions) == (1, 3, 6)

    def test_a_bad_record_stores_nothing(self, sessions: sessionmaker[Session]) -> None:
        bad = record(1)
        bad["layers"]["amax"] = [0.5]
        with pytest.raises(InvalidPayload):
            ingest_payload(sessions, batch([record(0), bad]))
        assert _counts(sessions) == (0, 0, 0)

    def test_conflicting_layer_table_stores_nothing(self, sessions: sessionmaker[Session]) -> None:
        ingest_payload(sessions, batch([record(0)]))
        layers = copy.deepcopy(LAYERS)
        layers[1]["shape"] = [32]
        with pytest.raises(LayerTableConflict):
            ingest_payload(sessions, batch([record(1)], attempt_id=new_id(), layers=layers))
        assert _counts(sessions) == (1, 1, 2)

    def test_missing_layer_table(self, sessions: sessionmaker[Session]) -> None:
        with pytest.raises(LayerTableMissing):
            ingest_payload(sessions, batch([record(0)], layers=None))
        assert _counts(sessions) == (0, 0, 0)

    def test_attempts_get_ordinals(self, sessions: sessionmaker[Session]) -> None:
        assert ingest_payload(sessions, batch([record(0)])).attempt == 1
        second = new_id()
        assert ingest_payload(sessions, batch([record(0)], attempt_id=second)).attempt == 2
        assert ingest_payload(sessions, batch([record(1)], attempt_id=second)).attempt == 2
        assert _counts(sessions)[1] == 3

    def test_subscribers_hear_only_committed_batches(
        self, sessions: sessionmaker[Session], hub: Hub, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        published: list[str] = []
        monkeypatch.setattr(hub, "publish", published.append)
        payload = batch([record(0)])
        with pytest.raises(LayerTableMissing):
            ingest_payload(sessions, batch([record(0)], layers=None))
        assert published == []
        ingest_payload(sessions, payload)
        assert published == [payload["run"]["id"]]

    def test_session_scope_commits_once(self, sessions: sessionmaker[Session]) -> None:
        scope = session_scope(sessions)
        session = next(scope)
        ingest.ingest_batch(session, IngestBatch.model_validate(batch([record(0)])))
        with pytest.raises(StopIteration):
            next(scope)
        assert _counts(sessions) == (1, 1, 2)


def _post(api: TestClient, payload: dict[str, Any]) -> httpx2.Response:
    return api.post("/api/ingest", json=payload)


def _steps(api: TestClient, run_id: str) -> list[dict[str, Any]]:
    response = api.get(f"/api/runs/{run_id}/steps")
    assert response.status_code == 200
    steps: list[dict[str, Any]] = strict_json(response.text)["steps"]
    return steps


class TestIngestHttp:
    def test_accepts_and_round_trips_exactly(self, api: TestClient) -> None:
        run_id = new_id()
        records = [
            record(0),
            record(1, loss="nan", grad_norm="inf", found_inf=True, skipped=True,
                   scale_after=32768.0, duration=1e-300, lr=5e-324),
            record(2, loss="-inf", scale_before=32768.0, scale_after=32768.0, grad_norm=None,
                   lr=None, growth_tracker=None, with_layers=False),
            record(3, loss=0.1 + 0.2, wall_time=1764430004.123456789, scale_before=32768.0,
                   scale_after=32768.0, grad_norm=1.7976931348623157e308),
        ]
        stats = records[1]["layers"]
        stats["amax"] = [0.0, None]
        stats["l2"] = [None, 3.0e-45]
        stats["nan_count"] = [12, 0]
        stats["inf_count"] = [0, 2**40]
        # packed as float64 / int64 bits: the extremes come back as sent
        records[3]["layers"]["amin_nz"] = [5e-324, 1.7976931348623157e308]
        records[3]["layers"]["subnormal_frac"] = [1 / 3, 2.2250738585072014e-308]
        records[3]["layers"]["nan_count"] = [2**63 - 1, 2**53 + 1]
        response = _post(api, batch(records, run_id=run_id))
        assert response.status_code == 200
        assert strict_json(response.text) == {
            "run_id": run_id, "attempt": 1, "accepted": 4, "duplicates": 0}

        steps = _steps(api, run_id)
        assert [s["seq"] for s in steps] == [0, 1, 2, 3]
        assert steps[0]["id"] < steps[1]["id"] < steps[2]["id"] < steps[3]["id"]
        for sent, got in zip(records, steps, strict=True):
            # v4's per-rank and per-optimizer values: null, a v1 client sends none
            expected = {**{k: v for k, v in sent.items() if k != "layers"},
                        "ranks": None, "optimizers": None}
            assert {k: v for k, v in got.items() if k not in ("id", "attempt")} == expected
            assert got["attempt"] == 1

        export = strict_json(api.get(f"/api/runs/{run_id}/export?format=json").text)
        assert export["layers"] == layers_read()
        assert [s["layers"] for s in export["steps"]] == [r["layers"] for r in records]
        assert export["run"]["id"] == run_id

    def test_same_batch_twice(self, api: TestClient) -> None:
        payload = batch([record(0), record(1), record(2)], run_id=new_id())
        assert strict_json(_post(api, payload).text)["accepted"] == 3
        second = _post(api, payload)
        assert second.status_code == 200
        assert strict_json(second.text) == {
            "run_id": payload["run"]["id"], "attempt": 1, "accepted": 0, "duplicates": 3}
        assert len(_steps(api, payload["run"]["id"])) == 3

    def test_one_run_per_uuid_whatever_its_case(self, api: TestClient) -> None:
        run_id, attempt = new_id(), new_id()
        first = _post(api, batch([record(0)], run_id=run_id.upper(), attempt_id=attempt.upper()))
        assert first.json()["run_id"] == run_id
        second = _post(api, batch([record(1)], run_id=run_id, attempt_id=attempt, layers=None))
        assert strict_json(second.text) == {
            "run_id": run_id, "attempt": 1, "accepted": 1, "duplicates": 0}
        assert [s["step"] for s in _steps(api, run_id.upper())] == [0, 1]
        assert api.get(f"/api/runs/{run_id.upper()}").json()["id"] == run_id
        assert [r["id"] for r in api.get("/api/runs").json() if r["id"] in
                (run_id, run_id.upper())] == [run_id]

    def test_final_marks_the_run_finished(self, api: TestClient) -> None:
        run_id = new_id()
        _post(api, batch([record(0)], run_id=run_id))
        assert api.get(f"/api/runs/{run_id}").json()["status"] == "active"
        assert _post(api, batch([], run_id=run_id, layers=None, final=True)).status_code == 200
        assert api.get(f"/api/runs/{run_id}").json()["status"] == "finished"
        # A late replay of an old batch does not reopen it.
        _post(api, batch([record(0)], run_id=run_id))
        assert api.get(f"/api/runs/{run_id}").json()["status"] == "finished"

    def test_one_bad_record_stores_nothing(self, api: TestClient) -> None:
        run_id = new_id()
        bad = record(1)
        bad["layers"]["zero_frac"] = [0.0]
        response = _post(api, batch([record(0), bad], run_id=run_id))
        assert response.status_code == 422
        assert response.json() == {"detail": "records[1].layers.zero_frac has 1 entries, but "
                                             "the run's layer table has 2 layers"}
        assert api.get(f"/api/runs/{run_id}").status_code == 404

    def test_missing_layer_table_is_409(self, api: TestClient) -> None:
        run_id = new_id()
        response = _post(api, batch([record(0, with_layers=False), record(1)], run_id=run_id,
                                    layers=None))
        assert response.status_code == 409
        assert response.json() == {"detail": (
            f"records[1] carries layer statistics, but run '{run_id}' has no layer table yet "
            "and this batch sends none")}
        assert api.get(f"/api/runs/{run_id}").status_code == 404

    def test_different_layer_table_is_409(self, api: TestClient) -> None:
        run_id = new_id()
        assert _post(api, batch([record(0)], run_id=run_id)).status_code == 200
        layers = copy.deepcopy(LAYERS)
        layers[1]["name"] = "fc2.bias"
        response = _post(api, batch([record(1)], run_id=run_id, attempt_id=new_id(),
                                    layers=layers))
        assert response.status_code == 409
        assert response.json() == {"detail": (
            f"the layer table sent for run '{run_id}' differs from the stored one at layer 1: "
            "name is 'fc2.bias', stored 'fc1.bias'")}
        response = _post(api, batch([record(1)], run_id=run_id, layers=LAYERS[:1]))
        assert response.status_code == 409
        assert response.json() == {"detail": (
            f"the layer table sent for run '{run_id}' has 1 layers, the stored one has 2")}
        assert len(_steps(api, run_id)) == 1

    def test_same_layer_table_again_is_fine(self, api: TestClient) -> None:
        run_id = new_id()
        assert _post(api, batch([record(0)], run_id=run_id)).status_code == 200
        response = _post(api, batch([record(0)], run_id=run_id, attempt_id=new_id()))
        assert strict_json(response.text)["attempt"] == 2

    def test_attempt_of_another_run_is_409(self, api: TestClient) -> None:
        first, second, attempt = new_id(), new_id(), new_id()
        assert _post(api, batch([record(0)], run_id=first, attempt_id=attempt)).status_code == 200
        response = _post(api, batch([record(0)], run_id=second, attempt_id=attempt))
        assert response.status_code == 409
        assert response.json() == {
            "detail": f"attempt '{attempt}' belongs to run '{first}', not to run '{second}'"}


WRAPPED_LAYERS = [
    {**layer, "raw_name": f"_orig_mod.module.{layer['name']}"} for layer in LAYERS]
"""The layer table of a compiled DDP model: canonical names, the raw ones beside (issue #13)."""


class TestRawNames:
    def test_round_trip(self, api: TestClient) -> None:
        run_id = new_id()
        assert _post(api, batch([record(0)], run_id=run_id, layers=WRAPPED_LAYERS)
                     ).status_code == 200
        assert strict_json(api.get(f"/api/runs/{run_id}/layers").text) == WRAPPED_LAYERS
        export = strict_json(api.get(f"/api/runs/{run_id}/export?format=json").text)
        assert export["layers"] == WRAPPED_LAYERS
        assert [layer["raw_name"] for layer in export["layers"]] == [
            "_orig_mod.module.fc1.weight", "_orig_mod.module.fc1.bias"]

    def test_absent_means_the_name(self, api: TestClient) -> None:
        """Clients before issue #13 sent no raw name: their `name` was the raw one."""
        run_id = new_id()
        assert _post(api, batch([record(0)], run_id=run_id)).status_code == 200
        assert strict_json(api.get(f"/api/runs/{run_id}/layers").text) == [
            {**layer, "raw_name": layer["name"]} for layer in LAYERS]
        # The same table with the raw names spelled out is the same table, and back.
        spelled = [{**layer, "raw_name": layer["name"]} for layer in LAYERS]
        for layers in (spelled, LAYERS):
            response = _post(api, batch([record(1)], run_id=run_id, attempt_id=new_id(),
                                        layers=layers))
            assert response.status_code == 200, response.text

    @pytest.mark.parametrize("first", ["old", "new"])
    def test_a_run_resumed_across_the_naming_upgrade_is_the_same_run(
            self, api: TestClient, first: str) -> None:
        """A compiled DDP model's run started by a client before canonical names (raw names as
        `name`, no `raw_name`) and resumed by a newer one (canonical `name`, the same raw names
        beside), or the other way round: one table, the one stored first, and no 409."""
        run_id = new_id()
        old = [{k: v for k, v in layer.items() if k != "raw_name"} | {"name": layer["raw_name"]}
               for layer in WRAPPED_LAYERS]
        tables = [old, WRAPPED_LAYERS] if first == "old" else [WRAPPED_LAYERS, old]
        for seq, layers in enumerate(tables):
            response = _post(api, batch([record(seq)], run_id=run_id, attempt_id=new_id(),
                                        layers=layers))
            assert response.status_code == 200, response.text
        stored = strict_json(api.get(f"/api/runs/{run_id}/layers").text)
        assert stored == ([{**layer, "raw_name": layer["name"]} for layer in old]
                          if first == "old" else WRAPPED_LAYERS)
        assert len(_steps(api, run_id)) == 2

    def test_another_canonical_name_is_409(self, api: TestClient) -> None:
        run_id = new_id()
        assert _post(api, batch([record(0)], run_id=run_id, layers=WRAPPED_LAYERS)
                     ).status_code == 200
        renamed = [{**WRAPPED_LAYERS[0], "name": "fc9.weight"}, *WRAPPED_LAYERS[1:]]
        response = _post(api, batch([record(1)], run_id=run_id, attempt_id=new_id(),
                                    layers=renamed))
        assert response.status_code == 409
        assert response.json() == {"detail": (
            f"the layer table sent for run '{run_id}' differs from the stored one at layer 0: "
            "name is 'fc9.weight', stored 'fc1.weight'")}

    def test_another_raw_name_is_409(self, api: TestClient) -> None:
        run_id = new_id()
        assert _post(api, batch([record(0)], run_id=run_id, layers=WRAPPED_LAYERS)
                     ).status_code == 200
        response = _post(api, batch([record(1)], run_id=run_id, attempt_id=new_id()))
        assert response.status_code == 409
        assert response.json() == {"detail": (
            f"the layer table sent for run '{run_id}' differs from the stored one at layer 0: "
            "raw_name is 'fc1.weight', stored '_orig_mod.module.fc1.weight'")}
        assert len(_steps(api, run_id)) == 1

    @pytest.mark.parametrize(("raw_name", "detail"), [
        ("x" * 501, "String should have at most 500 characters"),
        ("a\x00b", "must not contain NUL characters"),
        (7, "Input should be a valid string"),
    ])
    def test_bad_raw_names_are_422(self, api: TestClient, raw_name: object,
                                   detail: str) -> None:
        layers = [{**LAYERS[0], "raw_name": raw_name}, LAYERS[1]]
        response = _post(api, batch([record(0)], run_id=new_id(), layers=layers))
        assert response.status_code == 422
        assert response.json() == {"detail": f"layers[0].raw_name: {detail}"}


def _invalid(mutate: Any) -> dict[str, Any]:
    payload = batch([record(0), record(1)], run_id=new_id())
    mutate(payload)
    return payload


class TestIngestValidation:
    @pytest.mark.parametrize(("mutate", "detail"), [
        (lambda p: p.update(schema_version=9),
         "schema_version: Input should be 1, 2, 3, 4, 5, 6, 7 or 8"),
        (lambda p: p.pop("records"), "records: field required"),
        (lambda p: p["run"].update(id="not-a-uuid"),
         "run.id: String should match pattern "
         "'^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'"),
        (lambda p: p["run"].update(target_format="fp4"),
         "run.target_format: Input should be 'fp16', 'bf16', 'fp8_e4m3fn' or 'fp8_e5m2'"),
        (lambda p: p["records"][1].update(loss="NaN"),
         "records[1].loss: expected a number or one of \"nan\", \"inf\", \"-inf\", "
         "got the string 'NaN'"),
        (lambda p: p["records"][1].update(step="3"),
         "records[1].step: Input should be a valid integer"),
        (lambda p: p["records"][1].update(step=-1),
         "records[1].step: Input should be greater than or equal to 0"),
        (lambda p: p["records"][0].update(skipped="false"),
         "records[0].skipped: Input should be a valid boolean"),
        (lambda p: p["records"][0].update(gradnorm=1.0), "records[0].gradnorm: unknown field"),
        (lambda p: p["records"][1].update(seq=0),
         "records[1].seq 0 appears more than once in this batch"),
        (lambda p: p["records"][1]["layers"].update(amax=[0.5, "inf"]),
         "records[1].layers.amax[1]: is defined over finite elements, so it must be a finite "
         "number or null"),
        (lambda p: p["records"][1]["layers"].update(l2=[-1.0, 0.0]),
         "records[1].layers.l2[0]: Input should be greater than or equal to 0"),
        (lambda p: p["records"][1]["layers"].update(zero_frac=[1.5, 0.0]),
         "records[1].layers.zero_frac[0]: Input should be less than or equal to 1"),
        (lambda p: p["records"][1]["layers"].update(nan_count=[0, -1]),
         "records[1].layers.nan_count[1]: Input should be greater than or equal to 0"),
        (lambda p: p["records"][1]["layers"].update(inf_count=[0, 1.0]),
         "records[1].layers.inf_count[1]: Input should be a valid integer"),
        (lambda p: p["layers"][1].update(index=5),
         "layers[1].index is 5; indices must be 0, 1, 2, … in order"),
        (lambda p: p["run"].update(name="x" * 201),
         "run.name: String should have at most 200 characters"),
        (lambda p: p["run"].update(host="a\x00b"), "run.host: must not contain NUL characters"),
        (lambda p: p["attempt"].update(pid=2**31), "attempt.pid: Input should be less than or "
                                                   "equal to 2147483647"),
    ])
    def test_rejects_with_exact_message(
        self, api: TestClient, mutate: Any, detail: str
    ) -> None:
        payload = _invalid(mutate)
        response = _post(api, payload)
        assert response.status_code == 422
        assert strict_json(response.text) == {"detail": detail}
        assert api.get(f"/api/runs/{payload['run']['id']}").status_code == 404

    def test_rejects_bare_nan_token(self, api: TestClient) -> None:
        body = httpx.Request("POST", "/", json=batch([record(0)], run_id=new_id())).content
        body = body.replace(b'"loss":2.31', b'"loss":NaN')
        response = api.post("/api/ingest", content=body,
                            headers={"content-type": "application/json"})
        assert response.status_code == 422
        assert strict_json(response.text) == {"detail": (
            'records[0].loss: non-finite numbers must be sent as "nan", "inf" or "-inf"')}

    @pytest.mark.parametrize("body", [b"", b"{", b"[]", b"null", b'"x"', b"{}"])
    def test_garbage_is_422(self, api: TestClient, body: bytes) -> None:
        response = api.post("/api/ingest", content=body,
                            headers={"content-type": "application/json"})
        assert response.status_code == 422
        assert isinstance(strict_json(response.text)["detail"], str)

    def test_every_classed_float_round_trips_each_tag(self, api: TestClient) -> None:
        run_id = new_id()
        tags = ["nan", "inf", "-inf"]
        records = [record(i, loss=t, grad_norm=t, scale_before=t, scale_after=t, lr=t,
                          duration=t) for i, t in enumerate(tags)]
        assert _post(api, batch(records, run_id=run_id)).status_code == 200
        for tag, step in zip(tags, _steps(api, run_id), strict=True):
            for name in ("loss", "grad_norm", "scale_before", "scale_after", "lr", "duration"):
                assert step[name] == tag
        assert strict_json(api.get(f"/api/runs/{run_id}").text)["last_scale"] == "-inf"

    def test_layer_stats_helper_shape(self) -> None:
        assert {len(v) for v in layer_stats().values()} == {2}


class TestConcurrentIngest:
    def test_parallel_batches_lose_and_duplicate_nothing(self, api: TestClient) -> None:
        """8 writers at once: new attempts of one run, replays, and a second run (the app
        serves them concurrently, in its threadpool, as one server process does)."""
        from concurrent.futures import ThreadPoolExecutor

        shared, other = new_id(), new_id()
        attempts = [new_id() for _ in range(4)]
        payloads = [batch([record(s) for s in range(10 * k, 10 * k + 10)], run_id=shared,
                          attempt_id=attempts[k % 4]) for k in range(8)]
        payloads += payloads[:4]  # replays race with the originals
        payloads += [batch([record(s) for s in range(5)], run_id=other)]

        def post(payload: dict[str, Any]) -> int:
            return api.post("/api/ingest", json=payload).status_code

        with ThreadPoolExecutor(max_workers=8) as pool:
            statuses = list(pool.map(post, payloads))
        assert statuses == [200] * len(payloads)
        detail = strict_json(api.get(f"/api/runs/{shared}").text)
        assert detail["num_steps"] == 80
        assert sorted(a["ordinal"] for a in detail["attempts"]) == [1, 2, 3, 4]
        assert strict_json(api.get(f"/api/runs/{other}").text)["num_steps"] == 5
