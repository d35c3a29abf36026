"""Hand-built wire v1 batches (docs/contracts.md) for the server tests."""

from __future__ import annotations

import base64
import copy
import json
import math
import struct
import uuid
from typing import Any

RUN_ID = "3f0c2a4e-1b2c-4d3e-8f40-5a6b7c8d9e0f"
ATTEMPT_ID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
LAYERS: list[dict[str, Any]] = [
    {"index": 0, "name": "fc1.weight", "shape": [16, 8], "dtype": "float32", "numel": 128,
     "module_type": "Linear"},
    {"index": 1, "name": "fc1.bias", "shape": [16], "dtype": "float32", "numel": 16,
     "module_type": "Linear"},
]


def layers_read(layers: list[dict[str, Any]] = LAYERS) -> list[dict[str, Any]]:
    """The layer table as the API gives it back: `raw_name` (optional on the wire since issue
    #13) is `name` where a client sent none."""
    return [{**layer, "raw_name": layer.get("raw_name", layer["name"])} for layer in layers]


def layer_stats(seed: float = 1.0, n: int = 2) -> dict[str, list[Any]]:
    return {
        "amax": [0.5 * seed, 0.25][:n] + [0.125] * max(0, n - 2),
        "amin_nz": [1e-9, None][:n] + [1e-7] * max(0, n - 2),
        "zero_frac": [0.0, 0.125][:n] + [0.0] * max(0, n - 2),
        "subnormal_frac": [0.0, 0.0625][:n] + [0.0] * max(0, n - 2),
        "underflow_frac": [0.0, 0.03125][:n] + [0.0] * max(0, n - 2),
        "nan_count": [0, 3][:n] + [0] * max(0, n - 2),
        "inf_count": [0, 2][:n] + [0] * max(0, n - 2),
        "l2": [1.2 * seed, 0.3][:n] + [0.1] * max(0, n - 2),
    }


def record(seq: int, *, step: int | None = None, with_layers: bool = True,
           **overrides: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "seq": seq,
        "step": seq if step is None else step,
        "wall_time": 1764430001.25 + seq,
        "loss": 2.31 - 0.01 * seq,
        "scale_before": 65536.0,
        "scale_after": 65536.0,
        "growth_tracker": seq,
        "found_inf": False,
        "skipped": False,
        "grad_norm": 0.75,
        "lr": 0.001,
        "duration": None if seq == 0 else 0.0123,
        "layers": layer_stats(1.0 + seq) if with_layers else None,
    }
    rec.update(overrides)
    return rec


def batch(records: list[dict[str, Any]], *, run_id: str = RUN_ID, attempt_id: str | None = None,
          layers: list[dict[str, Any]] | None = LAYERS, final: bool = False,
          **run_overrides: Any) -> dict[str, Any]:
    run = {
        "id": run_id, "project": "default", "name": "demo", "tags": ["amp", "cpu"],
        "config": {"lr": 0.001, "nested": {"a": [1, 2]}}, "host": "hostname", "rank": 0,
        "target_format": "fp16",
    }
    run.update(run_overrides)
    if attempt_id is None:  # one attempt per run unless told otherwise
        attempt_id = ATTEMPT_ID if run_id == RUN_ID else str(uuid.uuid5(uuid.NAMESPACE_URL, run_id))
    return {
        "schema_version": 1,
        "run": run,
        "attempt": {"id": attempt_id, "pid": 1234, "started_at": 1764430000.5},
        "layers": copy.deepcopy(layers),
        "records": copy.deepcopy(records),
        "final": final,
    }


def new_id() -> str:
    return str(uuid.uuid4())


def _reject_constant(token: str) -> Any:
    raise ValueError(f"bare {token} in a JSON body")


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN/Infinity tokens, as a browser's JSON.parse does."""
    return json.loads(text, parse_constant=_reject_constant)


# --- wire v2 -------------------------------------------------------------------------------------

MODULES: list[dict[str, Any]] = [
    {"index": 0, "name": "fc1", "module_type": "Linear"},
    {"index": 1, "name": "act", "module_type": "ReLU"},
    {"index": 2, "name": "fc2", "module_type": "Linear"},
]
CLIENT: dict[str, int] = {
    "produced": 10, "acknowledged": 6, "spooled": 2, "dropped": 1, "replayed": 2}


def histogram(min_exp: int = -4, max_exp: int = 2,
              numels: tuple[int, ...] = (128, 16)) -> dict[str, Any]:
    """A valid histogram for LAYERS: each layer's count sits in a few bins, summing to numel."""
    bins = max_exp - min_exp + 5
    counts = []
    for numel in numels:
        row = [0] * bins
        row[0], row[1], row[3], row[-1] = 1, 2, 3, numel - 6
        counts.append(row)
    return {"min_exp": min_exp, "max_exp": max_exp, "counts": counts}


def activations(n: int = 3) -> dict[str, list[Any]]:
    return {
        "amax": [0.5, "inf", None][:n],
        "amin_nz": [1e-30, "nan", 0.0][:n],
        "zero_frac": [0.0, 0.5, 1.0][:n],
        "subnormal_frac": [0.25, 0.0, 0.0][:n],
        "underflow_frac": [0.125, 0.0, 0.0][:n],
        "nan_count": [0, 7, 0][:n],
        "inf_count": [0, 2**40, 0][:n],
        "l2": [3.0, "inf", None][:n],
    }


def record_v2(seq: int, *, with_layers: bool = True, **overrides: Any) -> dict[str, Any]:
    """A v1 record with every v2 field at its "not measured" value unless overridden."""
    rec = record(seq, with_layers=with_layers, captured=None, nonfinite=None, misuse=None,
                 activations=None, histogram=None)
    rec.update(overrides)
    return rec


def batch_v2(records: list[dict[str, Any]], *, modules: list[dict[str, Any]] | None = MODULES,
             client: dict[str, int] | None = None, **kwargs: Any) -> dict[str, Any]:
    payload = batch(records, **kwargs)
    payload.update(schema_version=2, modules=copy.deepcopy(modules),
                   client=None if client is None else dict(client))
    return payload


# --- wire v7 -------------------------------------------------------------------------------------

RECIPES = ["fp8_tensorwise", "fp8_rowwise", "fp8_block128", "mxfp8", "mxfp4", "nvfp4"]
"""The recipes the hook knows today (the server takes any name of the right form)."""


def f64le(values: list[float]) -> dict[str, str]:
    """A packed block: base64 of the values as little-endian float64 (bits as given)."""
    return {"f64le": base64.b64encode(struct.pack(f"<{len(values)}d", *values)).decode("ascii")}


def tagged(values: list[float]) -> list[Any]:
    """The values as the JSON form sends them: non-finite ones as "nan", "inf", "-inf"."""
    return [v if math.isfinite(v) else "nan" if math.isnan(v) else "inf" if v > 0 else "-inf"
            for v in values]


def format_values(layers: list[int], recipes: list[str], seed: float = 0.0
                  ) -> tuple[list[float], list[float]]:
    """(values, operands) of a `formats` block, each value telling where it sits: value
    (l, o, r, s) is seed + l + o/10 + r/100 + s/1000 of the l-th listed layer (its position),
    operand statistic (l, o, k) is seed + l + o/10 + k/100 + 0.5; all finite."""
    values = [seed + position + operand / 10 + recipe / 100 + stat / 1000
              for position in range(len(layers)) for operand in range(3)
              for recipe in range(len(recipes)) for stat in range(5)]
    operands = [seed + position + operand / 10 + stat / 100 + 0.5
                for position in range(len(layers)) for operand in range(3) for stat in range(4)]
    return values, operands


def scale_values(layers: list[int], recipes: list[str], seed: int = 0) -> list[float]:
    """A `formats.scales` array (wire v8), each (l, o, r) telling where it sits: top exponent
    seed mod 100 - 10·l - o of the l-th listed layer (within float64's exponents up to 100
    layers), counts l + 1, o, r, then zeros."""
    out: list[float] = []
    for position in range(len(layers)):
        for operand in range(3):
            for recipe in range(len(recipes)):
                counts = [position + 1.0, float(operand), float(recipe)] + [0.0] * 13
                out += [float(seed % 100 - 10 * position - operand), *counts]
    return out


def formats(layers: list[int], recipes: list[str] = RECIPES[:2], seed: float = 0.0,
            packed: bool = True, scales: bool = False) -> dict[str, Any]:
    """A `formats` block (wire v7) of `format_values`, packed or as JSON arrays; with `scales`
    (wire v8) `scale_values`' too."""
    values, operands = format_values(layers, recipes, seed)
    encode = f64le if packed else tagged
    block = {"recipes": list(recipes), "layers": list(layers), "values": encode(values),
             "operands": encode(operands)}
    if scales:
        block["scales"] = encode(scale_values(layers, recipes, int(seed)))
    return block
