"""The recipe verdicts of real trainings, where the truth is known: the hook's formats probe
sends, the server stores, `GET /api/runs/{id}/formats` judges (findings/recipe_fit.py).

- A layer whose output gradient mixes magnitudes 10^6 apart in every 32-block: E4M3 spans
  448 · 2^9 ≈ 2.3·10^5 under one block scale, so MXFP8 flushes the small half of it; FP8
  tensor-wise sends gradients as E5M2 (2^32 of range) and BF16 (2^133) keep all of it.
- A LayerNorm whose gains spread over 2^-12..2^3 in every block: E2M1 spans 12x under one
  block scale, so MXFP4 and NVFP4 flush its small gains (channels switched off) and a fully
  quantised run keeps it in BF16; E4M3 keeps all of them, and a LayerNorm at its initial gains
  of 1 loses nothing to zero under any recipe.
- A healthy small transformer (examples/scenarios/healthy_transformer.py): every FP8 recipe
  fits every layer, and no recipe flags its norms.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.orm import Session, sessionmaker
from torch import nn

import ampscope
from ampscope.transport import MemorySender
from ampscope_server.charts import format_reads
from ampscope_server.store import runs_repository
from tests.support.ingest import ingest_payload

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

from scenarios import healthy_transformer
from scenarios.common import run_scenario


class Mixed(nn.Module):
    """`mixed`'s outputs are multiplied by 10^1.5 and 10^-1.5 in turn before the loss, their
    square: its output gradient (2 · out · mask²) alternates 10^6 apart within every block."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(8, 32)
        self.mixed = nn.Linear(32, 64)
        self.register_buffer("mask", torch.tensor([10**1.5, 10**-1.5] * 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mixed(torch.relu(self.body(x))) * self.mask
        return out


def _verdicts(sessions: sessionmaker[Session], sink: MemorySender, run_id: str
              ) -> dict[str, Any]:
    for body in sink.payloads():
        ingest_payload(sessions, body)
    with sessions() as session:
        run = runs_repository.get_run(session, run_id)
        assert run is not None
        read = format_reads.formats_read(session, run, None, 500)
    assert read.matrix is not None
    return {v.recipe: v for v in read.verdicts}


def test_the_layer_mxfp8_flushes_and_nothing_else(sessions: sessionmaker[Session]) -> None:
    model = Mixed()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-9)
    sink = MemorySender()
    mon = ampscope.watch(model, None, optimizer, server=None, sender=sink, formats_every=5,
                         target_format="bf16", activation_every=5)
    gen = torch.Generator().manual_seed(0)
    for _ in range(15):
        loss = model(torch.randn(64, 8, generator=gen)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    mon.close()
    verdicts = _verdicts(sessions, sink, mon.run_id)
    (kept,) = verdicts["mxfp8"].keep
    assert (kept.layer, kept.operand, kept.stat) == ("mixed.weight", "grad_output",
                                                     "underflow_frac")
    assert 0.45 <= kept.value <= 0.5  # the small half, less what rounds up
    assert verdicts["mxfp8"].measured == 2
    assert verdicts["fp8_tensorwise"].keep == []
    # Not in BF16: the hook's own activation gradients judged against it flush nothing.
    records = [r for body in sink.payloads() for r in body["records"]]
    modules = [m["name"] for m in sink.payloads()[0]["modules"]]
    sampled = [r["activations"] for r in records if r["activations"] is not None]
    assert sampled and all(a["underflow_frac"][modules.index("mixed")] == 0.0
                           for a in sampled)


class Gains(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(8, 64)
        self.spread = nn.LayerNorm(64)
        self.plain = nn.LayerNorm(64)
        self.head = nn.Linear(64, 4)
        with torch.no_grad():
            self.spread.weight.copy_(torch.logspace(-12, 3, 16, base=2.0).repeat(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.plain(self.spread(self.up(x))))
        return out


def test_the_norm_fp4_flushes_and_no_other(sessions: sessionmaker[Session]) -> None:
    model = Gains()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-9)
    sink = MemorySender()
    mon = ampscope.watch(model, None, optimizer, server=None, sender=sink, formats_every=5)
    gen = torch.Generator().manual_seed(0)
    for _ in range(15):
        model(torch.randn(32, 8, generator=gen)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    mon.close()
    verdicts = _verdicts(sessions, sink, mon.run_id)
    flagged = {name: [(k.layer, k.stat) for k in v.norms] for name, v in verdicts.items()}
    assert flagged == {"fp8_tensorwise": [], "fp8_rowwise": [], "fp8_block128": [],
                       "mxfp8": [], "mxfp4": [("spread.weight", "underflow_frac")],
                       "nvfp4": [("spread.weight", "underflow_frac")]}
    assert {(v.measured, v.norms_measured) for v in verdicts.values()} == {(2, 2)}
    # NVFP4 maps each 16-block's amax 2^3 to E2M1's 6: a gain x becomes 0.75·x, and below
    # 0.25 (half the least subnormal, 0.5) it rounds to zero: 2^-12..2^-2, 11 of every 16.
    assert verdicts["nvfp4"].norms[0].value == 11 / 16
    assert "norms' affine weights need BF16 (spread.weight)" in verdicts["mxfp4"].summary


def test_a_healthy_transformer_fits_every_fp8_recipe(sessions: sessionmaker[Session]) -> None:
    sink = MemorySender()
    mon = run_scenario(healthy_transformer.build(), server=None, sender=sink, formats_every=20)
    mon.close()
    verdicts = _verdicts(sessions, sink, mon.run_id)
    # Six layers: the input projection, the attention's in- and out-projections, the two
    # feed-forward Linears and the head.
    assert {name: (v.measured, v.keep) for name, v in verdicts.items()
            if name.startswith("fp8")} == {
        "fp8_tensorwise": (6, []), "fp8_rowwise": (6, []), "fp8_block128": (6, [])}
    assert verdicts["mxfp8"].keep == []
    # Its two LayerNorms, near their initial gains: no recipe flushes or mangles them.
    assert {(v.norms_measured, len(v.norms)) for v in verdicts.values()} == {(2, 0)}
