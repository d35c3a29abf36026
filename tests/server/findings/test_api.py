"""GET /api/runs/{id}/findings and the runs list's `top_finding`, through the app (in process) on
each dialect, for runs ingested over HTTP."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from tests.server.findings.payloads import healthy_batch, troubled_batch
from tests.server.wire import new_id, strict_json


def _get(api: TestClient, path: str, status: int = 200) -> Any:
    response = api.get(path)
    assert response.status_code == status, response.text
    return strict_json(response.text)


def _seed(api: TestClient, payload: dict[str, Any]) -> str:
    response = api.post("/api/ingest", json=payload)
    assert response.status_code == 200, response.text
    return str(payload["run"]["id"])


class TestFindings:
    def test_troubled_run(self, api: TestClient) -> None:
        run = _seed(api, troubled_batch(new_id()))
        body = _get(api, f"/api/runs/{run}/findings")
        assert body["run"] == run and body["baseline"] is None
        # Root causes first, each followed by what follows from it: the storm drove the
        # scale down; the NaN loss at step 350 came after the storm ended, a cause of its own.
        assert [(f["kind"], f["severity"], f["cause"]) for f in body["findings"]] == [
            ("overflow_storm", "error", None), ("scale_collapse", "warning", "overflow_storm"),
            ("forward_overflow", "error", None), ("amp_misuse", "warning", None),
            ("calibration_overflow", "info", None), ("scaler_tuning", "info", None)]
        storm = body["findings"][0]
        assert (storm["step_start"], storm["step_end"]) == (200, 250)
        # fc1.bias is first in backward order on every storm step.
        assert storm["layers"] == ["fc1.bias", "fc1.weight"]
        assert storm["evidence"]["skipped_steps"] == 6
        collapse = body["findings"][1]
        assert collapse["recommendation"] == (
            "Follows from “Overflow storm: 6 optimizer steps skipped between steps 200 and "
            "250”: act on that first (its advice); this one should clear with it.")
        misuse = body["findings"][3]
        assert misuse["identity"] == "amp_misuse:clip_before_unscale"
        assert misuse["title"] == "Gradients clipped while still scaled (2 step(s))"
        assert "clip_grad_norm_ on scaled gradients" in misuse["explanation"]
        assert set(storm) == {"kind", "severity", "title", "explanation", "recommendation",
                              "step_start", "step_end", "layers", "evidence", "identity",
                              "cause", "held_since"}
        assert (storm["identity"], storm["held_since"]) == ("overflow_storm", None)
        assert body["step"] == 399
        # tests/server/wire.py's fc1.bias: 12.5 % zeros beside 6.25 % subnormal values (the
        # distribution reaches the floor: its zeros count as flushed) + 3.125 % that flush.
        assert body["worst_loss"] == {"layer": "fc1.bias", "lost_frac": 0.15625,
                                      "structural_zero_frac": 0.0, "steps": 5}

    def test_healthy_run_has_no_warning(self, api: TestClient) -> None:
        run = _seed(api, healthy_batch(new_id()))
        severities = {f["severity"] for f in _get(api, f"/api/runs/{run}/findings")["findings"]}
        assert severities == {"info"}

    def test_baseline_tags_non_finite_evidence(self, api: TestClient) -> None:
        baseline, run = _seed(api, healthy_batch(new_id())), _seed(api, troubled_batch(new_id()))
        body = _get(api, f"/api/runs/{run}/findings?baseline={baseline}")
        assert body["baseline"] == baseline
        found = [f for f in body["findings"] if f["kind"] == "baseline_divergence"]
        assert len(found) == 1
        # The first storm step: grad norm inf here, 0.5 in the baseline.
        assert found[0]["step_start"] == 200
        assert found[0]["evidence"]["value"] == "inf"
        assert found[0]["evidence"]["relative"] == "inf"
        assert found[0]["evidence"]["baseline_value"] == 0.5

    def test_unknown_run_and_baseline(self, api: TestClient) -> None:
        run = _seed(api, healthy_batch(new_id()))
        assert _get(api, "/api/runs/nope/findings", 404) == {"detail": "run 'nope' not found"}
        assert _get(api, f"/api/runs/{run}/findings?baseline=gone", 404) == {
            "detail": "run 'gone' not found"}
        assert _get(api, f"/api/runs/{run}/findings?baseline={run}", 422) == {
            "detail": "baseline: must be another run than the one analysed"}


class TestRunsList:
    def test_most_severe_finding_per_run(self, api: TestClient) -> None:
        troubled, healthy = _seed(api, troubled_batch(new_id())), _seed(
            api, healthy_batch(new_id()))
        listed = {r["id"]: r for r in _get(api, "/api/runs")}
        assert listed[troubled]["top_finding"] == {
            "kind": "overflow_storm", "severity": "error",
            "title": "Overflow storm: 6 optimizer steps skipped between steps 200 and 250"}
        assert listed[healthy]["top_finding"] == {
            "kind": "calibration_overflow", "severity": "info",
            "title": "Benign overflows: 6 calibration skip(s)"}

    def test_run_without_steps_has_none(self, api: TestClient) -> None:
        payload = healthy_batch(new_id())
        payload["records"] = []
        run = _seed(api, payload)
        assert _get(api, f"/api/runs/{run}")["top_finding"] is None


class TestHistogram:
    def test_a_run_without_histograms(self, api: TestClient) -> None:
        run = _seed(api, healthy_batch(new_id()))
        assert _get(api, f"/api/runs/{run}/histogram") == {
            "run": run, "step": None, "scale": None, "steps": [],
            "format": {"name": "fp16", "max": 65504.0, "min_normal": 2.0**-14,
                       "min_subnormal": 2.0**-24},
            "min_exp": None, "max_exp": None, "layers": [], "counts": []}
        assert _get(api, f"/api/runs/{run}/histogram?step=3", 404) == {
            "detail": f"run '{run}' has no exponent histogram at step 3 (it has none yet)"}
        assert _get(api, "/api/runs/nope/histogram", 404) == {"detail": "run 'nope' not found"}
