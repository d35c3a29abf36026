"""How a float column keeps NaN, ±inf and -0.0 in both databases: the value beside its class.

SQLite stores NaN as NULL and an integer-valued REAL as an integer, so a nullable float column
is stored as (finite value or NULL, `FloatClass`) and read back exactly on both dialects. The
JSON form of the same floats is `runs.json_floats`'.
"""

from __future__ import annotations

import math


class FloatClass:
    """The storage marker beside each nullable float column: SQLite stores NaN as NULL, and an
    integer-valued REAL as an integer, so -0.0 comes back as 0.0 without its own class."""

    FINITE_OR_NULL = 0
    NAN = 1
    POS_INF = 2
    NEG_INF = 3
    NEG_ZERO = 4


def to_storage(value: float | None) -> tuple[float | None, int]:
    """Split a float into (finite value or None, FloatClass) for the database."""
    if value is None:
        return value, FloatClass.FINITE_OR_NULL
    if math.isfinite(value):
        if value == 0.0 and math.copysign(1.0, value) < 0:
            return value, FloatClass.NEG_ZERO
        return value, FloatClass.FINITE_OR_NULL
    if math.isnan(value):
        return None, FloatClass.NAN
    return None, FloatClass.POS_INF if value > 0 else FloatClass.NEG_INF


def from_storage(value: float | None, cls: int) -> float | None:
    """Inverse of `to_storage`."""
    if cls == FloatClass.NAN:
        return math.nan
    if cls == FloatClass.POS_INF:
        return math.inf
    if cls == FloatClass.NEG_INF:
        return -math.inf
    if cls == FloatClass.NEG_ZERO:
        return -0.0
    return value
