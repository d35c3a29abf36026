"""Contract: what the hook's wire module (`ampscope.wire`) emits, the server accepts as sent.

The payload is built and serialised by the hook's own code, parsed as the server parses a
request body, validated by the server's schemas, stored, and read back through the API codec.
"""

from __future__ import annotations

import copy
import json
import math
import uuid
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from ampscope import recipes, wire
from ampscope_server.export import streams as export_streams
from ampscope_server.ingest import batches as ingest
from ampscope_server.ingest.wire import SCHEMA_VERSION, IngestBatch
from ampscope_server.store import format_packing
from ampscope_server.store.models import LAYER_STAT_NAMES
from tests.server.wire import LAYERS, strict_json


def _export(sessions: sessionmaker[Session], run_id: str) -> Any:
    """The run's JSON export, as the server streams it."""
    return strict_json("".join(export_streams.json_chunks(sessions, run_id, 300.0)))


def _hook_payload(final: bool = False) -> dict[str, Any]:
    nan, inf = math.nan, math.inf
    records = [
        wire.step_record(
            seq=0, step=0, wall_time=1764430001.25, loss=-0.0, scale_before=65536.0,
            scale_after=65536.0, growth_tracker=1, found_inf=False, skipped=False,
            grad_norm=0.75, lr=1e-3, duration=None,
            layers={"amax": [0.5, 0.25], "amin_nz": [1e-9, nan], "zero_frac": [0.0, 0.5],
                    "subnormal_frac": [0.0, 0.25], "underflow_frac": [0.0, 0.125],
                    "nan_count": [0.0, 3.0], "inf_count": [0.0, 1.0], "l2": [1.5, nan]},
        ),
        wire.step_record(
            seq=1, step=1, wall_time=1764430002.5, loss=nan, scale_before=65536.0,
            scale_after=32768.0, growth_tracker=0, found_inf=True, skipped=True,
            grad_norm=inf, lr=1e-3, duration=0.0125, layers=None,
        ),
        wire.step_record(
            seq=2, step=2, wall_time=1764430003.5, loss=-inf, scale_before=32768.0,
            scale_after=32768.0, growth_tracker=None, found_inf=False, skipped=False,
            grad_norm=None, lr=None, duration=0.5, layers=None,
        ),
    ]
    run_id = str(uuid.uuid4())
    payload: dict[str, Any] = json.loads(wire.dumps(wire.build_payload(
        run={"id": run_id, "project": "default", "name": "contract", "tags": ["amp"],
             "config": wire.jsonable({"lr": 1e-3, "eps": inf, "betas": (0.9, 0.999)}),
             "host": "host", "rank": 0, "target_format": "fp16"},
        attempt={"id": str(uuid.uuid4()), "pid": 4242, "started_at": 1764430000.0},
        layers=LAYERS, records=records, final=final,
    )))
    return payload


def test_same_schema_version_and_stat_names() -> None:
    assert wire.SCHEMA_VERSION == SCHEMA_VERSION
    assert tuple(wire.LAYER_STAT_NAMES) == LAYER_STAT_NAMES
    # Wire v7's formats: the axes' names, as the hook measures them and the server stores them.
    assert (recipes.OPERANDS, recipes.STATS, recipes.MOMENTS) == (
        format_packing.OPERANDS, format_packing.FORMAT_STATS, format_packing.OPERAND_STATS)


def test_hook_output_is_accepted_and_read_back_as_sent(
    sessions: sessionmaker[Session],
) -> None:
    payload = _hook_payload(final=True)
    batch = IngestBatch.model_validate(payload)
    with sessions() as session, session.begin():
        result = ingest.ingest_batch(session, batch)
    assert (result.accepted, result.duplicates) == (3, 0)
    exported = _export(sessions, payload["run"]["id"])
    assert exported["run"]["status"] == "finished"
    assert exported["run"]["config"] == {"lr": 1e-3, "eps": "inf", "betas": [0.9, 0.999]}
    assert set(payload["records"][0]["layers"]) == {wire.PACKED}  # v5: the packed columns
    as_json = wire.unpack_payload(copy.deepcopy(payload))
    for sent, got in zip(as_json["records"], exported["steps"], strict=True):
        assert {k: v for k, v in got.items() if k not in ("id", "attempt")} == sent
    assert math.copysign(1.0, exported["steps"][0]["loss"]) == -1.0  # -0.0 == 0.0 above
    assert exported["steps"][0]["layers"]["amin_nz"] == [1e-9, None]
    assert exported["steps"][0]["layers"]["nan_count"] == [0, 3]


def test_a_real_monitor_stream_is_accepted_and_read_back_as_sent(
    sessions: sessionmaker[Session],
) -> None:
    """Bodies a real `Monitor` produced on a CPU AMP loop, one with NaN and inf gradients."""
    import torch

    import ampscope
    from ampscope.transport import MemorySender

    torch.manual_seed(0)
    first = torch.nn.Linear(4, 8)
    model = torch.nn.Sequential(first, torch.nn.ReLU(), torch.nn.Linear(8, 1))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sink = MemorySender()
    mon = ampscope.watch(model, scaler, optimizer, run="contract-monitor", server=None,
                         sender=sink, layer_every=2)
    for i in range(6):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(torch.randn(16, 4)).float().pow(2).mean()
        scaler.scale(loss).backward()
        if i == 3:
            grad = first.weight.grad
            assert grad is not None
            grad.view(-1)[:2] = torch.tensor([math.nan, math.inf])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    mon.close()
    assert mon.stats().acknowledged == 6

    for body in sink.payloads():
        batch = IngestBatch.model_validate(body)
        with sessions() as session, session.begin():
            ingest.ingest_batch(session, batch)
    sent = [record for body in sink.payloads() for record in body["records"]]
    exported = _export(sessions, mon.run_id)
    assert exported["run"]["status"] == "finished"
    assert [layer["name"] for layer in exported["layers"]] == [
        layer["name"] for layer in mon.layers]
    assert [{k: v for k, v in got.items() if k not in ("id", "attempt")}
            for got in exported["steps"]] == sent
    poisoned = exported["steps"][3]
    assert (poisoned["skipped"], poisoned["grad_norm"]) == (True, "nan")
    assert [s["layers"] is not None for s in exported["steps"]] == [True, False] * 3


def test_a_real_monitor_v3_stream_is_read_back_as_sent(
    sessions: sessionmaker[Session],
) -> None:
    """Wire v3 from a real `Monitor`: an FP32 re-check of an overflow step caused by a NaN in the
    data, and swallowed fractions of an FP16-held model, stored and exported unchanged; with
    v6's FP32 shadow step every 2nd applied step."""
    import torch

    import ampscope
    from ampscope.transport import MemorySender

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sink = MemorySender()
    mon = ampscope.watch(model, scaler, optimizer, run="contract-v3", server=None, sender=sink,
                         layer_every=1, shadow_every=2)
    for i in range(4):
        x = torch.randn(16, 4)
        if i == 2:
            x[0, 0] = math.nan
        mon.recheck(lambda x=x: model(x).float().pow(2).mean())  # type: ignore[misc]
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    mon.close()

    half = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 1)).half()
    off = torch.amp.GradScaler("cpu", enabled=False)
    half_opt = torch.optim.SGD(half.parameters(), lr=1e-4)
    half_sink = MemorySender()
    half_mon = ampscope.watch(half, off, half_opt, run="contract-v3-half", server=None,
                              sender=half_sink, layer_every=1)
    for _ in range(2):
        off.scale(half(torch.randn(16, 4).half()).float().pow(2).mean()).backward()
        off.step(half_opt)
        off.update()
        half_opt.zero_grad()
    half_mon.close()

    for monitor, sent_to in ((mon, sink), (half_mon, half_sink)):
        for body in sent_to.payloads():
            assert body["schema_version"] == wire.SCHEMA_VERSION
            with sessions() as session, session.begin():
                ingest.ingest_batch(session, IngestBatch.model_validate(body))
        sent = [record for body in sent_to.payloads() for record in body["records"]]
        exported = _export(sessions, monitor.run_id)
        assert [{k: v for k, v in got.items() if k not in ("id", "attempt")}
                for got in exported["steps"]] == sent
    rechecked = [r["recheck"] for body in sink.payloads() for r in body["records"]]
    assert [None if r is None else r["status"] for r in rechecked] == [
        None, None, "persisted", None]
    # Steps 0, 1 and 3 were applied (2 overflowed): the 2nd is step 1.
    shadows = [r.get("shadow") for body in sink.payloads() for r in body["records"]]
    assert [None if s is None else s["status"] for s in shadows] == [None, "ok", None, None]
    assert shadows[1] is not None and len(shadows[1]["norm"]) == 4
    swallowed = [r["swallowed"] for body in half_sink.payloads() for r in body["records"]]
    assert all(s is not None and len(s) == 4 for s in swallowed)


def test_a_real_float8_training_is_read_back_as_sent(sessions: sessionmaker[Session]) -> None:
    """Wire v7's formats from a real `Monitor` over torchao's Float8Linear (emulated on the
    CPU): the what-ifs and what the modules trained in, stored and exported unchanged."""
    import warnings

    import torch

    import ampscope
    from ampscope.transport import MemorySender

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    convert_to_float8_training(model, config=Float8LinearConfig(emulate=True),
                               module_filter_fn=lambda m, name: name == "0")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sink = MemorySender()
    mon = ampscope.watch(model, None, optimizer, server=None, sender=sink, formats_every=2)
    for _ in range(3):
        model(torch.randn(16, 32)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    mon.close()
    for body in sink.payloads():
        with sessions() as session, session.begin():
            ingest.ingest_batch(session, IngestBatch.model_validate(body))
    sent = [record for body in sink.payloads() for record in body["records"]]
    assert [r["formats"]["trained"]["recipes"] for r in sent if "formats" in r] == [
        ["fp8_tensorwise", None]] * 2
    exported = _export(sessions, mon.run_id)
    assert [{k: v for k, v in got.items() if k not in ("id", "attempt")}
            for got in exported["steps"]] == sent
