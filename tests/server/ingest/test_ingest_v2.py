"""Wire v2 on both dialects: round trip, idempotency with children, all-or-nothing, 422/409s,
client accounting, events with non-finite layers and misuse, the activation heatmap."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from ampscope_server.errors import InvalidPayload, ModuleTableMissing
from ampscope_server.store.models import (
    ActivationStat,
    Base,
    Histogram,
    LayerStat,
    MisuseEvent,
    Module,
    Step,
    StepNonfinite,
)
from tests.server.wire import (
    CLIENT,
    MODULES,
    activations,
    batch,
    batch_v2,
    histogram,
    layers_read,
    new_id,
    record,
    record_v2,
    strict_json,
)
from tests.support.ingest import ingest_payload, post_batch

NONFINITE = [{"layer": 1, "kind": "inf"}, {"layer": 0, "kind": "nan"}]  # backward order
MISUSE = [{"kind": "clip_before_unscale", "detail": "clip_grad_norm_ saw scaled gradients"},
          {"kind": "unscale_twice", "detail": "unscale_ called twice\nbefore step"}]
CHILD_TABLES: tuple[type[Base], ...] = (
    Step, LayerStat, ActivationStat, StepNonfinite, MisuseEvent, Histogram, Module)


def _full_records() -> list[dict[str, Any]]:
    return [
        record_v2(0, captured="before_unscale", nonfinite=[], misuse=[],
                  activations=activations(), histogram=histogram()),
        record_v2(1, captured="after_unscale", found_inf=True, skipped=True, loss="nan",
                  scale_after=32768.0, nonfinite=NONFINITE, misuse=MISUSE),
        record_v2(2, with_layers=False, scale_before=32768.0, scale_after=32768.0),
        record_v2(3, scale_before=32768.0, scale_after=32768.0,
                  histogram=histogram(min_exp=-40, max_exp=20)),
    ]


def _counts(factory: sessionmaker[Session]) -> dict[str, int]:
    with factory() as session:
        return {
            model.__tablename__: session.scalar(select(func.count()).select_from(model)) or 0
            for model in CHILD_TABLES
        }


def _get(api: TestClient, path: str, status: int = 200) -> Any:
    response = api.get(path)
    assert response.status_code == status, response.text
    return strict_json(response.text)


class TestRoundTrip:
    def test_export_gives_back_every_v2_field_as_sent(self, api: TestClient) -> None:
        run_id = new_id()
        records = _full_records()
        post_batch(api, batch_v2(records, run_id=run_id, client=CLIENT))
        export = _get(api, f"/api/runs/{run_id}/export")
        assert export["modules"] == MODULES
        assert export["layers"] == layers_read()
        assert [{k: v for k, v in got.items() if k not in ("id", "attempt")}
                for got in export["steps"]] == [
            {**sent, "recheck": None, "swallowed": None, "ranks": None, "optimizers": None}
            for sent in records]  # v3, v4: not sent
        assert export["steps"][0]["activations"]["amax"] == [0.5, "inf", None]
        assert export["steps"][0]["activations"]["amin_nz"] == [1e-30, "nan", 0.0]
        assert export["run"]["attempts"][0]["client"] == CLIENT
        assert _get(api, f"/api/runs/{run_id}")["attempts"][0]["client"] == CLIENT

    def test_v1_batches_still_read_back_with_v2_fields_null(self, api: TestClient) -> None:
        run_id = new_id()
        post_batch(api, batch([record(0)], run_id=run_id))
        export = _get(api, f"/api/runs/{run_id}/export")
        step = export["steps"][0]
        assert {k: step[k] for k in ("captured", "nonfinite", "misuse", "activations",
                                     "histogram")} == dict.fromkeys(
            ("captured", "nonfinite", "misuse", "activations", "histogram"))
        assert export["modules"] == []
        assert export["run"]["attempts"][0]["client"] is None

    def test_module_table_is_sent_once(self, api: TestClient) -> None:
        run_id = new_id()
        post_batch(api, batch_v2([record_v2(0)], run_id=run_id))
        later = record_v2(1, activations=activations())
        result = post_batch(api, batch_v2([later], run_id=run_id, layers=None, modules=None))
        assert result["accepted"] == 1
        assert _get(api, f"/api/runs/{run_id}/export")["steps"][1]["activations"] == (
            activations())


class TestIdempotency:
    def test_duplicate_records_store_none_of_their_children(
        self, sessions: sessionmaker[Session]
    ) -> None:
        payload = batch_v2(_full_records(), client=CLIENT)
        first = ingest_payload(sessions, payload)
        counts = _counts(sessions)
        # layer_stats, activation_stats, histograms: one packed row per step that carries
        # them (layer statistics: 0, 1 and 3; activations: 0; histograms: 0 and 3)
        assert counts == {"steps": 4, "layer_stats": 3, "activation_stats": 1,
                          "step_nonfinite": 2, "misuse_events": 2, "histograms": 2,
                          "modules": 3}
        second = ingest_payload(sessions, payload)
        assert (first.accepted, second.accepted, second.duplicates) == (4, 0, 4)
        assert _counts(sessions) == counts

    def test_a_partly_new_batch_stores_the_children_of_the_new(
        self, sessions: sessionmaker[Session]
    ) -> None:
        records = _full_records()
        ingest_payload(sessions, batch_v2(records[:2]))
        ingest_payload(sessions, batch_v2(records[1:]))
        assert _counts(sessions)["histograms"] == 2
        assert _counts(sessions)["step_nonfinite"] == 2

    def test_a_bad_child_stores_nothing(self, sessions: sessionmaker[Session]) -> None:
        records = _full_records()
        records[3]["histogram"]["counts"][1][0] += 1
        with pytest.raises(InvalidPayload):
            ingest_payload(sessions, batch_v2(records, client=CLIENT))
        assert set(_counts(sessions).values()) == {0}

    def test_activations_without_a_module_table(self, sessions: sessionmaker[Session]) -> None:
        records = [record_v2(0, activations=activations())]
        with pytest.raises(ModuleTableMissing):
            ingest_payload(sessions, batch_v2(records, modules=None))
        assert set(_counts(sessions).values()) == {0}


class TestClientAccounting:
    @pytest.mark.parametrize(("sent", "kept"), [
        ([CLIENT, {**CLIENT, "produced": 20, "acknowledged": 1}],
         {**CLIENT, "produced": 20, "acknowledged": 1}),
        ([{**CLIENT, "produced": 20}, CLIENT], {**CLIENT, "produced": 20}),  # late replay
        ([CLIENT, {**CLIENT, "acknowledged": 9}], {**CLIENT, "acknowledged": 9}),  # close()
        ([CLIENT, None], CLIENT),
    ])
    def test_keeps_the_largest_produced(
        self, api: TestClient, sent: list[dict[str, int] | None], kept: dict[str, int]
    ) -> None:
        run_id = new_id()
        for seq, client in enumerate(sent):
            post_batch(api, batch_v2([record_v2(seq)], run_id=run_id, client=client))
        assert _get(api, f"/api/runs/{run_id}")["attempts"][0]["client"] == kept


def _invalid(mutate: Any) -> dict[str, Any]:
    payload = batch_v2(_full_records(), run_id=new_id())
    mutate(payload)
    return payload


def _rec(payload: dict[str, Any], i: int) -> dict[str, Any]:
    rec: dict[str, Any] = payload["records"][i]
    return rec


class TestValidation:
    @pytest.mark.parametrize(("mutate", "detail"), [
        (lambda p: p.update(schema_version=1),
         "modules: unknown field in schema_version 1; client: unknown field in schema_version 1"
         "; records[0].captured: unknown field in schema_version 1; records[0].nonfinite: "
         "unknown field in schema_version 1; records[0].misuse: unknown field in "
         "schema_version 1; records[0].activations: unknown field in schema_version 1; "
         "records[0].histogram: unknown field in schema_version 1; "
         "records[1].captured: unknown field in schema_version 1; records[1].nonfinite: "
         "unknown field in schema_version 1; records[1].misuse: unknown field in "
         "schema_version 1; records[1].activations: unknown field in schema_version 1; "
         "records[1].histogram: unknown field in schema_version 1; "
         "records[2].captured: unknown field in schema_version 1; records[2].nonfinite: "
         "unknown field in schema_version 1; records[2].misuse: unknown field in "
         "schema_version 1; records[2].activations: unknown field in schema_version 1; "
         "records[2].histogram: unknown field in schema_version 1; "
         "records[3].captured: unknown field in schema_version 1; records[3].nonfinite: "
         "unknown field in schema_version 1; records[3].misuse: unknown field in "
         "schema_version 1; records[3].activations: unknown field in schema_version 1; "
         "records[3].histogram: unknown field in schema_version 1"),
        (lambda p: _rec(p, 0).update(captured="during_unscale"),
         "records[0].captured: Input should be 'before_unscale' or 'after_unscale'"),
        (lambda p: _rec(p, 1)["nonfinite"][0].update(kind="-inf"),
         "records[1].nonfinite[0].kind: Input should be 'nan' or 'inf'"),
        (lambda p: _rec(p, 1)["nonfinite"][0].update(layer=2),
         "records[1].nonfinite[0].layer is 2, but the run's layer table has 2 layers"),
        (lambda p: _rec(p, 1)["nonfinite"].append({"layer": 1, "kind": "nan"}),
         "records[1].nonfinite[2].layer 1 appears more than once"),
        (lambda p: _rec(p, 1)["nonfinite"][0].update(position=0),
         "records[1].nonfinite[0].position: unknown field"),
        (lambda p: _rec(p, 1)["misuse"][0].update(kind="double_backward"),
         "records[1].misuse[0].kind: Input should be 'step_bypassed_scaler', "
         "'clip_before_unscale' or 'unscale_twice'"),
        (lambda p: _rec(p, 1)["misuse"][1].update(detail="x" * 1001),
         "records[1].misuse[1].detail: String should have at most 1000 characters"),
        (lambda p: _rec(p, 0)["activations"].update(zero_frac=[0.0, 0.5]),
         "records[0].activations.zero_frac has 2 entries, but the run's module table has "
         "3 modules"),
        (lambda p: _rec(p, 0)["activations"].update(amax=[0.5, "-inf", None]),
         "records[0].activations.amax[1]: Input should be greater than or equal to 0"),
        (lambda p: _rec(p, 0)["activations"].update(zero_frac=[0.0, "nan", 1.0]),
         "records[0].activations.zero_frac[1]: Input should be a valid number"),
        (lambda p: _rec(p, 0)["activations"].pop("l2"),
         "records[0].activations.l2: field required"),
        (lambda p: _rec(p, 0)["histogram"]["counts"][1].append(0),
         "records[0].histogram.counts[1] has 12 bins; min_exp -4 and max_exp 2 need 11 "
         "(max_exp - min_exp + 5)"),
        (lambda p: _rec(p, 0)["histogram"]["counts"].pop(),
         "records[0].histogram.counts has 1 layers, but the run's layer table has 2 layers"),
        (lambda p: _rec(p, 0)["histogram"]["counts"][0].__setitem__(4, 1),
         "records[0].histogram.counts[0] sums to 129, but layer 0 has numel 128"),
        (lambda p: _rec(p, 0)["histogram"]["counts"][0].__setitem__(4, -1),
         "records[0].histogram.counts[0][4]: Input should be greater than or equal to 0"),
        (lambda p: _rec(p, 0)["histogram"]["counts"][0].__setitem__(4, 1.0),
         "records[0].histogram.counts[0][4]: Input should be a valid integer"),
        (lambda p: _rec(p, 0)["histogram"].update(min_exp=3),
         "records[0].histogram.max_exp 2 is less than min_exp 3"),
        (lambda p: _rec(p, 0)["histogram"].update(min_exp=-2000),
         "records[0].histogram.min_exp: Input should be greater than or equal to -1100"),
        (lambda p: p["modules"][2].update(index=7),
         "modules[2].index is 7; indices must be 0, 1, 2, … in order"),
        (lambda p: p.update(client={**CLIENT, "dropped": -1}),
         "client.dropped: Input should be greater than or equal to 0"),
        (lambda p: p.update(client={"produced": 1}),
         "client.acknowledged: field required; client.spooled: field required; "
         "client.dropped: field required; client.replayed: field required"),
    ])
    def test_rejects_with_exact_message(
        self, api: TestClient, mutate: Any, detail: str
    ) -> None:
        payload = _invalid(mutate)
        assert post_batch(api, payload, 422) == {"detail": detail}
        assert api.get(f"/api/runs/{payload['run']['id']}").status_code == 404

    def test_v1_record_with_one_v2_field(self, api: TestClient) -> None:
        payload = batch([record(0), record(1, histogram=None)], run_id=new_id())
        assert post_batch(api, payload, 422) == {
            "detail": "records[1].histogram: unknown field in schema_version 1"}

    def test_activations_without_module_table_is_409(self, api: TestClient) -> None:
        run_id = new_id()
        payload = batch_v2([record_v2(0), record_v2(1, activations=activations())],
                           run_id=run_id, modules=None)
        assert post_batch(api, payload, 409) == {"detail": (
            f"records[1] carries activation statistics, but run '{run_id}' has no module table "
            "yet and this batch sends none")}
        assert api.get(f"/api/runs/{run_id}").status_code == 404

    @pytest.mark.parametrize(("field", "value", "what"), [
        ("nonfinite", [{"layer": 0, "kind": "nan"}], "nonfinite layers"),
        ("histogram", histogram(), "a histogram"),
    ])
    def test_layer_data_without_layer_table_is_409(
        self, api: TestClient, field: str, value: Any, what: str
    ) -> None:
        run_id = new_id()
        rec = record_v2(0, with_layers=False, **{field: value})
        assert post_batch(api, batch_v2([rec], run_id=run_id, layers=None), 409) == {"detail": (
            f"records[0] carries {what}, but run '{run_id}' has no layer table yet and this "
            "batch sends none")}

    def test_different_module_table_is_409(self, api: TestClient) -> None:
        run_id = new_id()
        post_batch(api, batch_v2([record_v2(0)], run_id=run_id))
        modules = copy.deepcopy(MODULES)
        modules[2]["module_type"] = "Conv2d"
        assert post_batch(api, batch_v2([record_v2(1)], run_id=run_id, modules=modules), 409) == {
            "detail": f"the module table sent for run '{run_id}' differs from the stored one "
                      "at module 2: module_type is 'Conv2d', stored 'Linear'"}
        assert post_batch(api, batch_v2([record_v2(1)], run_id=run_id, modules=MODULES[:1]),
                     409) == {"detail": f"the module table sent for run '{run_id}' has 1 "
                                        "modules, the stored one has 3"}
        assert len(_get(api, f"/api/runs/{run_id}/steps")["steps"]) == 1


class TestEvents:
    def test_skipped_events_list_bad_layers_in_backward_order(self, api: TestClient) -> None:
        run_id = new_id()
        records = _full_records()
        records.append(record_v2(4, found_inf=True, skipped=True, loss=1.5,
                                 scale_before=32768.0, scale_after=16384.0))
        post_batch(api, batch_v2(records, run_id=run_id))
        events = _get(api, f"/api/runs/{run_id}/events")["events"]
        assert events == [
            {"step": 1, "kind": "skipped", "scale_before": 65536.0, "scale_after": 32768.0,
             "loss_finite": False, "layers": [
                 {"index": 1, "name": "fc1.bias", "kind": "inf"},
                 {"index": 0, "name": "fc1.weight", "kind": "nan"}], "recheck": None},
            {"step": 1, "kind": "backoff", "scale_before": 65536.0, "scale_after": 32768.0},
            {"step": 1, "kind": "misuse", "scale_before": 65536.0, "scale_after": 32768.0,
             "misuse_kind": "clip_before_unscale",
             "detail": "clip_grad_norm_ saw scaled gradients"},
            {"step": 1, "kind": "misuse", "scale_before": 65536.0, "scale_after": 32768.0,
             "misuse_kind": "unscale_twice", "detail": "unscale_ called twice\nbefore step"},
            {"step": 4, "kind": "skipped", "scale_before": 32768.0, "scale_after": 16384.0,
             "loss_finite": True, "layers": [], "recheck": None},
            {"step": 4, "kind": "backoff", "scale_before": 32768.0, "scale_after": 16384.0},
        ]

    def test_misuse_on_a_quiet_step_is_an_event(self, api: TestClient) -> None:
        run_id = new_id()
        post_batch(api, batch_v2([record_v2(0, misuse=MISUSE[:1], loss=None)], run_id=run_id))
        assert [e["kind"] for e in _get(api, f"/api/runs/{run_id}/events")["events"]] == [
            "misuse"]


class TestActivationHeatmap:
    def test_serves_the_module_table(self, api: TestClient) -> None:
        run_id = new_id()
        records = [record_v2(0, activations=activations()), record_v2(1),
                   record_v2(2, scale_before=2.0**10, activations=activations())]
        post_batch(api, batch_v2(records, run_id=run_id))
        heat = _get(api, f"/api/runs/{run_id}/layer-stats?source=activation&stat=amax")
        assert heat == {"stat": "amax", "source": "activation", "layers": ["fc1", "act", "fc2"],
                        "steps": [0, 2], "z": [[0.5, 0.5], ["inf", "inf"], [None, None]],
                        "downsampled": False, "rows": None}
        lost = _get(api, f"/api/runs/{run_id}/layer-stats?source=activation&stat=lost_frac"
                         "&start=1")
        assert lost["z"] == [[0.125], [0.5], [1.0]]
        head = _get(api, f"/api/runs/{run_id}/layer-stats?source=activation"
                         "&stat=headroom_bits")
        assert head["z"][0][1] == pytest.approx(15.999 - 10.0 + 1.0, abs=1e-3)
        assert head["z"][1] == ["-inf", "-inf"]
        assert head["z"][2] == [None, None]
        param = _get(api, f"/api/runs/{run_id}/layer-stats?stat=amax")
        assert (param["source"], param["layers"]) == ("param", ["fc1.weight", "fc1.bias"])

    def test_run_without_modules_gives_an_empty_heatmap(self, api: TestClient) -> None:
        run_id = new_id()
        post_batch(api, batch([record(0)], run_id=run_id))
        assert _get(api, f"/api/runs/{run_id}/layer-stats?source=activation&stat=l2") == {
            "stat": "l2", "source": "activation", "layers": [], "steps": [], "z": [],
            "downsampled": False, "rows": None}

    def test_unknown_source_is_422(self, api: TestClient) -> None:
        run_id = new_id()
        post_batch(api, batch([record(0)], run_id=run_id))
        assert _get(api, f"/api/runs/{run_id}/layer-stats?source=grad&stat=l2", 422) == {
            "detail": "query.source: Input should be 'param' or 'activation'"}
