"""A healthy FP16 AMP run of an embedding-heavy model: an ``nn.Embedding`` of 10,000 rows
(dim 8), mean-pooled over 4-token sequences, then a small Tanh MLP regressing a score that
each token carries. Tokens follow a Zipf law, as words do.

A hard case for a false alarm: a batch of 32 sequences looks up at most 128 of the 10,000 rows,
so about 99 % of the embedding's gradient elements are exact zeros on every step. Those zeros are
structural (rows not looked up), the same in FP32; a rule that counts zeros as underflow
would flag the largest layer of the model on every step. ampscope should find nothing here
(issue #30).
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

NAME = "healthy_embedding"
VOCAB = 10_000
DIM = 8
LENGTH = 4
BATCH = 32


def zipf(vocab: int) -> torch.Tensor:
    """Sampling weights of a Zipf law: the k-th most frequent token has weight 1/k."""
    return 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM)
        self.head = nn.Sequential(nn.Linear(DIM, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.embedding(tokens).mean(dim=1))
        return out


def build(steps: int = 120, fp32: bool = False) -> Scenario:
    torch.manual_seed(0)
    model = Bag()
    scaler = torch.amp.GradScaler("cpu", enabled=not fp32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    weights = zipf(VOCAB)
    score = torch.randn(VOCAB, generator=gen)  # each token's; the target: the sequence's mean

    def step(i: int, mon: Monitor) -> torch.Tensor:
        tokens = torch.multinomial(weights, BATCH * LENGTH, replacement=True,
                                   generator=gen).view(BATCH, LENGTH)
        y = score[tokens].mean(dim=1, keepdim=True)
        return amp_step(model, scaler, optimizer, tokens, y, mon=mon)

    return Scenario(NAME, model, scaler, optimizer, step, steps)


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
