"""`rank_packing`: a step's per-rank and per-optimizer values packed one row each, given back
exactly (NaN, ±inf, -0.0, extremes, nulls), and which ranks went non-finite."""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest

from ampscope_server.ingest.wire import StepRecord
from ampscope_server.store import rank_packing


def _record(**fields: Any) -> StepRecord:
    return StepRecord.model_validate({"seq": 0, "step": 7, "wall_time": 1.0, "found_inf": False,
                                      "skipped": False, **fields})


def _bits(values: list[float | None]) -> list[bytes | None]:
    return [None if v is None else struct.pack("<d", v) for v in values]


class TestRanks:
    def test_round_trip_bit_for_bit(self) -> None:
        loss = [1.5, "nan", "inf", "-inf", None, -0.0, 5e-324, 1.7976931348623157e308]
        nonfinite = [0, 3, None, 0, 2**63 - 1, 0, 0, 1]
        row = rank_packing.ranks_row(_record(ranks={"loss": loss, "nonfinite": nonfinite}))
        assert row is not None
        assert (row["step"], row["ranks"], row["nonfinite_ranks"]) == (7, 8, 5)
        got = rank_packing.unpack_ranks(row["data"])
        expected = [1.5, math.nan, math.inf, -math.inf, None, -0.0, 5e-324,
                    1.7976931348623157e308]
        assert _bits(got.loss) == _bits(expected)
        assert got.nonfinite == nonfinite

    def test_none_without_ranks(self) -> None:
        assert rank_packing.ranks_row(_record()) is None
        assert rank_packing.optimizers_row(_record()) is None

    @pytest.mark.parametrize(("loss", "nonfinite", "ranks"), [
        ([1.0, 2.0], [0, 0], []),
        ([1.0, 2.0], [None, None], []),
        ([None, math.nan], [0, None], [1]),
        ([1.0, 1.0], [0, 4], [1]),
        ([-math.inf, 1.0, math.inf], [0, 0, 1], [0, 2]),
        ([], [], []),
    ])
    def test_nonfinite_ranks(self, loss: list[float | None], nonfinite: list[int | None],
                             ranks: list[int]) -> None:
        assert rank_packing.nonfinite_ranks(loss, nonfinite) == ranks


class TestOptimizers:
    def test_round_trip(self) -> None:
        optimizers = [{"skipped": True, "lr": [0.1, None, "nan"]},
                      {"skipped": None, "lr": []},
                      {"skipped": False, "lr": ["-inf"]}]
        row = rank_packing.optimizers_row(_record(optimizers=optimizers))
        assert row is not None and row["optimizers"] == 3
        got = rank_packing.unpack_optimizers(row["data"], row["lr"])
        assert [(o.skipped, _bits(o.lr)) for o in got] == [
            (True, _bits([0.1, None, math.nan])), (None, []), (False, _bits([-math.inf]))]

    def test_every_group_without_lr(self) -> None:
        row = rank_packing.optimizers_row(_record(optimizers=[{"skipped": None,
                                                               "lr": [None, None]}]))
        assert row is not None
        got = rank_packing.unpack_optimizers(row["data"], row["lr"])
        assert [(o.skipped, o.lr) for o in got] == [(None, [None, None])]
