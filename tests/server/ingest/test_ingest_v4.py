"""Wire v4 on both dialects: a distributed run's world size, per-rank losses and non-finite
counts and per-optimizer skip flags and learning rates round trip as sent (NaN/±inf and nulls
included) through /steps and /export; the 422s; duplicates and deletion; `/ranks`."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from ampscope_server.runs import lifecycle
from ampscope_server.runs import reads as runs
from ampscope_server.store.models import StepOptimizers, StepRanks
from tests.server.wire import batch_v2, new_id, record_v2, strict_json
from tests.support.ingest import ingest_payload, post_batch

ADAM = {"skipped": False, "lr": [1e-3, 5e-4]}
SCHEDULED = {"skipped": None, "lr": [None, "inf", 0.0]}
NO_GROUPS = {"skipped": True, "lr": []}


def _v4(seq: int, *, with_layers: bool = True, **overrides: Any) -> dict[str, Any]:
    rec = record_v2(seq, with_layers=with_layers, recheck=None, swallowed=None, ranks=None,
                    optimizers=None)
    rec.update(overrides)
    return rec


def _batch(records: list[dict[str, Any]], *, world_size: int | None = 4,
           **kwargs: Any) -> dict[str, Any]:
    payload = batch_v2(records, **kwargs)
    payload["schema_version"] = 4
    if world_size is not None:
        payload["run"]["world_size"] = world_size
    return payload


def _records() -> list[dict[str, Any]]:
    return [
        _v4(0, ranks={"loss": [2.5, 2.25, 2.0, 1.75], "nonfinite": [0, 0, 0, 0]},
            optimizers=[ADAM]),
        _v4(1, ranks={"loss": [2.5, "nan", None, "-inf"], "nonfinite": [0, 3, None, 0]},
            optimizers=[ADAM, SCHEDULED], found_inf=True, skipped=True, scale_after=32768.0),
        _v4(2, with_layers=False, ranks={"loss": ["inf", 1.0, 1.0, 1.0],
                                         "nonfinite": [None, None, None, None]},
            optimizers=[NO_GROUPS, ADAM]),
        _v4(3),  # a step that carried neither
    ]


def _get(api: TestClient, path: str) -> Any:
    response = api.get(path)
    assert response.status_code == 200, response.text
    return strict_json(response.text)


def _v4_fields(steps: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    return [(step["ranks"], step["optimizers"]) for step in steps]


class TestRoundTrip:
    def test_steps_and_export_give_back_every_v4_field_as_sent(self, api: TestClient) -> None:
        run_id = new_id()
        records = _records()
        post_batch(api, _batch(records, run_id=run_id))
        sent = [(r["ranks"], r["optimizers"]) for r in records]
        assert _v4_fields(_get(api, f"/api/runs/{run_id}/steps")["steps"]) == sent
        export = _get(api, f"/api/runs/{run_id}/export")
        assert [{k: v for k, v in got.items() if k not in ("id", "attempt")}
                for got in export["steps"]] == records
        assert export["run"]["world_size"] == 4

    def test_a_page_of_steps_reads_its_own_rows(self, api: TestClient) -> None:
        run_id = new_id()
        records = _records()
        post_batch(api, _batch(records, run_id=run_id))
        other = new_id()  # another run's rows, ingested between, stay out of the pages
        post_batch(api, _batch(_records(), run_id=other))
        first = _get(api, f"/api/runs/{run_id}/steps?limit=2")
        rest = _get(api, f"/api/runs/{run_id}/steps?after_id={first['last_id']}")
        assert _v4_fields(first["steps"] + rest["steps"]) == [
            (r["ranks"], r["optimizers"]) for r in records]

    def test_world_size_in_the_list_and_the_detail(self, api: TestClient) -> None:
        run_id = new_id()
        post_batch(api, _batch([_v4(0)], run_id=run_id, world_size=8))
        listed = {run["id"]: run for run in _get(api, "/api/runs?limit=500")}
        assert listed[run_id]["world_size"] == 8
        assert _get(api, f"/api/runs/{run_id}")["world_size"] == 8

    @pytest.mark.parametrize("world_size", [None, 1])
    def test_world_size_is_1_when_absent_or_null(self, api: TestClient,
                                                 world_size: int | None) -> None:
        run_id = new_id()
        payload = _batch([_v4(0)], run_id=run_id, world_size=None)
        if world_size is None:
            payload["run"]["world_size"] = None
        post_batch(api, payload)
        assert _get(api, f"/api/runs/{run_id}")["world_size"] == 1

    def test_a_v3_client_reads_back_world_size_1_and_null_v4_fields(
        self, api: TestClient
    ) -> None:
        run_id = new_id()
        payload = batch_v2([record_v2(0, recheck=None, swallowed=None)], run_id=run_id)
        payload["schema_version"] = 3
        post_batch(api, payload)
        assert _get(api, f"/api/runs/{run_id}")["world_size"] == 1
        step = _get(api, f"/api/runs/{run_id}/steps")["steps"][0]
        assert (step["ranks"], step["optimizers"]) == (None, None)
        assert _get(api, f"/api/runs/{run_id}/ranks") == {
            "world_size": 1, "first_nonfinite": None}

    def test_the_first_world_size_is_kept(self, api: TestClient) -> None:
        run_id = new_id()
        post_batch(api, _batch([_v4(0)], run_id=run_id, world_size=2))
        later = _batch([_v4(1, ranks={"loss": [1.0] * 3, "nonfinite": [0] * 3})],
                       run_id=run_id, world_size=3, layers=None)
        post_batch(api, later)
        assert _get(api, f"/api/runs/{run_id}")["world_size"] == 2
        # The step's arrays fit its own batch's world size: stored and given back as sent.
        steps = _get(api, f"/api/runs/{run_id}/steps")["steps"]
        assert steps[1]["ranks"] == {"loss": [1.0] * 3, "nonfinite": [0] * 3}


class TestRanksRoute:
    def test_the_first_step_where_a_rank_went_nonfinite(self, api: TestClient) -> None:
        run_id = new_id()
        post_batch(api, _batch(_records(), run_id=run_id))
        assert _get(api, f"/api/runs/{run_id}/ranks") == {
            "world_size": 4,
            "first_nonfinite": {"step": 1, "ranks": [1, 3], "loss": [2.5, "nan", None, "-inf"],
                                "nonfinite": [0, 3, None, 0]}}

    def test_by_step_not_by_ingest_order(self, api: TestClient) -> None:
        run_id = new_id()
        late = _v4(0, step=900, ranks={"loss": ["nan", 1.0], "nonfinite": [0, 0]})
        post_batch(api, _batch([late], run_id=run_id, world_size=2))
        # A resumed attempt re-sends an earlier step, where only a gradient went non-finite.
        early = _v4(0, step=40, ranks={"loss": [1.0, 1.0], "nonfinite": [0, 2]})
        post_batch(api, _batch([early], run_id=run_id, world_size=2, attempt_id=new_id(),
                          layers=None))
        assert _get(api, f"/api/runs/{run_id}/ranks")["first_nonfinite"] == {
            "step": 40, "ranks": [1], "loss": [1.0, 1.0], "nonfinite": [0, 2]}

    def test_finite_ranks_have_none(self, api: TestClient) -> None:
        run_id = new_id()
        post_batch(api, _batch([_records()[0], _records()[3]], run_id=run_id))
        assert _get(api, f"/api/runs/{run_id}/ranks") == {
            "world_size": 4, "first_nonfinite": None}

    def test_unknown_run_is_404(self, api: TestClient) -> None:
        run_id = new_id()
        response = api.get(f"/api/runs/{run_id}/ranks")
        assert response.status_code == 404
        assert response.json() == {"detail": f"run '{run_id}' not found"}


def _invalid(mutate: Any, version: int = 4) -> dict[str, Any]:
    payload = _batch(_records(), run_id=new_id())
    payload["schema_version"] = version
    mutate(payload)
    return payload


def _v3_with(field: str, value: Any) -> Any:
    def mutate(payload: dict[str, Any]) -> None:
        for rec in payload["records"]:
            rec.pop("ranks")
            rec.pop("optimizers")
        payload["run"].pop("world_size")
        if field == "world_size":
            payload["run"]["world_size"] = value
        else:
            payload["records"][3][field] = value
    return mutate


class TestValidation:
    @pytest.mark.parametrize(("mutate", "version", "message"), [
        (_v3_with("ranks", {"loss": [1.0], "nonfinite": [0]}), 3,
         "records[3].ranks: unknown field in schema_version 3"),
        (_v3_with("optimizers", None), 3,
         "records[3].optimizers: unknown field in schema_version 3"),
        (_v3_with("world_size", 2), 3, "run.world_size: unknown field in schema_version 3"),
        (lambda p: p["run"].update(target_format_reason="given"), 4,
         "run.target_format_reason: unknown field in schema_version 4"),
        (lambda p: p["run"].update(target_format_reason="given"), 5,
         "run.target_format_reason: unknown field in schema_version 5"),
        (lambda p: p["run"].update(target_format_reason="x" * 201), 6,
         "run.target_format_reason: String should have at most 200 characters"),
        (lambda p: None, 2,
         "run.world_size: unknown field in schema_version 2; records[0].recheck: unknown field "
         "in schema_version 2; records[0].swallowed: unknown field in schema_version 2; "
         "records[0].ranks: unknown field in schema_version 2; records[0].optimizers: unknown "
         "field in schema_version 2; records[1].recheck"),
        (lambda p: p["records"][3].update(ranks={"loss": [1.0] * 3, "nonfinite": [0] * 4}), 4,
         "records[3].ranks.loss has 3 values for a world_size of 4"),
        (lambda p: p["records"][0].update(ranks={"loss": [1.0] * 4, "nonfinite": [0] * 5}), 4,
         "records[0].ranks.nonfinite has 5 values for a world_size of 4"),
        (lambda p: p["run"].update(world_size=2), 4,
         "records[0].ranks.loss has 4 values for a world_size of 2"),
        (lambda p: p["run"].update(world_size=0), 4,
         "run.world_size: Input should be greater than or equal to 1"),
        (lambda p: p["run"].update(world_size=65537), 4,
         "run.world_size: Input should be less than or equal to 65536"),
        (lambda p: p["run"].update(world_size="4"), 4,
         "run.world_size: Input should be a valid integer"),
        (lambda p: p["records"][0]["ranks"].update(nonfinite=[0, -1, 0, 0]), 4,
         "records[0].ranks.nonfinite[1]: Input should be greater than or equal to 0"),
        (lambda p: p["records"][0]["ranks"].update(loss=[1.0, "NaN", 1.0, 1.0]), 4,
         "records[0].ranks.loss[1]: expected a number or one of \"nan\", \"inf\", \"-inf\", "
         "got the string 'NaN'"),
        (lambda p: p["records"][0]["ranks"].pop("nonfinite"), 4,
         "records[0].ranks.nonfinite: field required"),
        (lambda p: p["records"][0].update(optimizers=[]), 4,
         "records[0].optimizers: List should have at least 1 item after validation"),
        (lambda p: p["records"][0].update(optimizers=[ADAM] * 65), 4,
         "records[0].optimizers: List should have at most 64 items after validation"),
        (lambda p: p["records"][0].update(optimizers=[{"skipped": None, "lr": [0.1] * 1025}]), 4,
         "records[0].optimizers[0].lr: List should have at most 1024 items after validation"),
        (lambda p: p["records"][0].update(optimizers=[{"skipped": "no", "lr": []}]), 4,
         "records[0].optimizers[0].skipped: Input should be a valid boolean"),
        (lambda p: p["records"][0].update(optimizers=[{"skipped": None}]), 4,
         "records[0].optimizers[0].lr: field required"),
        (lambda p: p["records"][0].update(optimizers=[{**ADAM, "momentum": 0.9}]), 4,
         "records[0].optimizers[0].momentum: unknown field"),
    ])
    def test_refused_with_422(self, api: TestClient, mutate: Any, version: int,
                              message: str) -> None:
        detail = post_batch(api, _invalid(mutate, version), status=422)["detail"]
        assert message in detail, detail

    def test_the_length_message_is_the_whole_detail(self, api: TestClient) -> None:
        payload = _invalid(lambda p: p["records"][3].update(
            ranks={"loss": [1.0, 2.0, 3.0], "nonfinite": [0, 0, 0]}))
        assert post_batch(api, payload, status=422) == {
            "detail": "records[3].ranks.loss has 3 values for a world_size of 4"}


def _counts(factory: sessionmaker[Session]) -> tuple[int, int]:
    with factory() as session:
        return (session.scalar(select(func.count()).select_from(StepRanks)) or 0,
                session.scalar(select(func.count()).select_from(StepOptimizers)) or 0)


class TestStorage:
    def test_one_row_per_step_and_none_for_duplicates(
        self, sessions: sessionmaker[Session]
    ) -> None:
        payload = _batch(_records(), run_id=new_id())
        first = ingest_payload(sessions, payload)
        assert _counts(sessions) == (3, 3)
        second = ingest_payload(sessions, copy.deepcopy(payload))
        assert (first.accepted, second.duplicates) == (4, 4)
        assert _counts(sessions) == (3, 3)

    def test_64_ranks_are_one_row_a_step(self, sessions: sessionmaker[Session]) -> None:
        ranks = {"loss": [1.0] * 63 + ["nan"], "nonfinite": list(range(64))}
        ingest_payload(sessions, _batch([_v4(i, ranks=ranks) for i in range(3)], run_id=new_id(),
                                 world_size=64))
        assert _counts(sessions) == (3, 0)
        with sessions() as session:
            # every rank but rank 0 (loss finite, count 0): the last by its loss too
            assert list(session.scalars(select(StepRanks.nonfinite_ranks))) == [63] * 3

    def test_a_bad_record_stores_no_v4_row(self, sessions: sessionmaker[Session]) -> None:
        records = _records()
        records[3]["swallowed"] = [0.5]  # refused against the layer table, after parsing
        with pytest.raises(Exception, match="swallowed has 1 entries"):
            ingest_payload(sessions, _batch(records, run_id=new_id()))
        assert _counts(sessions) == (0, 0)

    def test_deleting_the_run_deletes_its_rows(self, sessions: sessionmaker[Session]) -> None:
        kept, deleted = new_id(), new_id()
        ingest_payload(sessions, _batch(_records(), run_id=kept))
        ingest_payload(sessions, _batch(_records(), run_id=deleted))
        assert _counts(sessions) == (6, 6)
        with sessions() as session, session.begin():
            result = lifecycle.delete_run(session, runs.load_run(session, deleted))
        assert result.steps == 4
        assert _counts(sessions) == (3, 3)
        with sessions() as session:
            assert runs.steps_page(session, runs.load_run(session, kept), 0, 10).steps[1] \
                .ranks is not None
