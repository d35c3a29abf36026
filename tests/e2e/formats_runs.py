"""Three runs for the Formats view's browser tests (test_formats_browser.py), wire v8 and v7
batches built by hand so that every number on the page is known.

Each sampled step (0, 100, 200) gives every Linear weight's input, weight and output gradient
what ampscope.recipes measures on a Gaussian operand (`TYPICAL`), but for three cells:
- `FC2`'s gradient under mxfp8 flushes `FC2_UNDERFLOW[k]` of its elements (its blocks' scales
  pinned at their least in 30 % of them): 4x the other layers' median and past the 1 % floor,
  so MXFP8 keeps it in BF16 (findings/recipe_fit, the outlier rule);
- `HEAD`'s gradient under nvfp4 has a relative error of 0.7 (SNR 3.1 dB, under sqrt(3)'s
  4.77): NVFP4 keeps it in BF16 (the gradient-noise rule);
- `AUX`'s gradient is NaN everywhere: the module got no gradient ("not measured").
Its block scales' exponents (wire v8): 10 blocks at the top, 2^-8, in every cell but `FC2`'s
gradient under mxfp8, whose top falls with its amax (`FC2_TOPS`) and whose pinned 30 % sit 15
binades or more below it.

`HEAD` really trains in fp8_tensorwise (torchao's Float8Linear; `trained`): at the k-th sample
its input and weight amax 2 + k under scale 448 / amax, its gradient's amax (still multiplied
by the loss scale, 2^16) under 57344 / amax.

`normed` is `sampled`'s model with a LayerNorm (`LN`) whose affine weight is measured alone (its
input and output gradient NaN): no recipe flushes it but MXFP4 and NVFP4, which flush
`LN_FLUSHED` of its gains, so a fully quantised run keeps it in BF16 under those two.

`twin` is the same model trained otherwise (the compare page's other run), by a hook before v8
(no exponents): a layer `PROJ` that the first lacks and no `AUX`, a healthy `FC2`, the same
`HEAD`. `plain` sends no formats.
"""

from __future__ import annotations

import math
from typing import Any

from tests.server.wire import RECIPES, batch_v2, record_v2, tagged

STEPS = 300
SAMPLED = (0, 100, 200)
QKV, QKV_BIAS, FC1, FC2, HEAD, AUX, PROJ = (
    "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.mlp.fc1.weight",
    "blocks.0.mlp.fc2.weight", "head.weight", "aux_head.weight", "blocks.0.attn.proj.weight")
FC2_UNDERFLOW = (0.05, 0.08, 0.12)
FC2_SCALE_MIN = 0.3
FC2_TOPS = (-8, -11, -14)
"""ceil(log2(amax / 448)) of FC2's gradient amax, 1.5 · 10^-k (MXFP8's RCEIL scale)."""
HEAD_ERROR = 0.7
LN = "blocks.0.ln.weight"
LN_FLUSHED = 0.6875
OPERANDS = ("input", "weight", "grad_output")
TYPICAL: dict[str, tuple[float, float, float]] = {
    "fp8_tensorwise": (0.0, 0.0, 0.027), "fp8_rowwise": (0.0, 0.0, 0.026),
    "fp8_block128": (0.0, 0.0005, 0.026), "mxfp8": (0.0005, 0.0, 0.026),
    "mxfp4": (0.11, 0.0, 0.116), "nvfp4": (0.066, 0.034, 0.096)}
"""(underflow_frac, saturated_frac, rel_rmse) per recipe, as measured on a Gaussian operand."""
E5M2_ERROR = 0.053
"""fp8_tensorwise's gradients are E5M2: two mantissa bits."""


def _layer(index: int, name: str, shape: list[int], module_type: str = "Linear"
           ) -> dict[str, Any]:
    return {"index": index, "name": name, "shape": shape, "dtype": "float32",
            "numel": math.prod(shape), "module_type": module_type}


def layer_table(names: list[str]) -> list[dict[str, Any]]:
    return [_layer(i, name, [8], "LayerNorm") if name == LN
            else _layer(i, name, [4] if name.endswith("bias") else [4, 8])
            for i, name in enumerate(names)]


def cell(name: str, operand: str, recipe: str, k: int, *, fc2_outlier: bool = True
         ) -> list[float]:
    """The five statistics of one (layer, operand, recipe) at the k-th sampled step."""
    if (name == AUX and operand == "grad_output") or (name == LN and operand != "weight"):
        return [math.nan] * 5
    underflow, saturated, error = TYPICAL[recipe]
    if name == LN:
        underflow = LN_FLUSHED if recipe in ("mxfp4", "nvfp4") else 0.0
    scale_min, scale_max = 0.0, 0.02 if recipe == "nvfp4" else 0.0
    if operand == "grad_output" and recipe == "fp8_tensorwise":
        error = E5M2_ERROR
    if name == FC2 and operand == "grad_output" and recipe == "mxfp8" and fc2_outlier:
        underflow, scale_min = FC2_UNDERFLOW[k], FC2_SCALE_MIN
    if name == HEAD and operand == "grad_output" and recipe == "nvfp4":
        error = HEAD_ERROR
    return [underflow, saturated, error, scale_min, scale_max]


def scale_exponents(name: str, operand: str, recipe: str, k: int) -> list[float]:
    """The block scales' top exponent and 16 counts of one (layer, operand, recipe)."""
    if (name == AUX and operand == "grad_output") or (name == LN and operand != "weight"):
        return [math.nan] * 17
    if name == FC2 and operand == "grad_output" and recipe == "mxfp8":
        return [float(FC2_TOPS[k]), 7.0] + [0.0] * 14 + [3.0]
    return [-8.0, 10.0] + [0.0] * 15


def operand_stats(name: str, operand: str, k: int) -> list[float]:
    """amax, rms, kurtosis, nonfinite_frac of one operand at the k-th sampled step."""
    if (name == AUX and operand == "grad_output") or (name == LN and operand != "weight"):
        return [math.nan, math.nan, math.nan, 0.0]
    if name == FC2 and operand == "grad_output":
        return [1.5 * 10.0 ** -k, 0.01 * 10.0 ** -k, 40.0 + k, 0.0]
    return [2.0 + k, 0.5, 3.0, 0.0]


def formats_block(names: list[str], listed: list[int], k: int, *, fc2_outlier: bool = True,
                  scales: bool = True) -> dict[str, Any]:
    """The k-th sampled step's `formats` of the layers `listed` (layer-table indices), with
    their block scales' exponents (v8) if `scales`."""
    values = [v for i in listed for o in OPERANDS for r in RECIPES
              for v in cell(names[i], o, r, k, fc2_outlier=fc2_outlier)]
    operands = [v for i in listed for o in OPERANDS for v in operand_stats(names[i], o, k)]
    block = {"recipes": list(RECIPES), "layers": list(listed), "values": tagged(values),
             "operands": tagged(operands)}
    if scales:
        block["scales"] = tagged([v for i in listed for o in OPERANDS for r in RECIPES
                                  for v in scale_exponents(names[i], o, r, k)])
    if HEAD in (names[i] for i in listed):
        amax = [[2.0 + k, 2.0 + k, (2.0 + k) * 65536] if names[i] == HEAD else [math.nan] * 3
                for i in listed]
        scale = [[448 / a[0], 448 / a[1], 57344 / a[2]] for a in amax]
        block["trained"] = {"recipes": ["fp8_tensorwise" if names[i] == HEAD else None
                                        for i in listed],
                            "amax": tagged([v for row in amax for v in row]),
                            "scale": tagged([v for row in scale for v in row])}
    return block


def _batch(run_id: str, name: str, names: list[str], blocks: dict[int, dict[str, Any]],
           version: int) -> dict[str, Any]:
    records = []
    for step in range(STEPS):
        record = record_v2(step, with_layers=False, loss=2.0 - step / 1000)
        if step in blocks:
            record["formats"] = blocks[step]
        records.append(record)
    payload = batch_v2(records, run_id=run_id, name=name, layers=layer_table(names), final=True)
    return dict(payload, schema_version=version)


NAMES = [QKV, QKV_BIAS, FC1, FC2, HEAD, AUX]
LISTED = [0, 2, 3, 4, 5]
TWIN_NAMES = [QKV, QKV_BIAS, PROJ, FC1, FC2, HEAD]
TWIN_LISTED = [0, 2, 3, 4, 5]


def sampled(run_id: str) -> dict[str, Any]:
    blocks = {step: formats_block(NAMES, LISTED, k) for k, step in enumerate(SAMPLED)}
    return _batch(run_id, "bf16-baseline", NAMES, blocks, 8)


def live(run_id: str) -> list[dict[str, Any]]:
    """`sampled`'s run as it trains, in three batches none of them final: steps 0-149 (samples
    0 and 100), 150-299 (200), then step 300, sampled again as step 200 was."""
    whole = sampled(run_id)
    later = dict(whole, records=[{**record_v2(STEPS, with_layers=False),
                                  "formats": formats_block(NAMES, LISTED, 2)}])
    return [dict(whole, records=whole["records"][:150], final=False),
            dict(whole, records=whole["records"][150:], final=False), dict(later, final=False)]


def normed(run_id: str) -> dict[str, Any]:
    names = [*NAMES, LN]
    blocks = {step: formats_block(names, [*LISTED, len(NAMES)], k)
              for k, step in enumerate(SAMPLED)}
    return _batch(run_id, "with-layernorm", names, blocks, 8)


def twin(run_id: str) -> dict[str, Any]:
    blocks = {step: formats_block(TWIN_NAMES, TWIN_LISTED, k, fc2_outlier=False, scales=False)
              for k, step in enumerate(SAMPLED)}
    return _batch(run_id, "fp8-twin", TWIN_NAMES, blocks, 7)


def plain(run_id: str) -> dict[str, Any]:
    """An older hook's run: wire v2, no formats."""
    return _batch(run_id, "no-formats", NAMES, {}, 2)
