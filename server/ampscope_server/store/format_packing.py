"""Pure layout of a sampled step's scaled-format what-ifs (wire v7 `formats`, `step_formats`).

No I/O. The names below are the wire's, defined once on the server (the hook's
`ampscope.recipes` holds the same tuples): `ingest.wire` validates against them, the reads and
the export name the axes with them. They live here, in the lowest layer, because the stored
layout is made of them and the repository cuts one layer's values out of a stored row in SQL.

A row holds, for L layers (`layers`, table indices) and R recipes (`recipes`, names):

    data = values (L x 3 x R x 5 float64) ++ operands (L x 3 x 4 float64), little-endian,
    scales = L x 3 x R x SCALE_WIDTH float64 (wire v8; null before it),

`values` row-major over (layer, operand, recipe, stat) in the orders of `OPERANDS` and
`FORMAT_STATS`, `operands` over (layer, operand, operand stat) in the order of
`OPERAND_STATS`: the wire's two arrays one after the other, as sent. The float64 bits are
stored as they are (NaN, its payload, ±inf and -0.0 come back bit for bit on both dialects: a
blob is opaque bytes), uncompressed: the mantissas of measured fractions and errors do not
compress, and a fixed offset per (layer, operand, recipe) lets a trend read 72 bytes of a row
(`value_at`, `operand_at`) instead of the whole row. `layers` and `recipes` are comma-joined
text ("0,3,5"; "fp8_tensorwise,mxfp8"): shorter than int32 values below 1000 layers, and the
SQL of both dialects finds an entry's position in them.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement

OPERANDS = ("input", "weight", "grad_output")
"""A Linear/Conv module's three GEMM operands."""
FORMAT_STATS = ("underflow_frac", "saturated_frac", "rel_rmse", "scale_min_frac",
                "scale_max_frac")
"""Per (operand, recipe): what the recipe's quantisation does to the operand."""
OPERAND_STATS = ("amax", "rms", "kurtosis", "nonfinite_frac")
"""Per operand: the operand itself, whatever the recipe."""
SCALE_BINS = 16
SCALE_WIDTH = 1 + SCALE_BINS
"""Per (operand, recipe): the greatest exponent of the blocks' scales (NaN: no block holds a
non-zero value), then the blocks' counts by binades below it, the last bin that many or more."""
MAX_RECIPES = 16
RECIPE_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
"""A recipe's name: a newer hook's recipe is stored, not refused, so names are checked by form
(`fp8_tensorwise`, `mxfp8`, `nvfp4`, …), never against a list."""
RECIPES_LENGTH = MAX_RECIPES * 32 + MAX_RECIPES - 1
"""The longest comma-joined `recipes` column: 16 names of 32 characters."""
VALUE_BYTES = 8
STATS_BYTES = len(FORMAT_STATS) * VALUE_BYTES
"""One (layer, operand, recipe)'s five statistics: the bytes a trend cuts from `values`."""
OPERAND_BYTES = len(OPERAND_STATS) * VALUE_BYTES
"""One (layer, operand)'s four statistics: the bytes a trend cuts from `operands`."""
SCALES_BYTES = SCALE_WIDTH * VALUE_BYTES
"""One (layer, operand, recipe)'s block scale exponents: the bytes a trend cuts from `scales`."""

Offset = TypeVar("Offset", int, "ColumnElement[int]")


def values_count(layers: int, recipes: int) -> int:
    return layers * len(OPERANDS) * recipes * len(FORMAT_STATS)


def operands_count(layers: int) -> int:
    return layers * len(OPERANDS) * len(OPERAND_STATS)


def scales_count(layers: int, recipes: int) -> int:
    return layers * len(OPERANDS) * recipes * SCALE_WIDTH


def scales_at(position: Offset, operand: int, recipe: Offset, recipes: Offset) -> Offset:
    """Byte offset in `scales` of one (layer, operand, recipe)'s `SCALE_WIDTH` values, as
    `value_at`."""
    return ((position * len(OPERANDS) + operand) * recipes + recipe) * SCALE_WIDTH * VALUE_BYTES


def value_at(position: Offset, operand: int, recipe: Offset, recipes: Offset) -> Offset:
    """Byte offset in `data` of the five statistics of the layer at `position` (in the row's
    `layers`), `operand` (index in `OPERANDS`) and the recipe at `recipe` of `recipes`: ints,
    or SQL expressions over the row's columns (the repository's trend)."""
    return ((position * len(OPERANDS) + operand) * recipes + recipe) * STATS_BYTES


def operand_at(position: Offset, operand: int, layers: Offset, recipes: Offset) -> Offset:
    """Byte offset in `data` of the four operand statistics of the layer at `position`."""
    return (layers * len(OPERANDS) * recipes * len(FORMAT_STATS) * VALUE_BYTES
            + (position * len(OPERANDS) + operand) * OPERAND_BYTES)


def join(items: Sequence[int | str]) -> str:
    """`layers` or `recipes` as stored: comma-joined."""
    return ",".join(map(str, items))


def split_layers(text: str) -> list[int]:
    return [int(item) for item in text.split(",")]


def split_recipes(text: str) -> list[str]:
    return text.split(",")


def join_trained(names: Sequence[str | None]) -> str:
    """Per layer the recipe its module trains in, comma-joined, an empty entry for none."""
    return ",".join(name or "" for name in names)


def split_trained(text: str) -> list[str | None]:
    return [name or None for name in text.split(",")]


def pack(values: Sequence[float]) -> bytes:
    """float64 values as little-endian bytes."""
    packed = array("d", values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack(data: bytes) -> list[float]:
    """The float64 values of little-endian bytes (a whole number of them)."""
    values = array("d")
    values.frombytes(data)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


@dataclass(frozen=True, slots=True)
class Unpacked:
    """A stored row as the wire's lists: the flat `values` and `operands` in their orders."""

    recipes: list[str]
    layers: list[int]
    values: list[float]
    operands: list[float]


def unpack_row(recipes: str, layers: str, data: bytes) -> Unpacked:
    """A `step_formats` row's columns as the wire's lists."""
    names, indices, flat = split_recipes(recipes), split_layers(layers), unpack(data)
    split = values_count(len(indices), len(names))
    return Unpacked(names, indices, flat[:split], flat[split:])


def split_trained_data(data: bytes) -> tuple[list[float], list[float]]:
    """A row's `trained_data` as (amax, scale), each layers x operands long."""
    values = unpack(data)
    half = len(values) // 2
    return values[:half], values[half:]


def thinned(count: int, limit: int) -> list[int]:
    """The positions (0-based, in step order) of the sampled steps a bounded read keeps: every
    one when there are at most `limit` (≥ 2), else exactly `limit` of them spread evenly, the
    first and the last included: position p is kept when it is the first whose bucket
    floor(p·(limit-1) / (count-1)) is reached. The repository selects the same rows in SQL
    (`formats_repository.sampled_steps`); this is the rule written once for its tests."""
    if count <= limit:
        return list(range(count))
    span, width = limit - 1, count - 1
    return [p for p in range(count) if p == 0 or p * span // width != (p - 1) * span // width]
