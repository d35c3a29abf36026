"""The JSON form of a float that may be non-finite: finite floats are numbers, NaN/±inf tags.

JSON has no NaN or Infinity, and Starlette refuses to emit them, so every float that can be
non-finite goes through `encode` on the way out (HTTP and WebSocket alike) and through
`decode_wire` on the way in. `null` always means "absent", never NaN. How the databases keep
the same floats is `store.float_storage`'s job.

Packed statistics (wire v5, docs/contracts.md "Wire v5"): a record's `layers` or `activations`
may arrive as `{"f64le": "<base64>"}`, the eight statistics' columns of little-endian float64
one after the other (`STAT_COLUMNS` order), decoded by `unpack_stats` with `array` in C: no
Python call per value on the common path, NaN, ±inf and -0.0 kept bit for bit.
"""

from __future__ import annotations

import base64
import binascii
import math
import sys
from array import array
from collections.abc import Mapping, Sequence
from typing import Annotated, cast

from pydantic import PlainSerializer

PACKED = "f64le"
STAT_COLUMNS = ("amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac",
                "nan_count", "inf_count", "l2")
"""The packed columns, in order (the client's `wire.LAYER_STAT_NAMES`)."""
_NULL_WHEN_NAN = frozenset({"amax", "amin_nz", "l2"})
_COUNTS = frozenset({"nan_count", "inf_count"})

NAN = "nan"
POS_INF = "inf"
NEG_INF = "-inf"
TAGS: dict[str, float] = {NAN: math.nan, POS_INF: math.inf, NEG_INF: -math.inf}

Encoded = float | str | None


class CodecError(ValueError):
    """A value that is neither a number, a non-finite tag nor null."""


def encode(value: float | None) -> Encoded:
    """Finite → itself, NaN → "nan", +inf → "inf", -inf → "-inf", None → None."""
    if value is None or math.isfinite(value):
        return value
    if math.isnan(value):
        return NAN
    return POS_INF if value > 0 else NEG_INF


def encode_rows(rows: Sequence[Sequence[float | None]]) -> list[Sequence[Encoded]]:
    """`encode` of every value of a matrix (a heatmap's z: 122,500 cells at 1M steps x 500
    layers), a row at a time: a row whose sum is finite holds no NaN or inf and goes out as it
    is, in C; only the others are encoded a value at a time."""
    out: list[Sequence[Encoded]] = []
    for row in rows:
        present = row if None not in row else [value for value in row if value is not None]
        finite = math.isfinite(sum(cast(Sequence[float], present)))
        out.append(row if finite else [encode(value) for value in row])
    return out


def decode_wire(value: object) -> float | None:
    """Parse one wire float: a JSON number, one of the tags, or null.

    Bare non-finite numbers (a `NaN` token some JSON encoders emit) are refused: the contract
    says they travel as tags, and a browser could not read them back.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise CodecError("expected a number, got a boolean")
    if isinstance(value, int):
        return float(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CodecError('non-finite numbers must be sent as "nan", "inf" or "-inf"')
        return value
    if isinstance(value, str):
        try:
            return TAGS[value]
        except KeyError:
            raise CodecError(
                f'expected a number or one of "nan", "inf", "-inf", got the string {value!r}'
            ) from None
    raise CodecError(f"expected a number, got {type(value).__name__}")


def packed(value: object) -> bool:
    """Whether a record's `layers`/`activations` arrived packed."""
    return isinstance(value, Mapping) and PACKED in value


def unpack_bytes(text: object) -> bytes:
    """The little-endian float64 bytes of a packed block's base64 text (a whole number of
    values), as sent: wire v7's `formats` stores them as they are."""
    if not isinstance(text, str):
        raise CodecError(f"{PACKED} must be a base64 string")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise CodecError(f"{PACKED} is not valid base64") from None
    if len(raw) % 8:
        raise CodecError(f"{PACKED} holds {len(raw)} bytes, not a whole number of float64s")
    return raw


def unpack_floats(text: object) -> list[float]:
    """The float64 values of a packed column block (base64 of little-endian float64)."""
    raw = unpack_bytes(text)
    values = array("d")
    values.frombytes(raw)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


def unpack_stats(value: Mapping[str, object]) -> dict[str, list[Encoded | int]]:
    """A packed statistics block as its JSON form: `{stat: [per layer]}`. The meaning is the
    JSON form's: NaN in amax, amin_nz and l2 is null (no element qualified); the counts are
    integers (a fractional or non-finite count is refused); every other non-finite value as its
    tag, so the record's validation refuses it with the JSON form's message."""
    if set(value) != {PACKED}:
        raise CodecError(f"a packed block has the one key {PACKED!r}, got {sorted(value)}")
    values = unpack_floats(value[PACKED])
    width = len(STAT_COLUMNS)
    if len(values) % width:
        raise CodecError(f"{PACKED} holds {len(values)} values, not {width} equal columns")
    n = len(values) // width
    out: dict[str, list[Encoded | int]] = {}
    for k, name in enumerate(STAT_COLUMNS):
        column: list[float] = values[k * n : (k + 1) * n]
        total = sum(column)
        plain = total - total == 0.0  # no NaN or ±inf in the column: taken as it is, in C
        if name in _COUNTS:
            if not (plain and all(map(float.is_integer, column))):
                raise CodecError(f"{PACKED}: {name} must hold whole, finite counts")
            out[name] = list(map(int, column))
        elif plain:
            out[name] = list(column)
        elif name in _NULL_WHEN_NAN:
            out[name] = [None if x != x else encode(x) for x in column]
        else:
            out[name] = [encode(x) for x in column]
    return out


def encode_values(values: Sequence[float | None]) -> Sequence[Encoded]:
    """`encode` of every value of a list, the whole list at once when it holds no NaN or inf
    (`encode_rows` of one row)."""
    return encode_rows([values])[0]


Tagged = Annotated[float, PlainSerializer(encode, return_type=float | str | None)]
"""An output float: finite → number, non-finite → "nan" / "inf" / "-inf"."""
TaggedRows = Annotated[list[list[float | None]], PlainSerializer(
    encode_rows, return_type=list[list[int | float | str | None]])]
"""A matrix of `Tagged | None`, encoded a row at a time (`encode_rows`) rather than a Python
call per value."""
TaggedValues = Annotated[list[float], PlainSerializer(
    encode_values, return_type=list[int | float | str | None])]
"""A list of `Tagged`, encoded at once (`encode_values`) rather than a Python call per value."""
