"""The run page's bounded reads over HTTP (the app in process): events by page and from a step on
(the live path), the skip rate as bucket maxima with the window's tail."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from tests.server.wire import batch, batch_v2, new_id, record, record_v2, strict_json


def _get(api: TestClient, path: str) -> Any:
    response = api.get(path)
    assert response.status_code == 200, response.text
    return strict_json(response.text)


def _seed(api: TestClient, steps: int, skipped: set[int]) -> str:
    run_id = new_id()
    records = [record(i, with_layers=False, skipped=i in skipped, found_inf=i in skipped,
                      scale_after=32768.0 if i in skipped else 65536.0,
                      scale_before=65536.0) for i in range(steps)]
    response = api.post("/api/ingest", json=batch(records, run_id=run_id))
    assert response.status_code == 200, response.text
    return run_id


class TestEventPages:
    def test_pages_split_between_steps_and_cover_every_event(self, api: TestClient) -> None:
        run_id = _seed(api, 40, skipped={3, 9, 17, 30})
        first = _get(api, f"/api/runs/{run_id}/events?limit=3")
        # Each skip is two events (skipped, backoff) of one event step; 3 event steps a page.
        assert [(e["step"], e["kind"]) for e in first["events"]] == [
            (3, "skipped"), (3, "backoff"), (9, "skipped"), (9, "backoff"), (17, "skipped"),
            (17, "backoff")]
        assert first["next_start"] == 30
        rest = _get(api, f"/api/runs/{run_id}/events?limit=3&start=30")
        assert [e["step"] for e in rest["events"]] == [30, 30]
        assert rest["next_start"] is None
        whole = _get(api, f"/api/runs/{run_id}/events")
        assert whole["events"] == first["events"] + rest["events"]

    def test_the_live_path_reads_from_a_step_on(self, api: TestClient) -> None:
        run_id = _seed(api, 10, skipped={2})
        more = [record(i, with_layers=False, skipped=i == 12, found_inf=i == 12,
                       scale_after=32768.0 if i == 12 else 65536.0) for i in range(10, 14)]
        assert api.post("/api/ingest", json=batch(more, run_id=run_id)).status_code == 200
        since = _get(api, f"/api/runs/{run_id}/events?start=3")
        assert [(e["step"], e["kind"]) for e in since["events"]] == [
            (12, "skipped"), (12, "backoff")]


class TestWithoutAScaler:
    def test_a_nonfinite_step_that_was_applied_is_an_event_with_its_layers(
            self, api: TestClient) -> None:
        """A BF16 run (no scaler): null scales, found_inf steps not skipped. Each is a
        `nonfinite` event with its layers in backward order; the run has no skipped step."""
        run_id = new_id()
        bad = [{"layer": 1, "kind": "inf"}, {"layer": 0, "kind": "nan"}]
        records = [record_v2(i, with_layers=False, scale_before=None, scale_after=None,
                             growth_tracker=None, skipped=False, found_inf=i in (2, 5),
                             loss="nan" if i == 5 else 1.0,
                             nonfinite=bad if i in (2, 5) else None) for i in range(8)]
        response = api.post("/api/ingest", json=batch_v2(records, run_id=run_id))
        assert response.status_code == 200, response.text
        layers = [{"index": 1, "kind": "inf", "name": "fc1.bias"},
                  {"index": 0, "kind": "nan", "name": "fc1.weight"}]
        common = {"kind": "nonfinite", "scale_before": None, "scale_after": None,
                  "layers": layers}
        body = _get(api, f"/api/runs/{run_id}/events")
        assert body == {"events": [{"step": 2, "loss_finite": True, **common},
                                   {"step": 5, "loss_finite": False, **common}],
                        "next_start": None}
        page = _get(api, f"/api/runs/{run_id}/events?limit=1")  # paged by event step
        assert [e["step"] for e in page["events"]] == [2] and page["next_start"] == 5
        assert _get(api, f"/api/runs/{run_id}")["skipped_steps"] == 0


class TestSkipRate:
    def test_rolling_rate_with_its_tail(self, api: TestClient) -> None:
        run_id = _seed(api, 6, skipped={1, 4})
        body = _get(api, f"/api/runs/{run_id}/skip-rate?window=2")
        assert body == {
            "window": 2, "downsampled": False,
            "points": [{"step": 0, "rate": 0.0}, {"step": 1, "rate": 0.5},
                       {"step": 2, "rate": 0.5}, {"step": 3, "rate": 0.0},
                       {"step": 4, "rate": 0.5}, {"step": 5, "rate": 0.5}],
            "tail": [[4, True], [5, False]],
        }

    def test_bucket_maxima_when_downsampled(self, api: TestClient) -> None:
        run_id = _seed(api, 100, skipped={50, 51, 52})
        body = _get(api, f"/api/runs/{run_id}/skip-rate?window=4&max_points=4")
        assert body["downsampled"] is True
        assert body["points"] == [{"step": 0, "rate": 0.0}, {"step": 25, "rate": 0.0},
                                  {"step": 50, "rate": 0.75}, {"step": 75, "rate": 0.0}]

    def test_a_run_without_steps(self, api: TestClient) -> None:
        run_id = new_id()
        assert api.post("/api/ingest", json=batch([], run_id=run_id)).status_code == 200
        assert _get(api, f"/api/runs/{run_id}/skip-rate") == {
            "window": 100, "downsampled": False, "points": [], "tail": []}
