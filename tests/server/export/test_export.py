"""Exports: the long-format CSV stream, the offline HTML report, and their pure helpers."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import math
import re
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from ampscope_server.export import report as export_report
from ampscope_server.export import report_html as export_report_html
from ampscope_server.export import streams as export_streams
from ampscope_server.store.models import Run
from tests.server.wire import (
    LAYERS,
    activations,
    batch,
    batch_v2,
    layer_stats,
    new_id,
    record_v2,
    strict_json,
)
from tests.support.ingest import ingest_payload

HOSTILE = '<img src=x onerror=alert(1)></script><!--'
ODD_LAYER = 'enc,"q" proj'
STAT_NAMES = ("amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac", "nan_count",
              "inf_count", "l2")
SCALARS = ("loss", "scale_before", "scale_after", "growth_tracker", "found_inf", "skipped",
           "grad_norm", "lr", "duration")
TAGS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _layers() -> list[dict[str, Any]]:
    layers = [dict(layer) for layer in LAYERS]
    layers[0]["name"] = ODD_LAYER
    return layers


def _records() -> list[dict[str, Any]]:
    odd = layer_stats(2.0)
    odd["amax"] = [1e-300, None]
    return [
        record_v2(0, loss="nan", grad_norm="inf", found_inf=True, skipped=True),
        record_v2(1, with_layers=False, loss="-inf", lr=None, growth_tracker=None),
        record_v2(2, layers=odd, activations=activations(), scale_before=32768.0),
    ]


def _seed(api: TestClient, run_id: str, **run: Any) -> dict[str, Any]:
    payload = batch_v2(_records(), run_id=run_id, layers=_layers(), **run)
    response = api.post("/api/ingest", json=payload)
    assert response.status_code == 200, response.text
    return payload


def _norm(value: Any) -> Any:
    """A stored or CSV value, comparable: tags → floats, NaN → "NaN", bools → 1/0, "" → None."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        value = TAGS[value] if value in TAGS else float(value)
    value = float(value)
    return "NaN" if math.isnan(value) else value


def _expected(payload: dict[str, Any]) -> list[list[Any]]:
    """The CSV rows the contract promises for a one-attempt batch, built from what was sent."""
    layers = [layer["name"] for layer in payload["layers"]]
    modules = [module["name"] for module in payload["modules"]]
    rows: list[list[Any]] = []
    for rec in payload["records"]:
        head = [rec["step"], 1, rec["seq"], rec["wall_time"]]
        rows += [[*head, "step", None, "", name, _norm(rec[name])] for name in SCALARS]
        for source, names, stats in (("param", layers, rec["layers"]),
                                     ("activation", modules, rec.get("activations"))):
            if stats is None:
                continue
            for index, name in enumerate(names):
                rows += [[*head, source, index, name, stat, _norm(stats[stat][index])]
                         for stat in STAT_NAMES]
    return rows


def _parse(text: str) -> tuple[list[str], list[list[Any]]]:
    header, *rows = csv.reader(io.StringIO(text))
    return header, [
        [int(r[0]), int(r[1]), int(r[2]), float(r[3]), r[4], None if r[5] == "" else int(r[5]),
         r[6], r[7], _norm(r[8])]
        for r in rows
    ]


class TestCsv:
    def test_equals_the_stored_data(self, api: TestClient) -> None:
        run_id = new_id()
        payload = _seed(api, run_id)
        response = api.get(f"/api/runs/{run_id}/export?format=csv")
        assert response.status_code == 200, response.text
        header, rows = _parse(response.text)
        assert header == ["step", "attempt", "seq", "wall_time", "source", "layer_index",
                          "layer", "stat", "value"]
        assert rows == _expected(payload)
        # The exact text of the special values and of a quoted layer name.
        lines = response.text.splitlines()
        assert "0,1,0,1764430001.25,step,,,loss,nan" in lines
        assert "1,1,1,1764430002.25,step,,,loss,-inf" in lines
        assert "0,1,0,1764430001.25,step,,,grad_norm,inf" in lines
        assert "0,1,0,1764430001.25,step,,,duration," in lines
        assert "0,1,0,1764430001.25,step,,,skipped,1" in lines
        assert '2,1,2,1764430003.25,param,0,"enc,""q"" proj",amax,1e-300' in lines
        assert "2,1,2,1764430003.25,activation,1,act,amin_nz,nan" in lines

    def test_download_headers(self, api: TestClient) -> None:
        run_id = new_id()
        _seed(api, run_id, name='../we "ird"\\ name;\u00e9')
        response = api.get(f"/api/runs/{run_id}/export?format=csv")
        assert response.headers["content-type"] == "text/csv; charset=utf-8"
        assert response.headers["content-disposition"] == (
            f'attachment; filename="we_ird_name-{run_id[:8]}.csv"')
        # The JSON too: saved as a file, not opened in the tab.
        response = api.get(f"/api/runs/{run_id}/export?format=json")
        assert response.headers["content-type"] == "application/json"
        assert response.headers["content-disposition"] == (
            f'attachment; filename="we_ird_name-{run_id[:8]}.json"')

    def test_wide_has_a_row_per_step_and_the_same_values(self, api: TestClient) -> None:
        """format=csv_wide: one row per step, a column per layer and statistic; every value
        the long CSV has for the parameter gradients, at the same step, exactly."""
        run_id = new_id()
        payload = _seed(api, run_id, name="wide")
        response = api.get(f"/api/runs/{run_id}/export?format=csv_wide")
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "text/csv; charset=utf-8"
        assert response.headers["content-disposition"] == (
            f'attachment; filename="wide-{run_id[:8]}.wide.csv"')
        header, *rows = csv.reader(io.StringIO(response.text))
        layers = [layer["name"] for layer in payload["layers"]]
        assert header == ["step", "attempt", "seq", "wall_time", *SCALARS,
                          *(f"{layer}/{stat}" for layer in layers for stat in STAT_NAMES)]
        assert len(rows) == len(payload["records"])
        long_rows = [r for r in _expected(payload) if r[4] in ("step", "param")]
        with_layers = {r[0] for r in long_rows if r[4] == "param"}
        wide = []
        for row in rows:
            head = [int(row[0]), int(row[1]), int(row[2]), float(row[3])]
            values = dict(zip(header[4:], row[4:], strict=True))
            wide += [[*head, "step", None, "", name, _norm(values[name])] for name in SCALARS]
            if head[0] in with_layers:
                wide += [[*head, "param", index, layer, stat, _norm(values[f"{layer}/{stat}"])]
                         for index, layer in enumerate(layers) for stat in STAT_NAMES]
        assert wide == long_rows
        # Step 1 has no layer statistics: its layer cells are empty, not zeros.
        assert with_layers == {0, 2}
        assert rows[1][4 + len(SCALARS):] == [""] * (len(layers) * len(STAT_NAMES))
        assert len(response.text) < len(api.get(
            f"/api/runs/{run_id}/export?format=csv").text) / 2

    def test_run_without_steps(self, api: TestClient) -> None:
        run_id = new_id()
        assert api.post("/api/ingest", json=batch([], run_id=run_id)).status_code == 200
        response = api.get(f"/api/runs/{run_id}/export?format=csv")
        assert response.text == "step,attempt,seq,wall_time,source,layer_index,layer,stat,value\n"

    def test_pages_through_the_run(self, sessions: sessionmaker[Session]) -> None:
        """A page of one step gives the same text as one page of all: paging is invisible."""
        payload = batch_v2(_records(), run_id=new_id(), layers=_layers())
        ingest_payload(sessions, payload, now=1000.0)
        run_id = payload["run"]["id"]
        small = list(export_streams.csv_chunks(sessions, run_id, page_values=1))
        whole = list(export_streams.csv_chunks(sessions, run_id))
        assert len(small) == 1 + 3 and len(whole) == 1 + 1
        assert "".join(small) == "".join(whole)
        assert _parse("".join(whole))[1] == _expected(payload)


class TestJson:
    def test_pages_through_the_run(self, sessions: sessionmaker[Session]) -> None:
        """Page by page (one step a page) or in one page: the same document, valid JSON with
        every step; the head is the run's detail, layer and module tables."""
        payload = batch_v2(_records(), run_id=new_id(), layers=_layers())
        ingest_payload(sessions, payload, now=1000.0)
        run_id = payload["run"]["id"]
        small = list(export_streams.json_chunks(sessions, run_id, 300.0, page_values=1))
        whole = list(export_streams.json_chunks(sessions, run_id, 300.0))
        assert len(small) == 1 + 3 + 1 and len(whole) == 1 + 1 + 1
        document = strict_json("".join(small))
        assert document == strict_json("".join(whole))
        assert list(document) == ["run", "layers", "modules", "steps"]
        assert [step["seq"] for step in document["steps"]] == [0, 1, 2]
        assert [layer["name"] for layer in document["layers"]] == [
            layer["name"] for layer in payload["layers"]]

    def test_a_run_without_steps(self, api: TestClient) -> None:
        run_id = new_id()
        assert api.post("/api/ingest", json=batch([], run_id=run_id)).status_code == 200
        response = api.get(f"/api/runs/{run_id}/export")
        assert response.headers["content-type"] == "application/json"
        assert strict_json(response.text)["steps"] == []


class TestFormats:
    def test_unknown_format_is_422(self, api: TestClient) -> None:
        run_id = new_id()
        _seed(api, run_id)
        response = api.get(f"/api/runs/{run_id}/export?format=parquet")
        assert response.status_code == 422
        assert strict_json(response.text) == {
            "detail": "query.format: Input should be 'json', 'csv', 'csv_wide' or 'html'"}

    def test_json_is_the_default_and_still_works(self, api: TestClient) -> None:
        run_id = new_id()
        _seed(api, run_id)
        default = strict_json(api.get(f"/api/runs/{run_id}/export").text)
        explicit = strict_json(api.get(f"/api/runs/{run_id}/export?format=json").text)
        assert default == explicit
        assert [s["loss"] for s in explicit["steps"]] == ["nan", "-inf", 2.31 - 0.01 * 2]

    @pytest.mark.parametrize("fmt", ["csv", "html"])
    def test_unknown_run_is_404(self, api: TestClient, fmt: str) -> None:
        run_id = new_id()
        response = api.get(f"/api/runs/{run_id}/export?format={fmt}")
        assert response.status_code == 404
        assert strict_json(response.text) == {"detail": f"run '{run_id}' not found"}


def _json_block(text: str) -> Any:
    match = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text,
                      re.DOTALL)
    assert match is not None
    return strict_json(match.group(1))


def _inline_scripts(text: str) -> list[str]:
    return re.findall(r"<script>(.*?)</script>", text, re.DOTALL)


class TestHtmlReport:
    def test_self_contained_report(self, api: TestClient) -> None:
        run_id = new_id()
        _seed(api, run_id, name=HOSTILE, tags=["amp", HOSTILE])
        response = api.get(f"/api/runs/{run_id}/export?format=html")
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "text/html; charset=utf-8"
        assert response.headers["content-disposition"] == (
            f'attachment; filename="img_src_x_onerror_alert_1_script-{run_id[:8]}.html"')
        text = response.text
        # plotly.js inlined; nothing loaded from anywhere.
        assert "plotly.js (cartesian - minified) v" in text
        assert not re.search(r"<script[^>]*\ssrc\s*=", text, re.IGNORECASE)
        assert not re.search(r"<link[^>]*\shref\s*=", text, re.IGNORECASE)
        assert "@import" not in text
        # User text never appears as markup: escaped in <title>, \u-escaped in the JSON.
        assert HOSTILE not in text
        assert "<title>&lt;img src=x onerror=alert(1)&gt;&lt;/script&gt;&lt;!--" in text
        data = _json_block(text)
        assert (data["run"]["name"], data["run"]["tags"]) == (HOSTILE, ["amp", HOSTILE])
        assert data["heatmap"]["layers"] == [ODD_LAYER, "fc1.bias"]
        assert data["heatmap"]["steps"] == [0, 2]
        assert data["heatmap"]["z"] == [[0.0, 0.0], [0.15625, 0.15625]]
        loss = [p["last"] for p in data["series"]["loss"]["points"]]
        assert loss == ["nan", "-inf", 2.31 - 0.01 * 2]
        assert [p["last"] for p in data["series"]["grad_norm"]["points"]] == ["inf", 0.75, 0.75]
        assert [(e["step"], e["kind"]) for e in data["events"]] == [
            (0, "skipped"), (2, "growth")]

    def test_csp_allows_exactly_its_inline_scripts(self, api: TestClient) -> None:
        run_id = new_id()
        _seed(api, run_id)
        response = api.get(f"/api/runs/{run_id}/export?format=html")
        policy = response.headers["content-security-policy"]
        # The app's own policy is not added on top (it would block the inline scripts).
        assert response.headers.get_list("content-security-policy") == [policy]
        assert policy.startswith("default-src 'none'; script-src 'sha256-")
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert "http" not in policy and "*" not in policy
        scripts = _inline_scripts(response.text)
        assert len(scripts) == 2
        for script in scripts:
            digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
            assert f"'sha256-{digest}'" in policy
        meta = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">',
                         response.text)
        assert meta is not None
        assert f"{meta.group(1).replace('&#x27;', chr(39))}; frame-ancestors 'none'" == policy


class TestPure:
    def test_cell(self) -> None:
        values = (None, True, False, 3, 0.1, 1e-300, math.nan, math.inf, -math.inf)
        assert [export_streams.cell(v) for v in values] == [
            "", "1", "0", "3", "0.1", "1e-300", "nan", "inf", "-inf"]

    @pytest.mark.parametrize(("name", "run_id", "expected"), [
        ("demo", "3f0c2a4e-1b2c", "demo-3f0c2a4e.csv"),
        ("..", "ab", "run-ab.csv"),
        ("a/b\\c\r\nd\"e", "x y/z", "a_b_c_d_e-x_y_z.csv"),
        ("\u00e9t\u00e9 run", "id", "t_run-id.csv"),
        ("x" * 300, "id", f"{'x' * 80}-id.csv"),
    ])
    def test_attachment_filename(self, name: str, run_id: str, expected: str) -> None:
        run = Run(id=run_id, name=name)
        assert export_streams.attachment_filename(run, "csv") == expected

    def test_json_block_cannot_close_its_script(self) -> None:
        block = export_report_html.json_block({"name": "</script><!-- & >", "x": "inf"})
        assert "<" not in block and ">" not in block and "&" not in block
        assert strict_json(block) == {"name": "</script><!-- & >", "x": "inf"}
        with pytest.raises(ValueError, match="Out of range float"):
            export_report_html.json_block({"x": math.nan})

    def test_inline_script_guard(self) -> None:
        assert export_report_html.inline_script('a = "</SCRIPT>"; b = 1 < 2') == (
            'a = "<\\/SCRIPT>"; b = 1 < 2')


class TestBucketMax:
    def test_small_matrices_come_back_unchanged(self) -> None:
        assert export_report.bucket_max([1, 2, 3], [[0.1, None, 0.3]], 3) == ([1, 2, 3],
                                                                       [[0.1, None, 0.3]])
        assert export_report.bucket_max([], [[], []], 5) == ([], [[], []])

    def test_an_isolated_spike_survives(self) -> None:
        steps = list(range(100_000))
        row = [0.0] * len(steps)
        row[54_321] = 1.0
        out_steps, (out,) = export_report.bucket_max(steps, [row], 2000)
        assert len(out_steps) == len(out) == 2000
        assert out.count(1.0) == 1 and set(out) == {0.0, 1.0}
        spike = out.index(1.0)
        assert out_steps[spike] <= 54_321 < out_steps[spike + 1]

    def test_buckets_are_step_ranges_and_empty_ones_are_left_out(self) -> None:
        steps = [0, 1, 2, 3, 100, 101]
        z = [[0.1, 0.4, 0.2, 0.3, 0.5, 0.0]]
        # span 102 in 3 buckets of 34 steps: [0, 34) and [68, 102); [34, 68) is empty.
        assert export_report.bucket_max(steps, z, 3) == ([0, 100], [[0.4, 0.5]])

    def test_none_nan_and_inf(self) -> None:
        steps = [0, 1, 2, 3, 4, 5]
        z = [[None, None, math.nan, math.nan, math.nan, math.inf],
             [None, 1.0, 2.0, None, -math.inf, None]]
        out_steps, out = export_report.bucket_max(steps, z, 3)
        assert out_steps == [0, 2, 4]
        nan = out[0][1]
        assert out[0][0] is None and nan is not None and math.isnan(nan)
        assert out[0][2] == math.inf
        assert out[1] == [1.0, 2.0, -math.inf]

    def test_bad_arguments(self) -> None:
        with pytest.raises(ValueError, match="max_columns must be at least 1, got 0"):
            export_report.bucket_max([1], [[1.0]], 0)
        with pytest.raises(ValueError, match="row 1 has 1 values for 2 steps"):
            export_report.bucket_max([1, 2], [[1.0, 2.0], [1.0]], 5)
