"""What one optimizer step leaves on the host, and the layer table: the hook's side of the wire.

``StepRecord`` is built on the training thread (cheap: a host tensor and a few ints) and turned into
the wire record on the sender thread (``to_wire``: the only place that reads the tensor's values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ampscope import wire
from ampscope.reductions import STAT_NAMES

# Scalars at the head of the per-step tensor, in this order; the (stats, layers) block follows.
SCALARS = ("scale_before", "scale_after", "growth_tracker", "found_inf", "loss", "grad_norm", "lr")


@dataclass
class StepRecord:
    """What the training thread enqueues; ``to_wire`` runs on the sender thread."""

    seq: int
    step: int
    wall_time: float
    duration: float | None
    values: torch.Tensor  # float64 host tensor: SCALARS then (8, L) stats when has_layers
    ready: Any  # torch.cuda.Event to wait on before reading ``values``, or None
    absent: frozenset[str]
    num_layers: int | None
    found_inf_from_scale: bool  # fallback: no found_inf tensors, infer from a scale decrease

    def to_wire(self) -> dict[str, Any]:
        if self.ready is not None:
            self.ready.synchronize()
        v = self.values.tolist()
        head = dict(zip(SCALARS, v[: len(SCALARS)], strict=True))
        for name in self.absent:
            head[name] = None
        if self.found_inf_from_scale:
            head["found_inf"] = float(head["scale_after"] < head["scale_before"])
        layers = None
        if self.num_layers is not None:
            n, base = self.num_layers, len(SCALARS)
            layers = {s: v[base + k * n : base + (k + 1) * n] for k, s in enumerate(STAT_NAMES)}
        found_inf = bool(head["found_inf"])
        growth = head["growth_tracker"]
        return wire.step_record(
            seq=self.seq,
            step=self.step,
            wall_time=self.wall_time,
            loss=head["loss"],
            scale_before=head["scale_before"],
            scale_after=head["scale_after"],
            growth_tracker=None if growth is None else round(growth),
            found_inf=found_inf,
            skipped=found_inf,
            grad_norm=head["grad_norm"],
            lr=head["lr"],
            duration=self.duration,
            layers=layers,
        )


def layer_table(model: torch.nn.Module) -> tuple[list[dict[str, Any]], list[torch.nn.Parameter]]:
    owner: dict[int, str] = {}
    for _, module in model.named_modules():
        for _, p in module.named_parameters(recurse=False):
            owner.setdefault(id(p), type(module).__name__)
    table: list[dict[str, Any]] = []
    params: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        table.append({
            "index": len(table),
            "name": name,
            "shape": list(p.shape),
            "dtype": str(p.dtype).removeprefix("torch."),
            "numel": p.numel(),
            "module_type": owner.get(id(p), type(model).__name__),
        })
        params.append(p)
    return table, params
