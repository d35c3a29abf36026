"""What share of a layer's gradient the format loses, told apart from zeros that are structural.

A gradient statistic counts two different things as "small": values that are non-zero but would
flush to 0 in the target format at the current scale (`underflow_frac`, lost to the format by
definition), and elements that are exactly 0 (`zero_frac`). Exact zeros are not all underflow:

- in an FP32 master gradient (autocast) a zero is usually *structural*: a dead ReLU unit, an
  unused embedding row, a masked position. A healthy ReLU network has many.
- but an FP16 activation gradient that flushed to 0 upstream also reaches the FP32 master
  gradient as an exact 0 (the whisper branch of the demo; a layer fed inputs of 1e-4 at scale 1).

Without an FP32 reference of the same step nothing tells the two apart for certain, so the
judgement is made on the layer's own distribution (`zeros_flushed`): its zeros count as lost
when the whole dense gradient is 0, or when its non-zero values press on the format's floor
(FLOOR_PRESSURE_FRAC of them subnormal); otherwise they are structural and shown apart. Sparse
modules (embeddings) never count their zeros. docs/findings.md says the same for users.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampscope_server.findings.facts import LayerInfo, LayerSample
from ampscope_server.findings.thresholds import FLOOR_PRESSURE_FRAC, SPARSE_MODULE_TYPES


def zeros_flushed(sample: LayerSample, layer: LayerInfo) -> bool:
    """Whether `sample`'s exact zeros count as lost to the format (module docstring)."""
    if sample.zero_frac <= 0 or layer.module_type in SPARSE_MODULE_TYPES:
        return False
    if sample.zero_frac >= 1.0:
        return True  # a dense gradient entirely 0: not a structure, a flush (or an unused layer)
    nonzero = 1.0 - sample.zero_frac
    return sample.subnormal_frac >= FLOOR_PRESSURE_FRAC * nonzero


def lost_to_format(sample: LayerSample, layer: LayerInfo) -> float:
    """The share of the gradient lost to the format at the sample's scale: values that would
    flush, plus the exact zeros when `zeros_flushed` says they are the format's doing."""
    zeros = sample.zero_frac if zeros_flushed(sample, layer) else 0.0
    return min(1.0, sample.underflow_frac + zeros)


def structural_zeros(sample: LayerSample, layer: LayerInfo) -> float:
    """The share of exact zeros not counted as lost (dead units, unused rows)."""
    return 0.0 if zeros_flushed(sample, layer) else sample.zero_frac


@dataclass(frozen=True)
class LayerLoss:
    """One layer's median loss over the recent layer-stat steps: what the run page's card and
    the runs list show, by the same definition as `gradient_underflow`."""

    layer: str
    lost_frac: float
    """Median of `lost_to_format` over `steps` layer-stat steps."""
    structural_zero_frac: float
    """Median of `structural_zeros` over the same steps (shown apart, never a warning)."""
    steps: int
