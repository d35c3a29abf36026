"""The formats probe (#33): on a sampled step, what each recipe would do to every ``Linear`` and
``Conv`` module's three GEMM operands (``recipes.sample`` as they go by, ``recipes.measure``
of each operand's samples together at the capture), and to every normalisation layer's affine
weight (``LayerNorm``, ``RMSNorm`` and their look-alikes: ``norm_weight``).

Armed as the activation probe is (``activations.py``): ONE process-wide forward hook for the
sampled step, removed by ``collect``, nothing stored on a module. A watched module's input and
weight are measured as its forward runs (the weight as the forward uses it), its output's
gradient by a tensor hook as it flows back, still multiplied by the loss scale: every recipe
scales per tensor, row or block, and the loss scale is a power of two, so the statistics are
those of the unscaled gradient but at the scale formats' limits; ``collect`` divides its amax
and RMS by the scale. A module run twice in one step (gradient checkpointing's re-run, a shared
layer) is measured on its first call. Returns at once under dynamo. No host sync: ``collect``
gives a device block the step's one copy carries.

``nn.MultiheadAttention`` runs its two projections inside its own forward
(``F.multi_head_attention_forward``), never calling ``out_proj``: its hook measures what it can
see. The packed in-projection (``in_proj_weight``, a row of its own) gets its weight and, under
self-attention (query, key and value one tensor), its input; separate ones (``kdim`` or
``vdim`` apart from ``embed_dim``: ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight``) each
their weight and input (the query, the key, the value). Their output gradients are internal
(NaN). ``out_proj`` gets its weight and its output gradient, the attention's output's; its input
is internal (NaN).

A normalisation layer's affine weight is no GEMM operand, and torchao and TransformerEngine
keep it in high precision; a fully quantised run (MX emulated end to end, as in arXiv
2506.20752) quantises it too, and the multiplicative noise that adds is what that paper finds
behind MX's loss spikes. So it gets a row of its own whose weight, one row of blocks along its
length, is measured as the forward uses it; its input and output gradient are NaN.

A module that really trains in a recipe (torchao's ``Float8Linear``, read from its config
without importing torchao: ``trained_recipe``) is measured like any other, and beside its
what-ifs the block keeps, per operand, the amax and the scale that recipe computed from it
(tensor-wise: ``max / amax`` in float32, as torchao's ``amax_to_scale``; row-wise: its largest
row's, the least of its per-row scales, rounded down to a power of two as torchao rounds them;
how the other rows' scales spread is what ``fp8_rowwise``'s exponents show).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ampscope.recipes import (
    MOMENTS,
    OPERANDS,
    RECIPES,
    SCALE_WIDTH,
    STATS,
    TRAINED,
    Operand,
    Recipe,
    Sample,
    fp32_scale,
    measure,
    sample,
)
from ampscope.sampled_hook import SampledHook

__all__ = ["GEMM_MODULES", "FormatsProbe", "norm_weight", "trained_recipe"]

CONV_MODULES = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
GEMM_MODULES = (torch.nn.Linear, *CONV_MODULES)
"""The modules whose operands a recipe quantises (their subclasses too)."""
Attention = torch.nn.MultiheadAttention
NORM_MODULES = (torch.nn.LayerNorm, torch.nn.RMSNorm)
_NORM_NAMES = ("LayerNorm", "RMSNorm")
"""Class names ending so are normalisation layers too (Hugging Face's ``LlamaRMSNorm``,
``T5LayerNorm``, ...), which subclass no torch norm."""

_AMAX, _RMS = 0, 1  # in MOMENTS


def trained_recipe(module: torch.nn.Module) -> str | None:
    """The recipe a torchao ``Float8Linear`` trains in, by its config: ``fp8_tensorwise``
    (dynamic tensor-wise scales) or ``fp8_rowwise`` (row-wise, power-of-two scales); None for
    any other module or a configuration the recipes here do not name."""
    config = getattr(module, "config", None)
    if type(module).__name__ != "Float8Linear" or config is None:
        return None
    casts = [getattr(config, f"cast_config_{name}", None)
             for name in ("input", "weight", "grad_output")]
    kinds = {str(getattr(getattr(c, "scaling_granularity", None), "value", None))
             for c in casts}
    pow2 = bool(getattr(config, "round_scales_to_power_of_2", False))
    if kinds == {"tensorwise"} and not pow2:
        return "fp8_tensorwise"
    if kinds == {"axiswise"} and pow2:
        return "fp8_rowwise"
    return None


_SEPARATE = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
"""An attention module's separate in-projections, in the order of its inputs."""


def norm_weight(module: torch.nn.Module) -> torch.Tensor | None:
    """A normalisation layer's affine weight (one value per channel), None for any other
    module and for a norm without one (``elementwise_affine=False``)."""
    if not (isinstance(module, NORM_MODULES)
            or type(module).__name__.endswith(_NORM_NAMES)):
        return None
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, torch.Tensor) and weight.dim() == 1 else None


def _weights(module: torch.nn.Module) -> tuple[torch.Tensor | None, ...]:
    """The weights measured with a module: those its GEMMs run on (a Linear's or Conv's; an
    attention module's packed in-projection, one for query, key and value, or its three
    separate ones, ``_SEPARATE``), a normalisation layer's affine weight, none for any other
    module."""
    if isinstance(module, GEMM_MODULES):
        return (module.weight,)
    if isinstance(module, Attention):
        if module._qkv_same_embed_dim:
            return (module.in_proj_weight,)
        return tuple(getattr(module, name) for name in _SEPARATE)
    norm = norm_weight(module)
    return () if norm is None else (norm,)


class FormatsProbe:
    """Arms a forward hook for one sampled step and turns what it measured into the step's
    ``(rows, 3, width)`` block: a row per measured weight (one per module; three for an
    attention module's separate in-projections), ``width`` = recipes · STATS + MOMENTS +
    recipes · SCALE_WIDTH as ``measure`` gives them, then ``TRAINED`` where a module trains in
    a recipe; NaN: not measured."""

    def __init__(self, model: torch.nn.Module, layer_of: Mapping[int, int],
                 recipes: Sequence[Recipe], on_error: Callable[[Exception], None]) -> None:
        """``layer_of``: ``id(parameter)`` → its row in the layer table; a module whose weight
        is not watched is not measured."""
        self.recipes = tuple(recipes)
        self._on_error = on_error
        watched = [(m, i, layer_of[id(weight)]) for m in model.modules()
                   for i, weight in enumerate(_weights(m))
                   if weight is not None and id(weight) in layer_of]
        self.layers = [layer for _, _, layer in watched]
        """Each measured weight's row in the layer table, in the block's order (an attention
        module's in-projections': a row each)."""
        self._modules = [m for m, _, _ in watched]
        """Per slot (a row of the block), its module; kept alive here for the ids below."""
        self._slots: dict[int, dict[int, int]] = {}
        """``id(module)`` → {index in ``_weights`` → slot}: one slot for most modules,
        up to three for an attention module's separate in-projections."""
        for k, (m, i, _) in enumerate(watched):
            self._slots.setdefault(id(m), {})[i] = k
        self._out_proj = {id(m): self._slots[id(m.out_proj)][0] for m in self._modules
                          if isinstance(m, Attention) and id(m.out_proj) in self._slots}
        """An attention module → its ``out_proj``'s slot, which its forward measures."""
        self.trained = [trained_recipe(m) for m in self._modules]
        """Per module, the recipe it really trains in (None: none); all None: not kept."""
        self.keeps_trained = any(self.trained)
        self.width = (len(self.recipes) * (len(STATS) + SCALE_WIDTH) + len(MOMENTS)
                      + (len(TRAINED) if self.keeps_trained else 0))
        self._hook = SampledHook(self._forward_hook)
        self.armed = False
        self._seen: set[int] = set()
        self._samples: dict[tuple[int, int], Sample] = {}

    def arm(self) -> None:
        if self._hook.registered or not self._modules:
            return
        self._seen.clear()
        self._samples = {}
        self._hook.arm()
        self.armed = True

    def disarm(self) -> None:
        self._hook.disarm()  # tensor hooks still on a live graph go quiet
        self.armed = False

    def _sample(self, k: int, operand: Operand, x: torch.Tensor, module: torch.nn.Module
                ) -> None:
        if x.numel():
            conv = isinstance(module, CONV_MODULES)
            self._samples[k, OPERANDS.index(operand)] = sample(x, operand, channels_first=conv)

    def _forward_hook(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if torch.compiler.is_dynamo_compiling():  # see ActivationProbe._forward_hook
            return
        try:
            slots = self._slots.get(id(module))
            if slots is None or not self._seen.isdisjoint(slots.values()):
                return
            self._seen.update(slots.values())
            if isinstance(module, Attention):
                self._attention(slots, module, inputs, output)
                return
            k = slots[0]
            norm = norm_weight(module)
            if norm is not None:  # an affine weight alone: no GEMM input or output
                self._sample(k, "weight", norm, module)
                return
            x = inputs[0] if isinstance(inputs, tuple) and inputs else None
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                self._sample(k, "input", x, module)
            weight = module.weight
            if isinstance(weight, torch.Tensor):
                self._sample(k, "weight", weight, module)
            if (isinstance(output, torch.Tensor) and output.requires_grad
                    and output.is_floating_point()):
                output.register_hook(self._grad_hook(k, module, self._hook.generation))
        except Exception as exc:
            self._on_error(exc)

    def _attention(self, slots: dict[int, int], module: Attention, inputs: Any, output: Any
                   ) -> None:
        """The in-projections' weights and inputs (``slots``: the packed one's input under
        self-attention only), then the out-projection's weight and output gradient (its own
        slot, if its weight is watched)."""
        given = inputs if isinstance(inputs, tuple) and len(inputs) >= 3 else (None,) * 3
        weights = _weights(module)
        for i, k in slots.items():
            x = given[i]
            # The packed projection's input is the query only where key and value are it too:
            # cross-attention projects three inputs, none of them its input.
            if module._qkv_same_embed_dim and not (given[1] is x and given[2] is x):
                x = None
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                self._sample(k, "input", x, module)
            weight = weights[i]
            if isinstance(weight, torch.Tensor):
                self._sample(k, "weight", weight, module)
        out = self._out_proj.get(id(module))
        if out is None or out in self._seen:
            return
        self._seen.add(out)
        self._sample(out, "weight", module.out_proj.weight, module.out_proj)
        y = output[0] if isinstance(output, tuple) and output else None
        if isinstance(y, torch.Tensor) and y.requires_grad and y.is_floating_point():
            y.register_hook(self._grad_hook(out, module.out_proj, self._hook.generation))

    def _grad_hook(self, k: int, module: torch.nn.Module, generation: int
                   ) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            try:
                if generation == self._hook.generation and (k, 2) not in self._samples:
                    self._sample(k, "grad_output", grad, module)
            except Exception as exc:
                self._on_error(exc)
        return hook

    def collect(self, scale: torch.Tensor | float, device: torch.device) -> torch.Tensor | None:
        """Remove the hook; the ``(rows, 3, width)`` float64 block on ``device`` (None: no
        module ran): each operand's samples measured together."""
        samples, self._samples = self._samples, {}
        self.disarm()
        if not samples:
            return None
        missing = torch.full((self.width,), math.nan, dtype=torch.float64, device=device)
        columns = []
        for o, operand in enumerate(OPERANDS):
            keys = [k for k in range(len(self._modules)) if (k, o) in samples]
            rows = {}
            if keys:
                measured = measure([samples[k, o] for k in keys], self.recipes, operand)
                if self.keeps_trained:
                    measured = torch.cat([measured, self._trained(
                        [samples[k, o] for k in keys], [self.trained[k] for k in keys],
                        operand)], dim=1)
                rows = dict(zip(keys, measured.to(device).unbind(0), strict=True))
            columns.append(torch.stack([rows.get(k, missing)
                                        for k in range(len(self._modules))]))
        block = torch.stack(columns, dim=1)
        at = len(self.recipes) * len(STATS)
        moments = block[:, 2, at : at + len(MOMENTS)]  # the gradient's, scaled
        inverse = (scale.detach().to(device=device, dtype=torch.float64).reciprocal()
                   if isinstance(scale, torch.Tensor) else 1.0 / float(scale))
        moments[:, _AMAX : _RMS + 1] *= inverse
        return block

    @staticmethod
    def _trained(samples: list[Sample], trained: list[str | None], operand: Operand
                 ) -> torch.Tensor:
        """``(samples, TRAINED)``: each operand's amax and the scale a module training in
        ``fp8_tensorwise`` computed from it, or in ``fp8_rowwise`` for its largest row (NaN for
        any other module)."""
        rows = []
        for one, name in zip(samples, trained, strict=True):
            amax = one.tensor_amax.double()
            if name in ("fp8_tensorwise", "fp8_rowwise"):
                recipe = RECIPES[name]
                scale = fp32_scale(amax, recipe.element(operand), recipe.pow2).double()
            else:
                scale = torch.full_like(amax, math.nan)
                amax = amax if name is not None else scale
            rows.append(torch.stack([amax, scale]))
        return torch.stack(rows)
