"""Scaled low-precision recipes: what FP8, MXFP8, MXFP4 or NVFP4 training would do to one operand.

A recipe is an element format plus how its scales are chosen (DESIGN.md §3). ``sample`` takes
a GEMM operand (a ``Linear``'s input, weight or output gradient) as it goes by; ``measure``
quantises many operands' samples at once as each recipe would, in torch ops on their device,
and returns the statistics as one float64 tensor: no host sync, no Python loop over elements,
a number of ops that grows with the recipes, not the operands. ``quantize`` gives one whole
operand dequantised and its block scales, which the tests hold against torch's float8 casts
and torchao's ``MXTensor`` / ``NVFP4Tensor``; the hook never imports torchao.

The operand is viewed as a matrix whose rows run along its last dimension (a ``Conv``'s channels
moved last, its weight's ``(out, in·kh·kw)``), and blocks run along those rows: the reduction
dimension of the forward GEMM. Block edges past the matrix are padded with zeros, which change
no block's amax and count in no statistic.

Element limits come from ``torch.finfo`` where torch has the dtype (E4M3, E5M2, and E8M0 for the
MX scales); E2M1 (FP4), which torch holds only packed two to a byte, from its definition: two
exponent bits with bias 1, one mantissa bit, no inf or NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["MOMENTS", "OPERANDS", "RECIPES", "SCALE_BINS", "SCALE_WIDTH", "STATS", "TRAINED",
           "Element", "Quantized", "Recipe", "Sample", "fp32_scale", "measure", "quantize",
           "sample"]

Operand = Literal["input", "weight", "grad_output"]
OPERANDS: tuple[Operand, ...] = ("input", "weight", "grad_output")

STATS = ("underflow_frac", "saturated_frac", "rel_rmse", "scale_min_frac", "scale_max_frac")
"""Per operand and recipe. ``underflow_frac``: finite non-zero elements that quantise to 0, over
all elements (as the per-layer ``underflow_frac``). ``saturated_frac``: elements the clamp to
the element format's max changes by more than rounding would (beyond max + half its step: a
value up to there rounds to max anyway; current scaling maps the amax onto max, so only a
scale from an older amax, or a future recipe's, saturates). ``rel_rmse``: ‖q(x) - x‖ / ‖x‖
over finite elements (0 for an all-zero operand); the SNR is -20·log10 of it and, for
gradients, the norm ÷ quantisation noise is its inverse. ``scale_min_frac`` /
``scale_max_frac``: of the blocks holding a non-zero value (for a row- or tensor-wise scale,
the 128-element pieces of the rows), those whose scale sits at its format's least value / was
clamped at its greatest (NVFP4's block of the tensor's amax sits at E4M3's max by design).
Non-finite elements are left out of every statistic (``MOMENTS``' ``nonfinite_frac`` counts
them)."""

MOMENTS = ("amax", "rms", "kurtosis", "nonfinite_frac")
"""Per operand, whatever the recipe, over its finite elements: the outliers' trend (amax, and
the kurtosis E[(x - mean)^4] / var^2, 3 for a Gaussian, NaN where var = 0) beside the RMS; the
share of non-finite elements. From the sample, but the amax: the whole operand's."""

SCALE_BINS = 16
SCALE_WIDTH = 1 + SCALE_BINS
"""Per operand and recipe, the exponents of the scales of the blocks holding a non-zero value
(the blocks of ``scale_min_frac``), ``SCALE_WIDTH`` values: the greatest exponent (NaN: no
such block), then the blocks' counts by how many binades below it their scale sits, ``[k]`` k
below for k < SCALE_BINS - 1, ``[last]`` that many or more. A block's scale is the one its
format stores: E8M0's power of two (MX), the E4M3 block scale under NVFP4's tensor scale, the
FP32 dequantising factor (``1 / scale`` as ``torch._scaled_mm`` takes it) of the FP8 recipes;
its exponent ⌊log2⌋. Sixteen binades span NVFP4's E4M3 block scales (2^-6 to 448) whole."""

PIECE = 128
"""Samples are cut into pieces this wide: every recipe's block (16, 32, 128) divides it."""

SAMPLE_ELEMS = 1 << 12
"""Elements of an operand ``sample`` keeps, at most: whole rows, evenly spaced (at least
one). The fractions and the error are estimated from them (a share's standard error is at most
0.8 % at 2^12), on the hook's training thread and device, on a sampled step; the scales are the
whole operand's (its amax, and a weight's 128x128 tiles' amax): one pass over the rest."""

TRAINED = ("amax", "scale")
"""Per operand of a module that really trains in a recipe (``format_probe.trained_recipe``):
what the recipe computed its scale from (the operand as it flowed: a gradient still multiplied
by the loss scale) and the scale."""

AMAX_EPS = 1e-12
"""FP32-scaled recipes clamp the amax from below here (torchao's ``float8_utils.EPS``)."""


@dataclass(frozen=True)
class Element:
    """One element format: its largest finite magnitude, its least normal one and its mantissa
    bits; ``dtype`` is torch's cast, or None where torch has none (E2M1, rounded here)."""

    name: str
    max: float
    min_normal: float
    mbits: int
    dtype: torch.dtype | None

    @classmethod
    def of(cls, name: str, dtype: torch.dtype) -> Element:
        info = torch.finfo(dtype)
        return cls(name, float(info.max), float(info.tiny), round(-math.log2(info.eps)), dtype)

    @classmethod
    def defined(cls, name: str, ebits: int, mbits: int) -> Element:
        """A format with no inf or NaN encodings: every exponent code is a number."""
        bias = 2 ** (ebits - 1) - 1
        top = 2 ** ebits - 1 - bias
        return cls(name, 2.0**top * (2 - 2.0**-mbits), 2.0 ** (1 - bias), mbits, None)

    @property
    def min_subnormal(self) -> float:
        return self.min_normal * 2.0**-self.mbits

    @property
    def saturates_above(self) -> float:
        """Magnitudes beyond this lose more to the clamp than rounding to max would: max plus
        half the spacing of max's binade (E4M3: 448 + 16, E5M2: 57344 + 4096, E2M1: 6 + 1)."""
        return self.max + 2.0 ** (math.floor(math.log2(self.max)) - self.mbits) / 2


E4M3 = Element.of("e4m3", torch.float8_e4m3fn)
E5M2 = Element.of("e5m2", torch.float8_e5m2)
E2M1 = Element.defined("e2m1", ebits=2, mbits=1)
E8M0 = torch.finfo(torch.float8_e8m0fnu)
E8M0_MIN_EXP, E8M0_MAX_EXP = round(math.log2(E8M0.tiny)), round(math.log2(E8M0.max))


@dataclass(frozen=True)
class Recipe:
    """How a recipe scales and rounds. ``scale``: ``fp32`` (torchao's ``amax_to_scale``: max ÷
    amax in float32, rounded down to a power of two with ``pow2``), ``e8m0`` (MX: a power of two
    from the block's amax, RCEIL as cuBLAS and TransformerEngine) or ``nvfp4`` (E4M3 block scales
    under one FP32 tensor scale). ``block``: elements per block along a row, 0 for the whole row;
    ``rows``: rows per block, 0 for all of them (one tensor-wide scale); ``weight_rows`` for the
    weight where it differs (128x128 tiles)."""

    name: str
    forward: Element
    backward: Element
    scale: Literal["fp32", "e8m0", "nvfp4"]
    block: int
    rows: int
    weight_rows: int | None = None
    pow2: bool = False

    def element(self, operand: Operand) -> Element:
        return self.backward if operand == "grad_output" else self.forward

    def tile(self, operand: Operand) -> tuple[int, int]:
        rows = self.weight_rows if operand == "weight" and self.weight_rows else self.rows
        return rows, self.block


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("fp8_tensorwise", E4M3, E5M2, "fp32", block=0, rows=0),
    Recipe("fp8_rowwise", E4M3, E4M3, "fp32", block=0, rows=1, pow2=True),
    Recipe("fp8_block128", E4M3, E4M3, "fp32", block=128, rows=1, weight_rows=128),
    Recipe("mxfp8", E4M3, E4M3, "e8m0", block=32, rows=1),
    Recipe("mxfp4", E2M1, E2M1, "e8m0", block=32, rows=1),
    Recipe("nvfp4", E2M1, E2M1, "nvfp4", block=16, rows=1),
)}
"""``fp8_tensorwise`` is TransformerEngine's and torchao's default (E4M3 forward, E5M2 for
gradients); ``fp8_rowwise`` torchao's ``rowwise`` recipe; ``fp8_block128`` DeepSeek-V3's (1x128
activations and gradients, 128x128 weights); ``mxfp8`` torchtitan's ``mxfp8_rceil``."""


@dataclass(frozen=True)
class Quantized:
    """``values``: the operand as the recipe's GEMM sees it, dequantised, shaped as ``matrix``;
    ``scales``: each block's dequantising factor ``(row blocks, column blocks)``;
    ``exponents``: the exponent of each block's scale as its format stores it (``SCALE_WIDTH``);
    ``at_least`` / ``at_most``: blocks whose scale sits at its format's limit."""

    values: torch.Tensor
    scales: torch.Tensor
    exponents: torch.Tensor
    at_least: torch.Tensor
    at_most: torch.Tensor


def matrix(x: torch.Tensor, operand: Operand, *, channels_first: bool = False) -> torch.Tensor:
    """The operand as a ``(rows, K)`` matrix of its own dtype (a view where its layout allows)
    whose rows run along the GEMM's reduction dimension; ``channels_first`` (a ``Conv``'s input
    and output gradient) moves dim 1 last. A 1-D weight (a norm's affine weight, one value per
    channel) is one row: blocks run along it as along a row of activations."""
    x = x.detach()
    if operand == "weight":
        return x.reshape(x.shape[0], -1) if x.dim() > 1 else x.reshape(1, -1)
    if channels_first and x.dim() > 2:
        x = x.movedim(1, -1)
    return x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)


@dataclass(frozen=True)
class Sample:
    """An operand's rows to measure, cut into ``PIECE``-wide pieces (each row zero-padded to a
    whole number of them; every recipe's block divides a piece), with the amaxes a recipe's
    scales need that the pieces alone do not hold: each piece's row's, the whole operand's
    (finite elements; the sample's if the operand holds a non-finite one) and, for a weight,
    each piece's 128x128 tile's. Non-finite elements are zeros here, counted in
    ``nonfinite``; ``real`` marks the pieces' sampled finite elements (not the padding, not
    the non-finite ones) for the moments. Made on the sampled step as the operand goes by
    (``sample``); measured for many operands at once (``measure``)."""

    pieces: torch.Tensor
    real: torch.Tensor
    row_amax: torch.Tensor
    tensor_amax: torch.Tensor
    tile_amax: torch.Tensor | None
    rows: int
    cols: int
    nonfinite: torch.Tensor

    @property
    def elements(self) -> int:
        return self.rows * self.cols


def sample(x: torch.Tensor, operand: Operand, *, channels_first: bool = False,
           budget: int = SAMPLE_ELEMS) -> Sample:
    """At most ``budget`` elements of ``x`` (whole rows, evenly spaced, at least one) as a
    ``Sample``: a float32 copy of them (the pieces) and one pass over the rest, in its own
    dtype, for the amaxes."""
    full = matrix(x, operand, channels_first=channels_first)
    rows, cols = full.shape
    stride = -(-rows // max(1, budget // max(cols, 1)))
    picked = full[::stride].float()
    finite = torch.isfinite(picked)
    nonfinite = picked.numel() - torch.count_nonzero(finite)
    wide = -(-cols // PIECE) * PIECE
    padded = torch.zeros(picked.shape[0], wide, dtype=torch.float32, device=full.device)
    padded[:, :cols] = torch.where(finite, picked, 0.0)
    real = torch.zeros(padded.shape, dtype=torch.bool, device=full.device)
    real[:, :cols] = finite
    per_row = wide // PIECE
    row_amax = _amax(padded, dim=1)
    whole = _amax(full).float() if full.numel() else row_amax.amax()
    tensor_amax = torch.where(torch.isfinite(whole), whole, row_amax.amax())
    tile_amax = None
    if operand == "weight":
        tall = -(-rows // PIECE) * PIECE
        grid = full if (tall, wide) == (rows, cols) else torch.nn.functional.pad(
            full, (0, wide - cols, 0, tall - rows))
        tiles = _amax(grid.reshape(tall // PIECE, PIECE, per_row, PIECE), dim=(1, 3)).float()
        # A tile holding a NaN or inf: its scale from the sampled pieces in it.
        tile_amax = tiles.repeat_interleave(PIECE, dim=0)[:rows:stride].reshape(-1)
    pieces = padded.reshape(-1, PIECE)
    if tile_amax is not None:
        own = _amax(pieces, dim=1)
        tile_amax = torch.where(torch.isfinite(tile_amax), tile_amax, own)
    return Sample(pieces, real.reshape(-1, PIECE), row_amax.repeat_interleave(per_row),
                  tensor_amax, tile_amax, picked.shape[0], cols, nonfinite)


def _amax(x: torch.Tensor, dim: int | tuple[int, ...] = (), keepdim: bool = False
          ) -> torch.Tensor:
    """max |x| over ``dim`` (all of it: ``()``), NaN where a NaN is, +0.0 for zeros of either
    sign: ``vector_norm(x, inf)``'s value, from two vectorised reductions and no temporary of
    ``x``'s size (docs/hook-cost.md#the-formats-probes-amaxes)."""
    return torch.maximum(x.amax(dim=dim, keepdim=keepdim).abs(),
                         x.amin(dim=dim, keepdim=keepdim).abs())


def measure(samples: Sequence[Sample], recipes: tuple[Recipe, ...], operand: Operand
            ) -> torch.Tensor:
    """For each sample (one operand of one module each), its ``STATS`` under each recipe
    (recipe by recipe), its ``MOMENTS`` and its block scales' exponents under each recipe
    (``SCALE_WIDTH`` each): a ``(len(samples), len(recipes) · (len(STATS) + SCALE_WIDTH) +
    len(MOMENTS))`` float64 tensor on their device, in a number of ops that grows with the
    recipes, not the samples (the pieces are measured together, then summed per sample)."""
    device = samples[0].pieces.device
    f64 = torch.float64
    pieces = torch.cat([s.pieces for s in samples])
    owner = torch.cat([torch.full((s.pieces.shape[0],), i, dtype=torch.int64, device=device)
                       for i, s in enumerate(samples)])
    n = torch.stack([torch.full((), float(max(s.elements, 1)), dtype=f64, device=device)
                     for s in samples])
    tensor_amax = torch.cat([s.tensor_amax.expand(s.pieces.shape[0]) for s in samples])
    row_amax = torch.cat([s.row_amax for s in samples])
    tiles = [s.tile_amax for s in samples if s.tile_amax is not None]
    tile_amax = torch.cat(tiles) if len(tiles) == len(samples) else None
    x = pieces.double()
    # Per sample: its non-zero elements, its sum and its sum of squares (the RMS, the error's
    # denominator); then, about its mean, the second and fourth central sums of its finite
    # elements (two passes: from raw power sums the kurtosis of an operand whose mean is far
    # above its spread would be lost to cancellation).
    sums = torch.zeros(len(samples), 3, dtype=f64, device=device).index_add_(0, owner, torch.stack([
        torch.count_nonzero(pieces, dim=1).double(), x.sum(1), (x * x).sum(1)], dim=1))
    nonfinite = torch.stack([s.nonfinite for s in samples]).double()
    known = (n - nonfinite).clamp(min=1)
    mean = sums[:, 1] / known
    d = torch.where(torch.cat([s.real for s in samples]), x - mean[owner][:, None], 0.0)
    d2 = d * d
    central = torch.zeros(len(samples), 2, dtype=f64, device=device).index_add_(
        0, owner, torch.stack([d2.sum(1), (d2 * d2).sum(1)], dim=1))
    columns, scales = [], []
    for recipe in recipes:
        q = _quantized(pieces, recipe, operand, tensor_amax, row_amax, tile_amax)
        occupied = q.amax > 0
        per_piece = torch.stack([
            torch.count_nonzero(q.values, dim=(1, 2)),
            torch.count_nonzero(q.scaled.abs() > q.element.saturates_above, dim=(1, 2)),
            torch.count_nonzero(occupied & q.low, dim=(1, 2)),
            torch.count_nonzero(occupied & q.high, dim=(1, 2)),
            torch.count_nonzero(occupied, dim=(1, 2)),
        ], dim=1).double()
        error = torch.linalg.vector_norm(q.values - q.tiles, dim=(1, 2), dtype=f64)
        columns.append(torch.cat([per_piece, (error * error)[:, None]], dim=1))
        scales.append(_scale_exponents(q.exponent, occupied, owner, len(samples)))
    moments = _moments(sums, central, known, n, nonfinite,
                       torch.stack([s.tensor_amax for s in samples]).double())
    if not recipes:
        return moments
    totals = torch.zeros(len(samples), len(recipes) * 6, dtype=f64, device=device)
    totals.index_add_(0, owner, torch.cat(columns, dim=1))
    totals = totals.view(len(samples), len(recipes), 6)
    norm = sums[:, 2:3].sqrt()
    stats = torch.stack([
        (sums[:, :1] - totals[:, :, 0]) / n[:, None],  # non-zero elements sent to zero
        totals[:, :, 1] / n[:, None],
        torch.where(norm > 0, totals[:, :, 5].sqrt() / norm, 0.0),
        totals[:, :, 2] / totals[:, :, 4].clamp(min=1),
        totals[:, :, 3] / totals[:, :, 4].clamp(min=1),
    ], dim=2)
    return torch.cat([stats.reshape(len(samples), -1), moments, *scales], dim=1)


def _scale_exponents(exponent: torch.Tensor, occupied: torch.Tensor, owner: torch.Tensor,
                     samples: int) -> torch.Tensor:
    """``(samples, SCALE_WIDTH)``: per sample the greatest exponent of its occupied blocks and
    their counts by binades below it (``SCALE_BINS``); ``exponent`` and ``occupied`` per block
    ``(pieces, blocks, 1)``, ``owner`` each piece's sample. No mask: a block that holds no
    value adds 0 (a boolean index would sync on CUDA)."""
    f64 = torch.float64
    exponent = exponent.to(f64)
    per_piece = torch.where(occupied, exponent, -math.inf).amax(dim=(1, 2))
    top = torch.full((samples,), -math.inf, dtype=f64, device=exponent.device)
    top = top.scatter_reduce(0, owner, per_piece, "amax")
    # A sample without an occupied block has top -inf: its blocks clamp into bin 0 and add 0.
    below = (top[owner][:, None, None] - exponent).clamp(0, SCALE_BINS - 1).long()
    counts = torch.zeros(samples * SCALE_BINS, dtype=f64, device=exponent.device)
    counts.index_add_(0, (owner[:, None, None] * SCALE_BINS + below).reshape(-1),
                      occupied.reshape(-1).to(f64))
    return torch.cat([torch.where(torch.isinf(top), math.nan, top)[:, None],
                      counts.view(samples, SCALE_BINS)], dim=1)


def _moments(sums: torch.Tensor, central: torch.Tensor, known: torch.Tensor, n: torch.Tensor,
             nonfinite: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """``MOMENTS`` per sample from its finite elements' sum of squares (column 2 of ``sums``)
    and their second and fourth sums about the mean (``central``), ``known`` of them (at least
    1). A constant operand has no kurtosis: its mean is its value to the bit (float64 sums
    float32 values exactly, below 2^29 of them), so its spread is exactly 0."""
    second = sums[:, 2] / known
    variance, fourth = central[:, 0] / known, central[:, 1] / known
    nan = torch.full_like(second, math.nan)
    measured = n > nonfinite
    return torch.stack([
        torch.where(measured, amax, nan),
        torch.where(measured, second.sqrt(), nan),
        torch.where(variance > 0, fourth / (variance * variance), nan),
        nonfinite / n,
    ], dim=1)


def quantize(m: torch.Tensor, recipe: Recipe, operand: Operand) -> Quantized:
    """The float32 matrix ``m`` (finite) through ``recipe``, every row: what ``measure``
    measures, as the tests hold it against the references."""
    whole = sample(m, operand, budget=m.numel() + 1)
    q = _quantized(whole.pieces, recipe, operand, whole.tensor_amax.expand(
        whole.pieces.shape[0]), whole.row_amax, whole.tile_amax)
    rows, cols = m.shape

    def grid(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(rows, -1)

    per_block = recipe.block or PIECE
    blocks = -(-cols // per_block)
    return Quantized(grid(q.values)[:, :cols], grid(q.down)[:, :blocks],
                     grid(q.exponent)[:, :blocks], grid(q.low)[:, :blocks],
                     grid(q.high)[:, :blocks])


@dataclass(frozen=True)
class _Quantized:
    """One recipe over pieces viewed as ``(pieces, blocks, block)``: its element format, the
    pieces, each block's amax, the values scaled into the element's range (before the clamp),
    the values clamped, rounded and dequantised, each block's dequantising factor, the exponent
    of its scale as its format stores it (``SCALE_WIDTH``) and its limit flags (size-1 last
    dim)."""

    element: Element
    tiles: torch.Tensor
    amax: torch.Tensor
    scaled: torch.Tensor
    values: torch.Tensor
    down: torch.Tensor
    exponent: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor


def _quantized(pieces: torch.Tensor, recipe: Recipe, operand: Operand,
               tensor_amax: torch.Tensor, row_amax: torch.Tensor,
               tile_amax: torch.Tensor | None) -> _Quantized:
    """The amaxes are per piece. A block of ``recipe.block`` is within a piece; a row or the
    whole tensor spans pieces (their amax given), as does a weight's 128x128 tile."""
    element = recipe.element(operand)
    rows, block = recipe.tile(operand)
    tiles = pieces.view(pieces.shape[0], -1, block or PIECE)
    if block == 0:
        amax = (tensor_amax if rows == 0 else row_amax)[:, None, None]
    elif rows > 1 and tile_amax is not None:
        amax = tile_amax[:, None, None]
    else:
        amax = _amax(tiles, dim=2, keepdim=True)
    if recipe.scale == "fp32":
        up = fp32_scale(amax, element, recipe.pow2)
        # Back through the reciprocal, as ``torch._scaled_mm`` is given it.
        down, low, high = 1 / up, amax <= AMAX_EPS, torch.isinf(up)
        exponent = torch.frexp(down)[1] - 1
    elif recipe.scale == "e8m0":
        up, down, exponent, low, high = _e8m0(amax, element)
    else:
        up, down, exponent, low, high = _nvfp4(amax, tensor_amax[:, None, None], element)
    scaled = tiles * up
    values = _round(scaled.clamp(-element.max, element.max), element) * down
    return _Quantized(element, tiles, amax, scaled, values, down, exponent, low, high)


def fp32_scale(amax: torch.Tensor, element: Element, pow2: bool) -> torch.Tensor:
    """An FP8 recipe's float32 scale from ``amax``: ``max / amax`` computed in float64 (the amax
    clamped from below at AMAX_EPS), rounded down to a power of two with ``pow2``: torchao's
    ``amax_to_scale``."""
    up = (element.max / amax.double().clamp(min=AMAX_EPS)).float()
    return torch.exp2(torch.floor(torch.log2(up))) if pow2 else up


def _e8m0(amax: torch.Tensor, element: Element
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """MX's power-of-two scale, RCEIL: 2^ceil(log2(amax / max)) within E8M0's exponents, as
    torchao's ``_to_mx_rceil`` (which follows TransformerEngine's ``ptx.cuh``). A block whose
    exponent clamps to E8M0's least is multiplied by 1, not 2^127, as there: its values are
    below E4M3's least subnormal anyway. Returns the factors into and out of the element's
    range, the scale's exponent and the clamp flags."""
    exponent = torch.ceil(torch.log2(amax / element.max))
    low, high = exponent <= E8M0_MIN_EXP, exponent > E8M0_MAX_EXP
    exponent = exponent.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    up = torch.where(exponent == E8M0_MIN_EXP, 1.0, torch.exp2(-exponent))
    return up, torch.exp2(exponent), exponent, low, high


def _nvfp4(amax: torch.Tensor, tensor_amax: torch.Tensor, element: Element
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4's two levels, as torchao's ``nvfp4_quantize`` with a per-tensor scale: the tensor's
    amax ÷ (E4M3 max · E2M1 max) in FP32, under it each block's amax ÷ E2M1 max rounded to E4M3
    (clamped to E4M3's least normal and its max)."""
    tensor_scale = (torch.where(tensor_amax > 0, tensor_amax, 1.0)  # 0/0 guarded
                    / (E4M3.max * element.max))
    block = amax / element.max / tensor_scale
    low, high = block <= E4M3.min_normal, block > E4M3.max
    block_e4m3 = block.clamp(E4M3.min_normal, E4M3.max).to(torch.float8_e4m3fn).float()
    up = (1.0 / tensor_scale) / block_e4m3
    # The exponent of the E4M3 block scale itself (a normal: clamped to the least normal).
    return up, block_e4m3 * tensor_scale, torch.frexp(block_e4m3)[1] - 1, low, high


def _round(v: torch.Tensor, element: Element) -> torch.Tensor:
    """``v`` (within ±max) rounded to the nearest ``element`` value, ties to even."""
    if element.dtype is not None:
        return v.to(element.dtype).float()
    # The spacing of the binade each |v| falls in (that of the subnormals below the least
    # normal), 2^(exponent - mbits); torch.round is ties-to-even.
    _, exponent = torch.frexp(v)
    least = round(math.log2(element.min_normal))
    spacing = torch.exp2((exponent - 1).clamp(min=least).float() - element.mbits)
    return torch.round(v / spacing) * spacing
