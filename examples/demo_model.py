"""A small model and task whose FP16 AMP training shows the problems ampscope exists to show.

- `init_scale` far above what the gradients allow: the first steps overflow and are skipped while
  the scaler backs off.
- A short `growth_interval`: the scaler keeps probing upward and overflows again (periodic skips).
- A `whisper` branch whose output is multiplied by `WHISPER` before joining the residual stream:
  the gradient flowing into it is tiny, so under fp16 autocast part of it underflows to zero and
  most of the rest is subnormal; its fp32 `gain` has gradients that would underflow in fp16.

Shared by `examples/demo.py` and the tests, so the tests exercise exactly what the demo shows.
"""

from __future__ import annotations

import torch
from torch import nn

# Small enough that the backward through this branch lands below fp16's subnormal range at the
# scales the run settles at, large enough that not all of it does.
WHISPER = 1e-9


class DemoNet(nn.Module):
    def __init__(self, width: int = 64, depth: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
            for _ in range(depth)
        )
        self.whisper = nn.Linear(width, width)
        # An fp32 gain: its gradient is computed in fp32, so it shows values that would underflow
        # if they had to live in fp16 at the current scale (the `param` source of DESIGN.md §3).
        self.gain = nn.Parameter(torch.ones(width))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        h = h + WHISPER * (self.whisper(h) * self.gain)
        out: torch.Tensor = self.head(h)
        return out


def make_batch(gen: torch.Generator, batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, 16, generator=gen)
    y = (x[:, :4].sum(dim=1, keepdim=True) * 3.0).sin()
    return x, y


def make_training(
    seed: int = 0, init_scale: float = 2.0**24, growth_interval: int = 50, lr: float = 1e-3
) -> tuple[DemoNet, torch.amp.GradScaler, torch.optim.Optimizer, torch.Generator]:
    torch.manual_seed(seed)
    model = DemoNet()
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    return model, scaler, optimizer, gen


def train_step(
    model: nn.Module,
    scaler: torch.amp.GradScaler,
    optimizer: torch.optim.Optimizer,
    gen: torch.Generator,
) -> torch.Tensor:
    """One ordinary AMP step on the CPU: autocast fp16, scale, backward, step, update."""
    x, y = make_batch(gen)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()
