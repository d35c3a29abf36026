"""Wire v5: packed statistics (`{"f64le": base64}`) decoded by `json_floats.unpack_stats`, stored as
their JSON form would be; NaN, inf and -0.0 kept bit for bit by the decoding; the 422s."""

from __future__ import annotations

import base64
import json
import math
import struct
import subprocess
import sys
from typing import Any, cast

import pytest
from starlette.testclient import TestClient

from ampscope_server.runs import json_floats
from tests.server.wire import activations, batch_v2, layer_stats, new_id, record_v2, strict_json
from tests.support.ingest import post_batch

NAMES = json_floats.STAT_COLUMNS


def pack(columns: dict[str, list[float]]) -> dict[str, str]:
    """The block as a client packs it, made here with `struct` (not the server's own code)."""
    values = [float(v) for name in NAMES for v in columns[name]]
    return {"f64le": base64.b64encode(struct.pack(f"<{len(values)}d", *values)).decode()}


def as_floats(stats: dict[str, list[Any]]) -> dict[str, list[float]]:
    """A JSON-form block as the float64 columns a client packs: null is NaN."""
    return {name: [math.nan if v is None else float(v) for v in stats[name]] for name in NAMES}


def batch_v5(records: list[dict[str, Any]], run_id: str) -> dict[str, Any]:
    payload = batch_v2(records, run_id=run_id)
    payload["schema_version"] = 5
    return payload


def export(api: TestClient, run_id: str) -> Any:
    response = api.get(f"/api/runs/{run_id}/export")
    assert response.status_code == 200, response.text
    return strict_json(response.text)


class TestDecoding:
    def test_nan_inf_and_negative_zero_keep_their_bits(self) -> None:
        raw = [math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308]
        text = base64.b64encode(struct.pack("<6d", *raw)).decode()
        got = json_floats.unpack_floats(text)
        assert math.isnan(got[0]) and got[1:3] == [math.inf, -math.inf]
        assert math.copysign(1.0, got[3]) == -1.0 and got[3] == 0.0
        assert got[4:] == raw[4:]

    def test_the_json_form_of_a_block(self) -> None:
        columns = {**as_floats(layer_stats(n=3)), "zero_frac": [-0.0, 0.5, 1.0],
                   "amax": [math.nan, 0.25, 2.0**-149]}
        got = json_floats.unpack_stats(pack(columns))
        assert got["amax"] == [None, 0.25, 2.0**-149]  # NaN in amax: no element qualified
        assert got["amin_nz"] == [1e-9, None, 1e-7]
        assert got["nan_count"] == [0, 3, 0] and type(got["nan_count"][1]) is int
        assert [math.copysign(1.0, cast(float, x)) for x in got["zero_frac"]] == [-1.0, 1.0, 1.0]

    def test_an_empty_model(self) -> None:
        empty = pack({name: [] for name in NAMES})
        assert json_floats.unpack_stats(empty) == {n: [] for n in NAMES}


class TestIngest:
    def test_packed_and_json_records_store_the_same(self, api: TestClient) -> None:
        packed_id, json_id = new_id(), new_id()
        sent = [record_v2(0, activations=activations()), record_v2(1)]
        packed = [
            record_v2(0, layers=pack(as_floats(sent[0]["layers"])),
                      activations=activations()),  # a block with "inf" tags stays JSON
            record_v2(1, layers=pack(as_floats(sent[1]["layers"]))),
        ]
        post_batch(api, batch_v5(packed, packed_id))
        post_batch(api, batch_v5(sent, json_id))  # JSON stays accepted in v5
        got, want = export(api, packed_id), export(api, json_id)
        strip = ("id", "attempt")
        assert [{k: v for k, v in s.items() if k not in strip} for s in got["steps"]] == [
            {k: v for k, v in s.items() if k not in strip} for s in want["steps"]]
        assert got["steps"][0]["layers"] == sent[0]["layers"]

    def test_packed_activations(self, api: TestClient) -> None:
        run_id = new_id()
        acts = {**activations(), "amax": [0.5, None, None], "l2": [3.0, None, None],
                "amin_nz": [1e-30, None, 0.0]}
        post_batch(api, batch_v5([record_v2(0, activations=pack(as_floats(acts)))], run_id))
        assert export(api, run_id)["steps"][0]["activations"] == acts

    @pytest.mark.parametrize(("block", "detail"), [
        ({"f64le": "not base64!"}, "f64le is not valid base64"),
        ({"f64le": base64.b64encode(b"\0" * 12).decode()},
         "f64le holds 12 bytes, not a whole number of float64s"),
        ({"f64le": base64.b64encode(b"\0" * 8 * 9).decode()},
         "f64le holds 9 values, not 8 equal columns"),
        ({"f64le": "", "extra": 1}, "a packed block has the one key 'f64le', got ['extra', "
         "'f64le']"),
        (pack({**as_floats(layer_stats()), "nan_count": [0.5, 0.0]}),
         "f64le: nan_count must hold whole, finite counts"),
        (pack({**as_floats(layer_stats()), "inf_count": [math.nan, 0.0]}),
         "f64le: inf_count must hold whole, finite counts"),
    ], ids=["base64", "bytes", "columns", "keys", "fractional-count", "nan-count"])
    def test_malformed_blocks_are_422s(self, api: TestClient, block: dict[str, Any],
                                       detail: str) -> None:
        payload = batch_v5([record_v2(0, layers=block)], new_id())
        assert post_batch(api, payload, 422) == {"detail": f"records[0].layers: {detail}"}

    def test_an_inf_amax_is_refused_as_in_json(self, api: TestClient) -> None:
        block = pack({**as_floats(layer_stats()), "amax": [math.inf, 0.5]})
        body = post_batch(api, batch_v5([record_v2(0, layers=block)], new_id()), 422)
        assert body == {"detail": "records[0].layers.amax[0]: is defined over finite elements, "
                                  "so it must be a finite number or null"}

    def test_packed_statistics_need_version_5(self, api: TestClient) -> None:
        payload = batch_v2([record_v2(0, layers=pack(as_floats(layer_stats())))],
                           run_id=new_id())
        payload["schema_version"] = 4
        assert post_batch(api, payload, 422) == {"detail": (
            "records[0].layers: packed statistics need schema_version 5, not 4")}


@pytest.mark.slow
def test_the_server_decodes_packed_batches_without_torch() -> None:
    """The server never imports torch (DESIGN.md §1): its packed decoding is `array` and
    `base64`. A fresh interpreter imports the app and validates a packed v5 batch."""
    payload = batch_v5([record_v2(0, layers=pack(as_floats(layer_stats())))], new_id())
    script = (
        "import sys\n"
        "from ampscope_server.api import app\n"
        "from ampscope_server.ingest.wire import IngestBatch\n"
        "batch = IngestBatch.model_validate_json(sys.stdin.read())\n"
        "assert batch.records[0].layers is not None\n"
        "print(batch.records[0].layers.nan_count, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["[0,", "3]", "False"]
