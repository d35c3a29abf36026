"""`format_packing`, pure: the wire's names and their orders, the stored layout's offsets
against a row built value by value, float64 bits kept (NaN's payload, -0.0, ±inf, the
smallest subnormal), and the thinning rule (how many, which, evenly)."""

from __future__ import annotations

import itertools
import math
import struct

import pytest

from ampscope_server.store import format_packing
from ampscope_server.store.format_packing import (
    FORMAT_STATS,
    OPERAND_STATS,
    OPERANDS,
    operand_at,
    thinned,
    value_at,
)


def test_the_names_are_the_hooks() -> None:
    """The orders `ampscope.recipes` fixes (issue #33): the layout depends on them."""
    assert OPERANDS == ("input", "weight", "grad_output")
    assert FORMAT_STATS == ("underflow_frac", "saturated_frac", "rel_rmse", "scale_min_frac",
                            "scale_max_frac")
    assert OPERAND_STATS == ("amax", "rms", "kurtosis", "nonfinite_frac")


def test_offsets_find_each_value_of_a_row() -> None:
    """A row of 3 layers x 2 recipes whose every value names its own (position, operand,
    recipe, stat): each offset cuts exactly its five, and four, values."""
    layers, recipes = 3, 2
    values = [float(p * 1000 + o * 100 + r * 10 + s) for p in range(layers)
              for o in range(3) for r in range(recipes) for s in range(5)]
    operands = [float(-(p * 1000 + o * 100 + k)) for p in range(layers)
                for o in range(3) for k in range(4)]
    assert len(values) == format_packing.values_count(layers, recipes)
    assert len(operands) == format_packing.operands_count(layers)
    data = format_packing.pack(values + operands)
    for p in range(layers):
        for o in range(3):
            at = operand_at(p, o, layers, recipes)
            assert format_packing.unpack(data[at:at + format_packing.OPERAND_BYTES]) == [
                -(p * 1000 + o * 100 + k) for k in range(4)]
            for r in range(recipes):
                at = value_at(p, o, r, recipes)
                assert format_packing.unpack(data[at:at + format_packing.STATS_BYTES]) == [
                    p * 1000 + o * 100 + r * 10 + s for s in range(5)]


def test_pack_keeps_every_bit_little_endian() -> None:
    payload_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0123))[0]
    values = [math.nan, payload_nan, math.inf, -math.inf, -0.0, 2.0**-1074, 1.5]
    data = format_packing.pack(values)
    assert data == struct.pack("<7d", *values)
    assert format_packing.pack(format_packing.unpack(data)) == data


def test_join_and_split() -> None:
    assert format_packing.join([0, 3, 17]) == "0,3,17"
    assert format_packing.split_layers("0,3,17") == [0, 3, 17]
    assert format_packing.split_recipes("fp8_tensorwise,mxfp8") == ["fp8_tensorwise", "mxfp8"]
    assert len(",".join(["a" * 32] * 16)) == format_packing.RECIPES_LENGTH


def test_unpack_row_gives_the_wires_lists() -> None:
    values, operands = [float(i) for i in range(30)], [-float(i) for i in range(12)]
    row = format_packing.unpack_row("mxfp8,nvfp4", "3", format_packing.pack(values + operands))
    assert row == format_packing.Unpacked(["mxfp8", "nvfp4"], [3], values, operands)


class TestThinned:
    def test_all_when_within_the_limit(self) -> None:
        assert thinned(0, 2) == []
        assert thinned(1, 2) == [0]
        assert thinned(5, 5) == [0, 1, 2, 3, 4]

    @pytest.mark.parametrize(("count", "limit"), [(3, 2), (6, 3), (23, 5), (101, 2),
                                                  (1001, 500), (10_000, 2000), (2001, 2000)])
    def test_exactly_limit_first_and_last_evenly(self, count: int, limit: int) -> None:
        kept = thinned(count, limit)
        assert len(kept) == limit
        assert kept[0] == 0 and kept[-1] == count - 1
        assert kept == sorted(set(kept))
        gaps = {b - a for a, b in itertools.pairwise(kept)}
        # Evenly: every gap is one of the two integers around (count - 1) / (limit - 1).
        step = (count - 1) / (limit - 1)
        assert gaps <= {math.floor(step), math.ceil(step)}

    def test_a_worked_example(self) -> None:
        assert thinned(6, 3) == [0, 3, 5]
        assert thinned(6, 4) == [0, 2, 4, 5]
