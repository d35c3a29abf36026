"""``AmpscopeCallback`` in a real Lightning ``Trainer`` (CPU, a tiny model built in the test):
every optimizer step recorded once, against the scaler's own truth with ``16-mixed`` and an
explicit scaler, and without a scaler under ``bf16-mixed`` (and ``16-mixed`` on a CPU, which
Lightning turns into bf16)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins import MixedPrecision
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ampscope.integrations.lightning import AmpscopeCallback
from ampscope.spool import Frame, scan, spool_files
from ampscope.transport import MemorySender

pytestmark = pytest.mark.frameworks

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
STEPS = 12


class Regressor(pl.LightningModule):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 4))
        self.losses: list[float] = []  # what training_step returned, as Lightning logs it

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> Any:
        x, y = batch
        loss = ((self.net(x).float() - y) ** 2).mean()
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class ScalerTruth(pl.Callback):
    """The scaler's scale before and after each optimizer step, read from the scaler itself."""

    def __init__(self) -> None:
        self.before: list[float] = []
        self.after: list[float] = []

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        self.before.append(trainer.precision_plugin.scaler.get_scale())  # type: ignore[attr-defined]

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self.after.append(trainer.precision_plugin.scaler.get_scale())  # type: ignore[attr-defined]


def fit(tmp_path: Path, accumulate: int = 1, **trainer_kw: Any) -> tuple[
        Regressor, AmpscopeCallback, MemorySender, list[pl.Callback]]:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 8, generator=gen), torch.randn(64, 4, generator=gen))
    model = Regressor()
    sender = MemorySender()
    callback = AmpscopeCallback(sender=sender, layer_every=2, activation_every=0)
    extra: list[pl.Callback] = trainer_kw.pop("callbacks", [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and the like
        trainer = pl.Trainer(
            max_steps=STEPS, accelerator="cpu", devices=1, accumulate_grad_batches=accumulate,
            logger=CSVLogger(tmp_path, name="reg"), enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
            callbacks=[callback, *extra], **trainer_kw)
        trainer.fit(model, DataLoader(data, batch_size=4))
    return model, callback, sender, extra


def records(sender: MemorySender) -> list[dict[str, Any]]:
    return [r for p in sender.payloads() for r in p["records"]]


def test_bf16_mixed_without_a_scaler(tmp_path: Path) -> None:
    model, callback, sender, _ = fit(tmp_path, precision="bf16-mixed")
    recs = records(sender)
    assert [r["step"] for r in recs] == list(range(STEPS))
    assert {(r["scale_before"], r["skipped"], r["found_inf"]) for r in recs} == {
        (None, False, False)}
    assert [r["loss"] for r in recs] == pytest.approx(model.losses, rel=1e-6)
    assert all(r["grad_norm"] > 0 for r in recs)
    assert [r["layers"] is not None for r in recs] == [i % 2 == 0 for i in range(STEPS)]
    run = sender.payloads()[0]["run"]
    assert run["name"] == "reg/0" and run["target_format"] == "bf16"
    assert run["config"] == {"width": 16}
    assert callback.monitor is not None and callback.monitor.stats().acknowledged == STEPS


def test_gradient_accumulation_records_the_mean_loss_of_each_step(tmp_path: Path) -> None:
    model, _, sender, _ = fit(tmp_path, accumulate=2, precision="bf16-mixed")
    recs = records(sender)
    assert [r["step"] for r in recs] == list(range(STEPS))
    means = [(a + b) / 2 for a, b in zip(model.losses[::2], model.losses[1::2], strict=True)]
    assert [r["loss"] for r in recs] == pytest.approx(means, rel=1e-6)


def test_16_mixed_with_an_explicit_scaler_matches_the_scaler(tmp_path: Path) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=4)
    truth = ScalerTruth()
    model, _, sender, _ = fit(tmp_path, plugins=[MixedPrecision("16-mixed", "cpu", scaler)],
                              callbacks=[truth])
    recs = records(sender)
    assert [r["step"] for r in recs] == list(range(STEPS))
    assert [r["scale_before"] for r in recs] == truth.before
    assert [r["scale_after"] for r in recs] == truth.after
    skipped = [a < b for a, b in zip(truth.after, truth.before, strict=True)]
    assert [r["skipped"] for r in recs] == skipped
    assert sender.payloads()[0]["run"]["target_format"] == "fp16"
    assert [r["loss"] for r in recs] == pytest.approx(model.losses, rel=1e-3)  # fp16 forward


def test_16_mixed_on_a_cpu_is_recorded_as_the_bf16_it_became(tmp_path: Path) -> None:
    _, _, sender, _ = fit(tmp_path, precision="16-mixed")  # Lightning warns, and runs bf16
    recs = records(sender)
    assert len(recs) == STEPS and {r["scale_before"] for r in recs} == {None}
    assert sender.payloads()[0]["run"]["target_format"] == "bf16"


def test_fp16_without_a_scaler_is_recorded_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ampscope"):
        _, _, sender, _ = fit(tmp_path, precision="16-true")
    recs = records(sender)
    assert len(recs) == STEPS and {r["scale_before"] for r in recs} == {None}
    assert sender.payloads()[0]["run"]["target_format"] == "fp16"
    warned = [r.message for r in caplog.records if "without a GradScaler" in r.message]
    assert len(warned) == 1 and "bf16-mixed" in warned[0]


def test_the_example_runs_offline_into_the_spool(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    env = {**os.environ, "AMPSCOPE_MODE": "offline", "AMPSCOPE_SPOOL_DIR": str(spool),
           "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "integrations" / "lightning_bf16.py"), "--steps", "20"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    frames = [f for path in spool_files(spool) for f in scan(path) if isinstance(f, Frame)]
    steps = [r["step"] for f in frames for r in json.loads(f.body)["records"]]
    assert steps == list(range(20))


def test_a_watch_that_fails_leaves_the_fit_unwatched(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 8), torch.randn(16, 4))
    callback = AmpscopeCallback(sender=MemorySender(), target_format="fp7")  # no such format
    model = Regressor()
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="ampscope"):
        warnings.simplefilter("ignore")
        trainer = pl.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False,
                             precision="bf16-mixed", enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[callback])
        trainer.fit(model, DataLoader(data, batch_size=4))
    assert callback.monitor is None and len(model.losses) == 3  # trained all the same
    assert any("not watching this fit" in r.message and "fp7" in r.message
               for r in caplog.records)


class TestDistributed:
    def test_a_ddp_fit_is_one_run_with_every_ranks_loss(self, tmp_path: Path) -> None:
        """``strategy="ddp"`` on 2 CPU processes (Lightning launches the second): the callback
        watches on both, rank 0 sends every step once with both ranks' own losses."""
        proc = subprocess.run(
            [sys.executable, "-m", "tests.client_hook.integrations.lightning_ddp_worker",
             str(tmp_path)],
            cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
        assert (zero["state"], one["state"], one["records"]) == ("closed", "closed", [])
        assert (zero["run"]["rank"], zero["run"]["world_size"]) == (0, 2)
        records = zero["records"]
        assert [r["step"] for r in records] == list(range(6))
        assert [r["ranks"]["loss"] for r in records] == [
            [a, b] for a, b in zip(zero["losses"], one["losses"], strict=True)]
        assert [r["loss"] for r in records] == [  # the mean over the ranks
            (a + b) / 2 for a, b in zip(zero["losses"], one["losses"], strict=True)]
        assert [r["layers"] is not None for r in records] == [True, False] * 3  # layer_every=2
        assert all(r["optimizers"] is None and r["lr"] == 0.05 for r in records)  # one, one group
