"""`rank_packing`: a step's per-rank and per-optimizer values packed one row each, given back
exactly (NaN, ±inf, -0.0, extremes, nulls), and which ranks went non-finite."""

from __future__ import annotations

import math
import struct

import pytest

from ampscope_server.store import rank_packing


def _bits(values: list[float | None]) -> list[bytes | None]:
    return [None if v is None else struct.pack("<d", v) for v in values]


class TestRanks:
    def test_round_trip_bit_for_bit(self) -> None:
        loss = [1.5, math.nan, math.inf, -math.inf, None, -0.0, 5e-324, 1.7976931348623157e308]
        nonfinite = [0, 3, None, 0, 2**63 - 1, 0, 0, 1]
        row = rank_packing.ranks_row(7, loss, nonfinite)
        assert (row["step"], row["ranks"], row["nonfinite_ranks"]) == (7, 8, 5)
        got = rank_packing.unpack_ranks(row["data"])
        expected = [1.5, math.nan, math.inf, -math.inf, None, -0.0, 5e-324,
                    1.7976931348623157e308]
        assert _bits(got.loss) == _bits(expected)
        assert got.nonfinite == nonfinite

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
        optimizers: list[tuple[bool | None, list[float | None]]] = [
            (True, [0.1, None, math.nan]), (None, []), (False, [-math.inf])]
        row = rank_packing.optimizers_row(optimizers)
        assert row["optimizers"] == 3
        got = rank_packing.unpack_optimizers(row["data"], row["lr"])
        assert [(o.skipped, _bits(o.lr)) for o in got] == [
            (True, _bits([0.1, None, math.nan])), (None, []), (False, _bits([-math.inf]))]

    def test_every_group_without_lr(self) -> None:
        row = rank_packing.optimizers_row([(None, [None, None])])
        got = rank_packing.unpack_optimizers(row["data"], row["lr"])
        assert [(o.skipped, o.lr) for o in got] == [(None, [None, None])]
