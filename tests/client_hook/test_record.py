"""``StepRecord.to_wire`` reads a CPU step's unstacked parts exactly as the stacked tensor."""

from __future__ import annotations

import base64
import json
import math
import struct
import sys
from typing import Any

import pytest
import torch

from ampscope import wire
from ampscope.capture import Kind, Taken
from ampscope.misuse import ClipHeuristic
from ampscope.record import SCALARS, Parts, Sections, StepRecord, _host_values
from ampscope.reductions import STAT_NAMES

F32, F64 = torch.float32, torch.float64


def scalars(loss: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The SCALARS in the dtypes the scaler and the cycle give them (int32 growth tracker)."""
    return [
        torch.tensor(65536.0, dtype=F32),  # scale_before (the scaler's float32, copied)
        torch.tensor(32768.0, dtype=F32),  # scale_after
        torch.tensor(0, dtype=torch.int32),  # growth_tracker
        torch.tensor(1.0, dtype=F32),  # found_inf
        torch.tensor(math.inf, dtype=F64) if loss is None else loss,
        torch.tensor(math.nan, dtype=F64),  # grad_norm: filled from the raw norms
        torch.tensor(1e-3, dtype=F64),  # lr
    ]


def raw_norms() -> torch.Tensor:
    return torch.tensor([3.0, math.nan, math.inf, 4.0], dtype=F32)


def record(values: torch.Tensor | Parts) -> StepRecord:
    return StepRecord(
        seq=3, step=7, wall_time=1.5, duration=0.25, values=values, ready=None,
        absent=frozenset(), sections=Sections(num_layers=4, taken=NORMS),
        found_inf_from_scale=False, captured="before_unscale", misuse=None,
        order=[3, 2, 1, 0], clip=ClipHeuristic(),
    )


NORMS = Taken(Kind.NORMS, torch.device("cpu"), (True,) * 4, float32_norms=True)


def stacked(parts: Parts) -> torch.Tensor:
    """What the device path builds: one float64 tensor of the same values, in the same order."""
    flat: list[torch.Tensor] = []
    for part in parts:
        t = part if isinstance(part, torch.Tensor) else torch.stack(
            [p.reshape(()) for p in part])
        flat.append(t.reshape(-1).to(F64))
    return torch.cat(flat)


class TestHostValues:
    def test_parts_read_as_the_stacked_tensor(self) -> None:
        block = torch.tensor([[1.0, 2.0], [math.nan, -math.inf]], dtype=F32)
        parts: Parts = [scalars(), raw_norms(), block]
        got, want = _host_values(parts), _host_values(stacked(parts))
        assert len(got) == len(SCALARS) + 4 + 4
        assert [repr(float(v)) for v in got] == [repr(float(v)) for v in want]  # NaN, inf kept
        assert got[len(SCALARS):] == [3.0, got[8], math.inf, 4.0, 1.0, 2.0, got[13], -math.inf]
        assert math.isnan(got[8]) and math.isnan(got[13])

    def test_a_loss_of_shape_1_is_read_as_a_scalar(self) -> None:
        # A loss of shape (1,) beside 0-d scalars (a stack would refuse them): same values.
        got = _host_values([scalars(loss=torch.tensor([2.5], dtype=F64))])
        assert got[:5] == [65536.0, 32768.0, 0.0, 1.0, 2.5] and got[6] == 1e-3
        assert math.isnan(got[5])


class TestToWire:
    def test_parts_and_tensor_give_the_same_wire_record(self) -> None:
        parts: Parts = [scalars(), raw_norms()]
        from_parts: dict[str, Any] = record(parts).to_wire()
        from_tensor: dict[str, Any] = record(stacked(parts)).to_wire()
        assert from_parts == from_tensor
        assert from_parts["scale_before"] == 65536.0 and from_parts["growth_tracker"] == 0
        assert from_parts["loss"] == "inf" and from_parts["grad_norm"] == "nan"
        assert from_parts["nonfinite"] == [{"layer": 2, "kind": "inf"},
                                           {"layer": 1, "kind": "nan"}]


def per_layer(num_layers: int, scale: float) -> tuple[StepRecord, dict[str, list[Any]]]:
    """A CPU per-layer record of ``num_layers`` layers whose partials hold every case (an
    all-zero layer, a NaN and an inf, an overflowed sum of squares, a -0.0 amax), and its
    ``layers`` as the JSON arrays, each value by the definition (DESIGN.md §3)."""
    cases = (
        (1.0, 0.0, 0.0, 2.0, 3.0, 16.0, 4.0, 0.5),
        (2.0, 0.0, 0.0, 2.0, 2.0, 0.0, -0.0, math.inf),
        (0.0, 1.0, 1.0, 0.0, 0.0, 9.0, 3.0, 3.0),
        (0.0, 0.0, 0.0, 1.0, 1.0, math.inf, 1e300, 2.0**-30),
        (3.0, 0.0, 0.0, 5.0, 7.0, 2.0**-40 + 3.0, 1.5, 2.0**-30),
    )
    rows = [cases[k % len(cases)] for k in range(num_layers)]
    numel = [4.0 + k % 7 for k in range(num_layers)]
    want: dict[str, list[Any]] = {name: [] for name in STAT_NAMES}
    for r, size in zip(rows, numel, strict=True):
        t = 1.0 / scale
        amax, amin, l2 = r[6] * t, math.nan if r[7] == math.inf else r[7] * t, math.sqrt(r[5]) * t
        want["amax"].append(amax if size - r[1] - r[2] > 0 and math.isfinite(amax) else None)
        want["amin_nz"].append(amin if math.isfinite(amin) else None)
        want["zero_frac"].append(r[0] / size)
        want["subnormal_frac"].append((r[4] - r[0]) / size)
        want["underflow_frac"].append((r[3] - r[0]) / size)
        want["nan_count"].append(round(r[1]))
        want["inf_count"].append(round(r[2]))
        want["l2"].append(l2 if math.isfinite(l2) else None)
    head = [torch.tensor(scale), torch.tensor(scale), torch.tensor(0), torch.tensor(0.0),
            torch.tensor(1.0, dtype=F64), torch.tensor(math.nan, dtype=F64),
            torch.tensor(1e-3, dtype=F64)]
    taken = Taken(Kind.STATS, torch.device("cpu"), (True,) * num_layers)
    rec = StepRecord(
        seq=1, step=1, wall_time=1.5, duration=0.25,
        values=[head, torch.tensor(rows, dtype=F64)], ready=None, absent=frozenset(),
        sections=Sections(num_layers=num_layers, taken=taken, layers=True),
        found_inf_from_scale=False, captured="before_unscale",
        numels=torch.tensor(numel, dtype=F64))
    return rec, want


def body(rec: StepRecord) -> bytes:
    return wire.dumps(wire.build_payload(run={}, attempt={}, layers=None, records=[rec.to_wire()],
                                         final=False))


class TestPerLayerBody:
    @pytest.mark.parametrize("num_layers", [34, 500])
    def test_the_packed_columns_are_the_definition_bit_for_bit(self, num_layers: int) -> None:
        rec, want = per_layer(num_layers, 2.0**10)
        sent = json.loads(body(rec))["records"][0]
        assert set(sent["layers"]) == {"f64le"}
        got = wire.unpack_stats(sent["layers"])
        assert repr(got) == repr(want)
        amax = base64.b64decode(sent["layers"]["f64le"])[8:16]
        assert amax == struct.pack("<d", -0.0)  # layer 1's -0.0, as sent
        assert sent["nonfinite"] is None  # found_inf 0: not looked for

    def test_a_record_becomes_its_body_in_as_many_python_calls_at_500_layers_as_at_34(
            self) -> None:
        """The sender thread's per-record path (``to_wire``, the packed encode) has no Python
        call per layer or value: counted with ``sys.setprofile`` (calls of Python and of C
        functions from Python), the same at 34 and 500 layers."""
        def calls(num_layers: int) -> int:
            rec, _ = per_layer(num_layers, 2.0**10)
            body(rec)  # warm: the factors and the denominators kept
            rec, _ = per_layer(num_layers, 2.0**10)
            count = 0

            def profile(frame: Any, event: str, arg: Any) -> None:
                nonlocal count
                count += event in ("call", "c_call")

            sys.setprofile(profile)
            try:
                body(rec)
            finally:
                sys.setprofile(None)
            return count

        assert calls(500) == calls(34) < 400
