"""``AmpscopeCallback``/``attach`` in a real Hugging Face ``Trainer`` (CPU, a tiny GPT-2 built
from its config, no download): every optimizer step recorded once, the loss as the trainer
logs it (gradient accumulation included), without a scaler (``bf16=True``, and ``fp16=True`` on a
CPU, which trains FP32: one warning) and with accelerate's scaler path driven by a real
``GradScaler``."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from torch.utils.data import Dataset

from ampscope.integrations.transformers import AmpscopeCallback, attach
from ampscope.transport import MemorySender
from tests.support.distributed import launch

pytestmark = pytest.mark.frameworks

STEPS = 8


class Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int = 64, length: int = 12) -> None:
        gen = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 64, (n, length), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class LossLog(transformers.TrainerCallback):
    """The per-step losses and gradient norms the trainer logs (``logging_steps=1``)."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.grad_norms: list[float] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
            if "grad_norm" in logs:
                self.grad_norms.append(float(logs["grad_norm"]))


def make_trainer(tmp_path: Path, accumulate: int = 1, **args: Any) -> tuple[
        transformers.Trainer, LossLog]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1,
                                     n_head=2)
    model = transformers.GPT2LMHeadModel(config)  # type: ignore[no-untyped-call]
    log = LossLog()
    training = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=STEPS, per_device_train_batch_size=4,
        gradient_accumulation_steps=accumulate, logging_steps=1, save_strategy="no",
        report_to=[], run_name="gpt2-tiny", use_cpu=True, dataloader_num_workers=0,
        learning_rate=1e-3, **args)
    trainer = transformers.Trainer(model=model, args=training, train_dataset=Tokens(),
                                   callbacks=[log])
    return trainer, log


def records(sender: MemorySender) -> list[dict[str, Any]]:
    return [r for p in sender.payloads() for r in p["records"]]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_bf16_without_a_scaler_records_the_logged_loss(tmp_path: Path, accumulate: int) -> None:
    trainer, log = make_trainer(tmp_path, accumulate, bf16=True)
    sender = MemorySender()
    callback = attach(trainer, sender=sender, layer_every=2, activation_every=0)
    trainer.train()
    recs = records(sender)
    assert [r["step"] for r in recs] == list(range(STEPS))
    assert {(r["scale_before"], r["skipped"]) for r in recs} == {(None, False)}
    # the trainer logs each step's loss rounded to 4 significant digits
    assert [r["loss"] for r in recs] == pytest.approx(log.losses, rel=1e-3)
    run = sender.payloads()[0]["run"]
    assert run["name"] == "gpt2-tiny" and run["target_format"] == "bf16"
    assert run["config"]["gradient_accumulation_steps"] == accumulate
    assert callback.monitor is not None and callback.monitor.state.value == "closed"
    assert "training_step" not in vars(trainer) and "train" not in vars(trainer)


def test_fp16_on_a_cpu_trains_fp32_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trainer, _ = make_trainer(tmp_path, fp16=True)
    sender = MemorySender()
    attach(trainer, sender=sender, activation_every=0)
    with caplog.at_level(logging.WARNING, logger="ampscope"):
        trainer.train()
    assert len(records(sender)) == STEPS
    warned = [r.message for r in caplog.records if "fp16=True" in r.message]
    assert len(warned) == 1 and "no GradScaler" in warned[0]


def test_with_accelerates_scaler_the_records_follow_the_scaler(tmp_path: Path) -> None:
    """accelerate builds no GradScaler on a CPU: give it one, as a CUDA fp16 run has, so its
    scale / step / update path (``AcceleratedOptimizer``) drives the hook."""
    trainer, log = make_trainer(tmp_path)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=2)
    trainer.accelerator.scaler = scaler  # read by backward() and by prepare()'s optimizer
    sender = MemorySender()
    truth: list[tuple[float, float]] = []

    class Truth(transformers.TrainerCallback):
        def on_pre_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            truth.append((scaler.get_scale(), math.nan))

        def on_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            truth[-1] = (truth[-1][0], scaler.get_scale())

    trainer.add_callback(Truth())
    attach(trainer, sender=sender, layer_every=1, activation_every=0)
    trainer.train()
    recs = records(sender)
    assert [r["step"] for r in recs] == list(range(STEPS))
    assert [(r["scale_before"], r["scale_after"]) for r in recs] == truth
    skipped = [after < before for before, after in truth]
    assert any(skipped) and not all(skipped)  # 2^127 overflows first, then trains
    assert [r["skipped"] for r in recs] == skipped
    # AcceleratedOptimizer.step is no bypass. But the Trainer's clip (max_grad_norm 1.0) goes
    # through Accelerator.clip_grad_norm_, which unscales only with its own native fp16 AMP, not
    # with a scaler handed over as here: it clips the scaled gradients, on every step, and the
    # hook says so on every step (its 16 parameter tensors).
    assert trainer.args.max_grad_norm == 1.0 and not trainer.accelerator.native_amp
    assert {(m["kind"], m["detail"].split(" gradients")[0]) for r in recs
            for m in r["misuse"]} == {("clip_before_unscale", "16 of 16")}
    assert all(len(r["misuse"]) == 1 for r in recs)
    assert [r["loss"] for r in recs if not r["skipped"]] == pytest.approx(
        [x for x, s in zip(log.losses, skipped, strict=True) if not s], rel=1e-3)


def test_a_callback_alone_records_the_steps(tmp_path: Path) -> None:
    trainer, _ = make_trainer(tmp_path, bf16=True)
    sender = MemorySender()
    callback = AmpscopeCallback(sender=sender, activation_every=0)
    trainer.add_callback(callback)
    trainer.train()
    recs = records(sender)
    assert [r["step"] for r in recs] == list(range(STEPS))
    assert {r["loss"] for r in recs} == {None}  # no scaler, no attach: no loss to read


def test_a_watch_that_fails_leaves_the_training_unwatched(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trainer, log = make_trainer(tmp_path, bf16=True)
    callback = attach(trainer, sender=MemorySender(), target_format="fp7")  # no such format
    with caplog.at_level(logging.WARNING, logger="ampscope"):
        trainer.train()
    assert callback.monitor is None and len(log.losses) == STEPS  # trained all the same
    assert any("not watching this training" in r.message and "fp7" in r.message
               for r in caplog.records)


def test_a_ddp_job_is_one_run_with_the_loss_the_trainer_logs(tmp_path: Path) -> None:
    """Two processes started as ``torchrun`` would (gloo on the CPU): the callback watches on
    both, process zero sends every step once; its loss is the mean over the ranks, as the
    trainer logs it, and each rank's own is in ``ranks``."""
    launch("tests.client_hook.integrations.transformers_ddp_worker", [str(tmp_path)])
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert (zero["world_size"], zero["run"]["world_size"], zero["state"]) == (2, 2, "closed")
    assert (one["records"], one["state"]) == ([], "closed")
    records = zero["records"]
    assert [r["step"] for r in records] == list(range(STEPS))
    assert [r["loss"] for r in records] == pytest.approx(zero["logged"], rel=1e-6)
    assert [r["loss"] for r in records] == pytest.approx(
        [sum(r["ranks"]["loss"]) / 2 for r in records], rel=1e-12)
    assert len({tuple(r["ranks"]["loss"]) for r in records}) == STEPS  # two ranks, own batches


def test_a_deepspeed_job_is_one_run_with_the_logged_loss_and_grad_norm(tmp_path: Path) -> None:
    """``TrainingArguments(deepspeed=...)`` (ZeRO-2, BF16, two micro-batches per step), two
    processes: ``attach`` watches the trainer's DeepSpeed engine on both; the loss is the one
    the trainer logs and the gradient norm the one DeepSpeed computed for clipping, merged here
    from the two ranks' ZeRO partitions."""
    launch("tests.client_hook.integrations.transformers_deepspeed_worker",
           [str(tmp_path), "attach"])
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert (zero["engine"], zero["state"], zero["errors"]) == ("DeepSpeedEngine", "closed", 0)
    assert (one["records"], one["state"], one["errors"]) == ([], "closed", 0)
    assert zero["run"]["world_size"] == 2 and zero["run"]["target_format"] == "bf16"
    records = zero["records"]
    assert [r["step"] for r in records] == list(range(STEPS))
    assert [r["loss"] for r in records] == pytest.approx(zero["logged"], rel=1e-6)
    assert [r["grad_norm"] for r in records] == pytest.approx(zero["grad_norms"], rel=1e-6)
    assert [r["layers"] is not None for r in records] == [s % 2 == 0 for s in range(STEPS)]
    assert {(r["scale_before"], r["skipped"]) for r in records} == {(None, False)}
    # The trainer's two parameter groups (weight decay and none): DeepSpeed's one skip decision
    # and both groups' lr, as the scheduler set them.
    assert [[(o["skipped"], len(o["lr"])) for o in r["optimizers"]] for r in records] == [
        [(False, 2)]] * STEPS
    assert [r["optimizers"][0]["lr"] for r in records] == [[r["lr"], r["lr"]] for r in records]


def test_a_bare_callback_under_deepspeed_says_to_attach_and_does_not_watch(
        tmp_path: Path) -> None:
    launch("tests.client_hook.integrations.transformers_deepspeed_worker",
           [str(tmp_path), "callback"], world=1)
    zero = json.loads((tmp_path / "rank0.json").read_text())
    assert (zero["engine"], zero["state"], zero["records"]) == ("DeepSpeedEngine", None, [])
    assert len(zero["logged"]) == STEPS  # trained all the same
    assert [m for m in zero["warnings"] if "DeepSpeed" in m] == [
        "ampscope: not watching this training: under DeepSpeed the gradients are in the "
        "engine's partitions; use attach(trainer), which watches the engine"]
