"""A healthy FP16 AMP run of a one-layer transformer encoder (``nn.TransformerEncoder``,
d_model 32, 2 heads, sequences of 8) with a linear input projection and a linear head: does
the sequence's first feature sum to more than zero?

A hard case for a false alarm: softmax attention saturates (near-one-hot rows pass back tiny
gradients to the query and key projections), LayerNorm divides by the activations' spread, and
the fused in-projection holds query, key and value in one weight whose thirds see gradients of
very different sizes. Small gradient values are this architecture's normal, in FP32 as in FP16,
and the loss scale keeps them well inside FP16's range. ampscope should find nothing here
(issue #30). Training uses the layer's ordinary path (the fused fast path is for inference).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ampscope.monitor import Monitor
from scenarios.common import Scenario, amp_step, main, run_scenario

NAME = "healthy_transformer"
FEATURES = 8
LENGTH = 8
D_MODEL = 32


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, nhead=2, dim_feedforward=64, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(self.embed(x)).mean(dim=1))
        return out


def sequence_batch(gen: torch.Generator, batch: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard-normal sequences; the class: whether feature 0 sums to more than zero."""
    x = torch.randn(batch, LENGTH, FEATURES, generator=gen)
    return x, (x[:, :, 0].sum(dim=1) > 0).long()


def build(steps: int = 60, fp32: bool = False) -> Scenario:
    torch.manual_seed(0)
    model = Encoder()
    scaler = torch.amp.GradScaler("cpu", enabled=not fp32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step(i: int, mon: Monitor) -> torch.Tensor:
        return amp_step(model, scaler, optimizer, *sequence_batch(gen),
                        loss_fn=nn.functional.cross_entropy, mon=mon)

    return Scenario(NAME, model, scaler, optimizer, step, steps)


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
