"""Read API for runs: list, detail, layers, steps paging, export, 404s, derived status."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from ampscope_server.findings.formats import FORMATS
from ampscope_server.runs import reads as runs
from ampscope_server.runs import summary_cache
from ampscope_server.runs.listing import crash_cutoff, derive_status
from ampscope_server.runs.schemas import RunStatus
from tests.server.wire import (
    batch,
    layer_stats,
    layers_read,
    new_id,
    record,
    strict_json,
)
from tests.support.ingest import ingest_payload


def _get(api: TestClient, path: str, status: int = 200) -> Any:
    response = api.get(path)
    assert response.status_code == status, response.text
    return strict_json(response.text)


def _seed(api: TestClient, run_id: str, n: int = 3, **run: Any) -> None:
    records = [record(i, skipped=(i == 1), found_inf=(i == 1),
                      scale_after=32768.0 if i >= 1 else 65536.0,
                      scale_before=65536.0 if i <= 1 else 32768.0) for i in range(n)]
    response = api.post("/api/ingest", json=batch(records, run_id=run_id, **run))
    assert response.status_code == 200, response.text


class TestRunsList:
    def test_lists_newest_first_with_summaries(self, api: TestClient) -> None:
        first, second = new_id(), new_id()
        _seed(api, first, name="first")
        _seed(api, second, n=1, name="second", tags=["x"])
        listed = {r["id"]: r for r in _get(api, "/api/runs")}
        ids = [r["id"] for r in _get(api, "/api/runs")]
        assert ids.index(second) < ids.index(first)
        summary = listed[first]
        assert set(summary) == {"id", "project", "name", "tags", "status", "created_at",
                                "updated_at", "num_steps", "last_step", "last_id",
                                "last_scale", "skipped_steps", "num_layers", "skip_rate",
                                "worst_underflow", "worst_headroom", "top_finding",
                                "summary_step", "world_size", "config", "notes"}
        assert {k: summary[k] for k in ("name", "tags", "status", "num_steps", "last_step",
                                       "last_scale", "skipped_steps", "num_layers",
                                       "world_size")} == {
            "name": "first", "tags": ["amp", "cpu"], "status": "active", "num_steps": 3,
            "last_step": 2, "last_scale": 32768.0, "skipped_steps": 1, "num_layers": 2,
            "world_size": 1}
        assert listed[second]["tags"] == ["x"]

    def test_run_without_steps(self, api: TestClient) -> None:
        run_id = new_id()
        assert api.post("/api/ingest", json=batch([], run_id=run_id)).status_code == 200
        detail = _get(api, f"/api/runs/{run_id}")
        assert (detail["num_steps"], detail["last_step"], detail["last_scale"],
                detail["skipped_steps"], detail["num_layers"]) == (0, None, None, 0, 2)


class TestRunDetail:
    def test_detail(self, api: TestClient) -> None:
        run_id = new_id()
        _seed(api, run_id, host="gpu-7", rank=3, target_format="bf16")
        detail = _get(api, f"/api/runs/{run_id}")
        assert detail["config"] == {"lr": 0.001, "nested": {"a": [1, 2]}}
        assert (detail["host"], detail["rank"], detail["target_format"]) == ("gpu-7", 3, "bf16")
        # torch.finfo(torch.bfloat16)'s max and tiny, and its smallest subnormal, 2^-133: the
        # pages compute the live heatmap's headroom from these, holding no copy of their own.
        assert detail["target_format_limits"] == {
            "name": "bf16", "max": 3.3895313892515355e38, "min_normal": 2.0**-126,
            "min_subnormal": 2.0**-133}
        assert len(detail["attempts"]) == 1
        attempt = detail["attempts"][0]
        assert (attempt["ordinal"], attempt["pid"], attempt["started_at"]) == (1, 1234,
                                                                              1764430000.5)

    def test_layers(self, api: TestClient) -> None:
        run_id = new_id()
        _seed(api, run_id)
        assert _get(api, f"/api/runs/{run_id}/layers") == layers_read()

    @pytest.mark.parametrize("suffix", [
        "", "/layers", "/steps", "/export", "/series/loss", "/events",
        "/layer-stats?stat=amax",
    ])
    def test_unknown_run_is_404(self, api: TestClient, suffix: str) -> None:
        run_id = new_id()
        assert _get(api, f"/api/runs/{run_id}{suffix}", 404) == {
            "detail": f"run '{run_id}' not found"}


class TestSteps:
    def test_pages_by_after_id(self, api: TestClient) -> None:
        run_id = new_id()
        _seed(api, run_id, n=5)
        page = _get(api, f"/api/runs/{run_id}/steps?limit=2")
        assert [s["seq"] for s in page["steps"]] == [0, 1]
        assert page["last_id"] == page["steps"][-1]["id"]
        rest = _get(api, f"/api/runs/{run_id}/steps?after_id={page['last_id']}&limit=10")
        assert [s["seq"] for s in rest["steps"]] == [2, 3, 4]
        empty = _get(api, f"/api/runs/{run_id}/steps?after_id={rest['last_id']}")
        assert empty == {"steps": [], "last_id": rest["last_id"]}

    def test_steps_of_other_runs_are_not_mixed_in(self, api: TestClient) -> None:
        mine, other = new_id(), new_id()
        _seed(api, mine, n=2)
        _seed(api, other, n=2)
        assert {s["seq"] for s in _get(api, f"/api/runs/{mine}/steps")["steps"]} == {0, 1}
        assert len(_get(api, f"/api/runs/{mine}/steps")["steps"]) == 2

    @pytest.mark.parametrize(("query", "detail"), [
        ("limit=0", "query.limit: Input should be greater than or equal to 1"),
        ("after_id=-1", "query.after_id: Input should be greater than or equal to 0"),
        ("limit=abc", "query.limit: Input should be a valid integer, unable to parse string "
                      "as an integer"),
    ])
    def test_bad_query_is_422(self, api: TestClient, query: str, detail: str) -> None:
        run_id = new_id()
        _seed(api, run_id, n=1)
        assert _get(api, f"/api/runs/{run_id}/steps?{query}", 422) == {"detail": detail}


class TestExport:
    def test_export_has_everything(self, api: TestClient) -> None:
        run_id = new_id()
        records = [record(0), record(1, with_layers=False), record(2)]
        assert api.post("/api/ingest", json=batch(records, run_id=run_id)).status_code == 200
        export = _get(api, f"/api/runs/{run_id}/export?format=json")
        assert set(export) == {"run", "layers", "modules", "steps"}
        assert export["modules"] == []
        assert export["run"]["num_steps"] == 3
        assert export["layers"] == layers_read()
        assert [s["layers"] for s in export["steps"]] == [r["layers"] for r in records]
        assert [s["seq"] for s in export["steps"]] == [0, 1, 2]

    def test_unknown_format_is_422(self, api: TestClient) -> None:
        run_id = new_id()
        _seed(api, run_id, n=1)
        assert _get(api, f"/api/runs/{run_id}/export?format=xml", 422) == {
            "detail": "query.format: Input should be 'json', 'csv', 'csv_wide' or 'html'"}


class TestStatus:
    def test_derive_status(self) -> None:
        assert derive_status("active", 100.0, crash_cutoff(150.0, 60.0)) is RunStatus.ACTIVE
        assert derive_status("active", 100.0, crash_cutoff(160.0, 60.0)) is RunStatus.ACTIVE
        assert derive_status("active", 100.0, crash_cutoff(161.0, 60.0)) is RunStatus.CRASHED
        assert derive_status("finished", 100.0, 1e9) is RunStatus.FINISHED

    def test_silent_active_run_reads_as_crashed(self, sessions: sessionmaker[Session]) -> None:
        payload = batch([record(0)], run_id=new_id())
        ingest_payload(sessions, payload, now=1000.0)
        with sessions() as session:
            run = runs.load_run(session, payload["run"]["id"])
            assert runs.summaries(session, [run], 300.0, now=1200.0)[0].status == "active"
            assert runs.summaries(session, [run], 300.0, now=1301.0)[0].status == "crashed"


class TestWorstLayers:
    """The runs page's skip rate and worst layers, from the run's last layer-stat step."""

    FP16 = FORMATS["fp16"]

    def test_pure_worst_layers(self) -> None:
        layers = [("a", 0.0, 0.0, 1.0), ("b", 0.25, 0.25, 0.0), ("c", 0.5, 0.0, None),
                  ("d", 0.0, 0.0, 4.0)]
        underflow, headroom = summary_cache.worst_layers(layers, 2.0**10, self.FP16)
        assert underflow == ("b", 0.5)  # a tie goes to the first in model order
        assert headroom == ("d", math.log2(65504.0) - 2 - 10)

    def test_pure_worst_layers_without_a_known_amax(self) -> None:
        assert summary_cache.worst_layers([("a", 0.0, 0.0, None)], 1.0, self.FP16) == (
            ("a", 0.0), None)
        assert summary_cache.worst_layers([], 1.0, self.FP16) == (None, None)

    def test_summary_fields(self, api: TestClient) -> None:
        run_id = new_id()
        _seed(api, run_id)  # 3 steps, step 1 skipped; last layer stats at seq 2, scale 2^15
        tail = record(3, with_layers=False, scale_before=1.0, scale_after=1.0)
        assert api.post("/api/ingest", json=batch([tail], run_id=run_id)).status_code == 200
        summary = _get(api, f"/api/runs/{run_id}")
        assert summary["skip_rate"] == 0.25
        # seq 2's layer_stats(3.0): lost_frac [0, 0.125 + 0.03125], amax [1.5, 0.25].
        assert summary["worst_underflow"] == {"layer": "fc1.bias", "value": 0.15625}
        assert summary["worst_headroom"] == {
            "layer": "fc1.weight", "value": math.log2(65504.0) - math.log2(1.5) - 15}

    def test_run_without_layer_stats_or_steps(self, api: TestClient) -> None:
        scalars_only, empty = new_id(), new_id()
        records = [record(0, with_layers=False)]
        assert api.post("/api/ingest", json=batch(records, run_id=scalars_only)).status_code == 200
        assert api.post("/api/ingest", json=batch([], run_id=empty)).status_code == 200
        listed = {r["id"]: r for r in _get(api, "/api/runs")}
        assert [listed[scalars_only][k] for k in ("skip_rate", "worst_underflow",
                                                  "worst_headroom")] == [0.0, None, None]
        assert [listed[empty][k] for k in ("skip_rate", "worst_underflow",
                                           "worst_headroom")] == [None, None, None]

    def test_all_zero_gradients_have_infinite_headroom(self, api: TestClient) -> None:
        run_id = new_id()
        stats = layer_stats()
        stats["amax"] = [0.0, 0.0]
        response = api.post("/api/ingest", json=batch([record(0, layers=stats)], run_id=run_id))
        assert response.status_code == 200, response.text
        assert _get(api, f"/api/runs/{run_id}")["worst_headroom"] == {
            "layer": "fc1.weight", "value": "inf"}

    def test_nan_layers_have_no_headroom_not_an_infinite_one(self, api: TestClient) -> None:
        """A diverged run's layers: NaN, no finite non-zero element (amax 0 over the finite
        ones). Not "all zero" (the runs list showed "∞ (all zero)" for a NaN run)."""
        run_id = new_id()
        stats = layer_stats()
        stats["amax"] = [0.0, 0.0]
        stats["nan_count"] = [100, 0]
        stats["inf_count"] = [0, 16]
        response = api.post("/api/ingest", json=batch([record(0, layers=stats)], run_id=run_id))
        assert response.status_code == 200, response.text
        assert _get(api, f"/api/runs/{run_id}")["worst_headroom"] is None
