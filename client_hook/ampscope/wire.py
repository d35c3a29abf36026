"""Wire format v7 (docs/contracts.md "Wire v2" to "Wire v7"): the ingest payload and its JSON codec.

The hook's only serialisation path. JSON has no NaN or Infinity: a float that can be non-finite
travels as a number or as ``"nan"``/``"inf"``/``"-inf"``; ``None`` always means *absent*, and
``allow_nan=False`` keeps a bare NaN off the wire. Since v5 ``dumps`` packs a record's
``layers``/``activations`` as ``{"f64le": "<base64>"}`` (the columns as little-endian float64,
made in C; NaN stands for null), sparing the sender thread a ``repr`` per float under the GIL;
a block holding a tagged string stays JSON.
"""

from __future__ import annotations

import base64
import json
import math
import sys
import uuid
from array import array
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

__all__ = [
    "CAPTURED",
    "LAYER_STAT_NAMES",
    "MISUSE_KINDS",
    "RECHECK_STATUSES",
    "SCHEMA_VERSION",
    "WireFloat",
    "build_payload",
    "decode_float",
    "dumps",
    "encode_float",
    "encode_stats",
    "finite_or_none",
    "jsonable",
    "pack_stats",
    "packed",
    "step_record",
    "unpack_payload",
    "unpack_stats",
]

SCHEMA_VERSION = 8
"""v8 (#33); an older server gets batches one version lower (``ampscope.negotiate``)."""
PACKED = "f64le"
"""The key of a packed statistics block (little-endian float64 columns, base64)."""
_SLOT = f"ampscope-packed-{uuid.uuid4().hex}"
"""Stands for a packed block's base64 text in ``dumps``, spliced in afterwards."""

CAPTURED = ("before_unscale", "after_unscale")
"""Values of a record's ``captured``: the grads were still scaled, or the loop had unscaled them."""

MISUSE_KINDS = ("step_bypassed_scaler", "clip_before_unscale", "unscale_twice")

RECHECK_STATUSES = ("persisted", "vanished", "failed")
"""``recheck.status``: the non-finite values persisted in FP32, vanished, or the closure raised."""

LAYER_STAT_NAMES: tuple[str, ...] = (
    "amax",
    "amin_nz",
    "zero_frac",
    "subnormal_frac",
    "underflow_frac",
    "nan_count",
    "inf_count",
    "l2",
)
"""Keys of a record's ``layers`` object, in contract order."""

WireFloat: TypeAlias = "float | str | None"
JSON: TypeAlias = Any

_COUNT_STATS = frozenset({"nan_count", "inf_count"})
# Defined over finite elements only: a non-finite value here means "no element qualified".
_FINITE_OR_NULL_STATS = frozenset({"amax", "amin_nz", "l2"})


def encode_float(x: float | None) -> WireFloat:
    """A finite float as itself, NaN/±inf as their string tags, None as None (absent)."""
    if x is None:
        return None
    x = float(x)
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return "nan"
    return "inf" if x > 0 else "-inf"


def decode_float(x: WireFloat) -> float | None:
    """The inverse of ``encode_float``."""
    if x is None:
        return None
    if isinstance(x, str):
        if x not in ("nan", "inf", "-inf"):
            raise ValueError(f"not a float tag: {x!r} (expected 'nan', 'inf' or '-inf')")
        return float(x)
    return float(x)


def finite_or_none(x: float) -> float | None:
    """For statistics defined over finite elements: NaN (nothing qualified) becomes null."""
    return x if math.isfinite(x) else None


def jsonable(value: object) -> JSON:
    """A JSON-safe copy of user-given data (``config``): floats tagged, unknown objects as str."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return encode_float(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, Sequence | set | frozenset):
        return [jsonable(v) for v in value]
    return str(value)


def encode_stats(stats: Mapping[str, Sequence[float]]) -> dict[str, list[JSON]]:
    """``{stat: values}`` (NaN for "none") → wire arrays: counts as ints, amax/amin_nz/l2 null
    when not finite. A row with a finite sum (no NaN or ±inf) converts by ``map(float, …)`` in
    C, not a Python call per value: the sender thread holds the GIL training wants."""
    encoded: dict[str, list[JSON]] = {}
    for name in LAYER_STAT_NAMES:
        values = stats[name]
        if name in _COUNT_STATS:
            encoded[name] = list(map(round, values))
            continue
        total = sum(values)
        if total - total == 0.0:  # NaN for a NaN or ±inf anywhere (or an overflowed sum)
            encoded[name] = list(map(float, values))
        elif name in _FINITE_OR_NULL_STATS:  # ``finite_or_none`` inline: no frame per value
            encoded[name] = [float(v) if v - v == 0.0 else None for v in values]
        else:
            encoded[name] = [encode_float(v) for v in values]
    return encoded


def step_record(
    *,
    seq: int,
    step: int,
    wall_time: float,
    loss: float | None,
    scale_before: float,
    scale_after: float,
    growth_tracker: int | None,
    found_inf: bool,
    skipped: bool,
    grad_norm: float | None,
    lr: float | None,
    duration: float | None,
    layers: Mapping[str, Sequence[float]] | None,
    captured: str | None = None,
    nonfinite: Sequence[Mapping[str, JSON]] | None = None,
    misuse: Sequence[Mapping[str, JSON]] | None = None,
    activations: Mapping[str, Sequence[float]] | None = None,
    histogram: Mapping[str, JSON] | None = None,
    recheck: Mapping[str, JSON] | None = None,
    shadow: Mapping[str, JSON] | None = None,
    swallowed: Sequence[float | None] | None = None,
    ranks: Mapping[str, Sequence[JSON]] | None = None,
    optimizers: Sequence[Mapping[str, JSON]] | None = None,
    formats: Mapping[str, JSON] | None = None,
) -> dict[str, JSON]:
    """One wire record (docs/contracts.md): ``layers``/``activations`` map ``LAYER_STAT_NAMES``
    to values as computed (encoded unless packed); other blocks pass as given (None: not
    measured); ``shadow`` and ``formats`` only when given (else no key)."""
    if captured is not None and captured not in CAPTURED:
        raise ValueError(f"captured must be one of {CAPTURED} or None, not {captured!r}")
    return {
        "seq": seq,
        "step": step,
        "wall_time": wall_time,
        "loss": encode_float(loss),
        "scale_before": encode_float(scale_before),
        "scale_after": encode_float(scale_after),
        "growth_tracker": growth_tracker,
        "found_inf": found_inf,
        "skipped": skipped,
        "grad_norm": encode_float(grad_norm),
        "lr": encode_float(lr),
        "duration": duration,
        "layers": None if layers is None else _block(layers),
        "captured": captured,
        "nonfinite": None if nonfinite is None else [dict(n) for n in nonfinite],
        "misuse": None if misuse is None else [dict(m) for m in misuse],
        "activations": None if activations is None else _block(activations),
        "histogram": None if histogram is None else dict(histogram),
        "recheck": None if recheck is None else dict(recheck),
        "swallowed": None if swallowed is None else list(swallowed),
        "ranks": None if ranks is None else {k: list(v) for k, v in ranks.items()},
        "optimizers": None if optimizers is None else [dict(o) for o in optimizers],
    } | ({} if shadow is None else {"shadow": dict(shadow)}) | (
        {} if formats is None else {"formats": dict(formats)})


def _block(stats: Mapping[str, Any]) -> dict[str, JSON]:
    """A statistics block of ``step_record``: packed already (``packed``) or encoded here."""
    return dict(stats) if PACKED in stats else encode_stats(stats)


def build_payload(
    *,
    run: Mapping[str, JSON],
    attempt: Mapping[str, JSON],
    layers: Sequence[Mapping[str, JSON]] | None,
    records: Sequence[Mapping[str, JSON]],
    final: bool,
    modules: Sequence[Mapping[str, JSON]] | None = None,
    client: Mapping[str, int] | None = None,
) -> dict[str, JSON]:
    """The body of one ``POST /api/ingest`` (None: no layer table, module table or accounting)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "run": dict(run),
        "attempt": dict(attempt),
        "layers": None if layers is None else [dict(layer) for layer in layers],
        "modules": None if modules is None else [dict(m) for m in modules],
        "records": [dict(r) for r in records],
        "client": None if client is None else dict(client),
        "final": final,
    }


def packed(columns: bytes) -> dict[str, str]:
    """A packed block: the columns' native float64 bytes, null as NaN, one base64 call."""
    if sys.byteorder == "big":
        values = array("d")
        values.frombytes(columns)
        values.byteswap()
        columns = values.tobytes()
    return {PACKED: base64.b64encode(columns).decode("ascii")}


def pack_stats(stats: Mapping[str, Sequence[JSON]]) -> dict[str, str] | None:
    """An ``encode_stats`` block packed, or None where it cannot be exactly (a tagged string:
    it stays JSON); one ``array("d", column)`` in C per column, nulls as NaN."""
    values = array("d")
    for name in LAYER_STAT_NAMES:
        column = stats[name]
        try:
            values += array("d", column)
        except TypeError:
            if name not in _FINITE_OR_NULL_STATS or str in set(map(type, column)):
                return None
            values += array("d", [math.nan if v is None else v for v in column])
    if sys.byteorder == "big":
        values.byteswap()
    return {PACKED: base64.b64encode(values.tobytes()).decode("ascii")}


def unpack_stats(block: Mapping[str, str]) -> dict[str, list[JSON]]:
    """A packed block back in ``encode_stats``' form (the server's ``codec.unpack_stats``)."""
    values = _floats(block)
    n = len(values) // len(LAYER_STAT_NAMES)
    out: dict[str, list[JSON]] = {}
    for k, name in enumerate(LAYER_STAT_NAMES):
        column = values[k * n : (k + 1) * n]
        if name in _COUNT_STATS:
            out[name] = list(map(int, column))
        elif name in _FINITE_OR_NULL_STATS:
            out[name] = [None if v != v else v for v in column]
        else:
            out[name] = column
    return out


def unpack_payload(payload: dict[str, JSON]) -> dict[str, JSON]:
    """``payload`` with every packed block of its records in JSON form again, in place: the
    statistics blocks as ``encode_stats`` makes them, ``formats``' arrays as flat tagged lists."""
    for record in payload.get("records") or ():
        for name in ("layers", "activations"):
            block = record.get(name)
            if isinstance(block, dict) and PACKED in block:
                record[name] = unpack_stats(block)
        formats = record.get("formats")
        for parent, names in ((formats, ("values", "operands", "scales")),
                              (formats.get("trained") if isinstance(formats, dict) else None,
                               ("amax", "scale"))):
            if not isinstance(parent, dict):
                continue
            for name in names:
                block = parent.get(name)
                if isinstance(block, dict) and PACKED in block:
                    parent[name] = [encode_float(v) for v in _floats(block)]
    return payload


def _floats(block: Mapping[str, str]) -> list[float]:
    values = array("d")
    values.frombytes(base64.b64decode(block[PACKED], validate=True))
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


def dumps(payload: Mapping[str, JSON]) -> bytes:
    """Compact UTF-8 JSON, statistics packed; ``ValueError`` on a bare non-finite float."""
    texts: list[str] = []
    records = payload.get("records")
    if records:
        slotted, spelled = [], []
        for record in records:
            slots, blocks = {}, {}
            for name, block in record.items():
                if (name != "layers" and name != "activations") or block is None:
                    continue
                packed = block if PACKED in block else pack_stats(block)
                if packed is None:  # a tagged string: the JSON arrays
                    continue
                texts.append(packed[PACKED])
                slots[name] = {**packed, PACKED: _SLOT}
                blocks[name] = packed
            slotted.append({**record, **slots} if slots else record)
            spelled.append({**record, **blocks} if blocks else record)
        payload = {**payload, "records": slotted}
    body = json.dumps(payload, allow_nan=False, separators=(",", ":")).encode("utf-8")
    if not texts:
        return body
    pieces = body.split(_SLOT.encode("ascii"))
    if len(pieces) != len(texts) + 1:  # the slot's text is elsewhere too (a config): no splice
        payload = {**payload, "records": spelled}
        return json.dumps(payload, allow_nan=False, separators=(",", ":")).encode("utf-8")
    out = [pieces[0]]
    for text, piece in zip(texts, pieces[1:], strict=True):
        out += (text.encode("ascii"), piece)
    return b"".join(out)
