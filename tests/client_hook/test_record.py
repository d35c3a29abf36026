"""``StepRecord.to_wire`` reads a CPU step's unstacked parts exactly as the stacked tensor."""

from __future__ import annotations

import math
from typing import Any

import torch

from ampscope.capture import Kind, Taken
from ampscope.misuse import ClipHeuristic
from ampscope.record import SCALARS, Parts, Sections, StepRecord, _host_values

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
