"""Activation outliers growing (findings/outliers.py): by hand, and on real trainings where the
truth is known: an input feature growing 12 % a step is named, its layer alone; the eight
healthy models of issue #30, sampled often enough to judge, are not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from sqlalchemy.orm import Session, sessionmaker
from torch import nn

import ampscope
from ampscope.transport import MemorySender
from ampscope_server.findings import analyze
from ampscope_server.findings.facts import FormatsSample, LayerInfo, RunData, StepPoint
from ampscope_server.findings.outliers import activation_outliers
from ampscope_server.findings.reads import load_run_data
from ampscope_server.store import runs_repository
from ampscope_server.store.format_packing import OPERAND_STATS, OPERANDS
from tests.support.ingest import ingest_payload

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

from scenarios.common import run_scenario

HEALTHY = ("healthy", "healthy_relu", "healthy_cnn_bn", "healthy_transformer", "healthy_lstm",
           "healthy_embedding", "healthy_embedding_bag", "healthy_gelu_layernorm")


def _run(inputs: list[tuple[float, float]]) -> RunData:
    """One layer (row 0) whose input has (amax, kurtosis) at each sample, 100 steps apart."""
    samples = []
    for k, (amax, kurtosis) in enumerate(inputs):
        operands = [1.0] * (len(OPERANDS) * len(OPERAND_STATS))
        operands[OPERAND_STATS.index("amax")] = amax
        operands[OPERAND_STATS.index("kurtosis")] = kurtosis
        samples.append(FormatsSample(100 * k, ("mxfp8",), (0,), [0.0] * 15, operands))
    return RunData(target_format="bf16", layers=[LayerInfo("fc.weight")],
                   steps=[StepPoint(0, None, None, False, False)], formats=samples)


class TestByHand:
    def test_amax_and_kurtosis_both_grown(self) -> None:
        (finding,) = activation_outliers(_run([(2.0, 3.0)] * 3 + [(16.0, 30.0)] * 3))
        assert (finding.kind, finding.severity, finding.layers) == (
            "activation_outliers", "warning", ["fc.weight"])
        assert (finding.step_start, finding.step_end) == (0, 500)
        assert finding.evidence["max_amax_growth"] == 8.0
        assert finding.title == ("The inputs of 1 layer(s) grow outliers (amax x8, kurtosis "
                                 "30): fc.weight")

    @pytest.mark.parametrize("inputs", [
        [(2.0, 3.0)] * 3 + [(15.9, 30.0)] * 3,  # amax short of 8x
        [(2.0, 3.0)] * 3 + [(16.0, 29.9)] * 3,  # kurtosis short of 30
        [(2.0, 40.0)] * 3 + [(16.0, 79.0)] * 3,  # a heavy tail from the start, not doubled
        [(2.0, 3.0)] * 3 + [(160.0, 3.0)] * 3,  # grown evenly: no tail
        [(2.0, 3.0)] * 2 + [(160.0, 300.0)] * 3,  # five samples: too few to tell a trend
        [(2.0, 3.0), (2.0, 3.0), (160.0, 300.0), (160.0, 300.0), (2.0, 3.0), (2.0, 3.0)],
    ])
    def test_not_a_growing_tail(self, inputs: list[tuple[float, float]]) -> None:
        assert activation_outliers(_run(inputs)) == []


def _analysed(sessions: sessionmaker[Session], sink: MemorySender, run_id: str) -> RunData:
    for body in sink.payloads():
        ingest_payload(sessions, body)
    with sessions() as session:
        run = runs_repository.get_run(session, run_id)
        assert run is not None
        return load_run_data(session, run)


def test_a_growing_input_feature_names_its_layer_alone(
        sessions: sessionmaker[Session]) -> None:
    """Feature 0 of the data grows 12 % a step: the first layer's input grows an outlier
    column (kurtosis 3 → ~85); the layers after it grow too, but evenly (kurtosis ≤ ~16)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    sink = MemorySender()
    mon = ampscope.watch(model, None, optimizer, server=None, sender=sink, formats_every=5)
    gen = torch.Generator().manual_seed(0)
    for i in range(60):
        x = torch.randn(64, 32, generator=gen)
        x[:, 0] *= 1.12**i
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    mon.close()
    data = _analysed(sessions, sink, mon.run_id)
    assert [s.step for s in data.formats] == [0, 5, 10, 45, 50, 55]
    found = [f for f in analyze(data) if f.kind == "activation_outliers"]
    assert [f.layers for f in found] == [["0.weight"]]


@pytest.mark.parametrize("name", HEALTHY)
def test_no_healthy_model_grows_outliers(name: str, sessions: sessionmaker[Session]) -> None:
    """Each healthy scenario sampled about 12 times over its run: no activation_outliers."""
    import importlib

    scenario = importlib.import_module(f"scenarios.{name}").build()
    sink = MemorySender()
    mon = run_scenario(scenario, server=None, sender=sink,
                       formats_every=max(1, scenario.steps // 12))
    mon.close()
    data = _analysed(sessions, sink, mon.run_id)
    assert len(data.formats) == 6
    assert activation_outliers(data) == []
