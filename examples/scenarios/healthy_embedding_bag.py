"""A healthy FP16 AMP run of a recommender: a user table (``nn.Embedding``, 5,000 rows) through
a linear tower, dotted with the mean of the user's 4 recent items (``nn.EmbeddingBag``,
10,000 rows, mode "mean"), regressing a rating made by hidden true factors. Users and items
follow a Zipf law, as popularity does.

A hard case for a false alarm, and a second embedding shape: two tables, one of them a bag
that spreads its gradient evenly over the bag's rows, and in both the rows looked up are a
tiny share of the table. A batch of 32 touches at most 32 user rows and 128 item rows, so about
99 % of both tables' gradient elements are exact zeros on every step: structural (rows not
looked up), the same in FP32. ampscope should find nothing here (issue #30).
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
from scenarios.healthy_embedding import zipf

NAME = "healthy_embedding_bag"
USERS = 5_000
ITEMS = 10_000
DIM = 8
FACTORS = 4
"""The hidden true factors a rating is made of."""
HISTORY = 4
"""Items per user in a batch row: the bag."""
BATCH = 32


class Recommender(nn.Module):
    """``forward(x)``: column 0 of ``x`` is the user, columns 1… the items of the bag."""

    def __init__(self) -> None:
        super().__init__()
        self.users = nn.Embedding(USERS, DIM)
        self.tower = nn.Linear(DIM, DIM)
        self.items = nn.EmbeddingBag(ITEMS, DIM, mode="mean")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        user = self.tower(self.users(x[:, 0]))
        out: torch.Tensor = (user * self.items(x[:, 1:])).sum(dim=1, keepdim=True) / DIM
        return out


def build(steps: int = 120, fp32: bool = False) -> Scenario:
    torch.manual_seed(0)
    model = Recommender()
    scaler = torch.amp.GradScaler("cpu", enabled=not fp32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    user_weights, item_weights = zipf(USERS), zipf(ITEMS)
    true_users = torch.randn(USERS, FACTORS, generator=gen)
    true_items = torch.randn(ITEMS, FACTORS, generator=gen)

    def step(i: int, mon: Monitor) -> torch.Tensor:
        users = torch.multinomial(user_weights, BATCH, replacement=True, generator=gen)
        items = torch.multinomial(item_weights, BATCH * HISTORY, replacement=True,
                                  generator=gen).view(BATCH, HISTORY)
        rating = (true_users[users] * true_items[items].mean(dim=1)).sum(dim=1, keepdim=True)
        x = torch.cat([users.unsqueeze(1), items], dim=1)
        return amp_step(model, scaler, optimizer, x, rating, mon=mon)

    return Scenario(NAME, model, scaler, optimizer, step, steps)


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
