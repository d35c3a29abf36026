"""``AmpscopeCallback``: ampscope inside a Hugging Face ``Trainer``.

    callback = attach(trainer, layer_every=10)   # or Trainer(callbacks=[AmpscopeCallback()])
    trainer.train()

At ``on_train_begin``, on every process, it watches the model with the prepared optimizer's
scaler (accelerate's ``.scaler``; None under bf16/FP32, or ``fp16=True`` on a CPU: a warning says
so) and the torch optimizer inside, taking run name, config and format from the
``TrainingArguments``; it closes at ``on_train_end`` or when ``train()`` raises through
``attach``. Without a scaler ``attach`` wraps the instance's ``training_step`` to hand each loss
to ``Monitor.record_loss`` (a callback alone records none); under DeepSpeed ``attach`` watches
the trainer's engine (a callback alone cannot, and says so).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import transformers

import ampscope
from ampscope import zero
from ampscope.monitor import HookState, Monitor

__all__ = ["AmpscopeCallback", "attach"]

logger = logging.getLogger("ampscope")


class AmpscopeCallback(transformers.TrainerCallback):
    """See the module docstring; ``watch_options`` are ``ampscope.watch``'s keywords."""

    def __init__(self, **watch_options: Any) -> None:
        self.options = watch_options
        self.monitor: Monitor | None = None
        self.trainer: transformers.Trainer | None = None  # set by ``attach``

    def on_train_begin(self, args: transformers.TrainingArguments,
                       state: transformers.TrainerState, control: transformers.TrainerControl,
                       model: torch.nn.Module | None = None,
                       optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        if model is None or optimizer is None or (
                self.monitor is not None and self.monitor.state is not HookState.CLOSED):
            return
        # Under DeepSpeed the trainer's model_wrapped is the engine (known through ``attach``).
        engine = getattr(self.trainer, "model_wrapped", None)
        if not zero.is_engine(engine):
            engine = None
            if zero.partitioned(model):
                logger.warning("ampscope: not watching this training: under DeepSpeed the "
                               "gradients are in the engine's partitions; use attach(trainer), "
                               "which watches the engine")
                return
        scaler = getattr(optimizer, "scaler", None)
        if not isinstance(scaler, torch.amp.GradScaler):
            scaler = None
        if engine is None and scaler is None and args.fp16 and state.is_world_process_zero:
            logger.warning(
                "ampscope: TrainingArguments(fp16=True) but the trainer made no GradScaler (on "
                "a CPU it trains in FP32): nothing is in FP16 here; use bf16=True on a CPU, or "
                "a CUDA device for FP16")
        options = dict(self.options)
        options.setdefault("run", args.run_name)
        options.setdefault("config", args.to_dict())  # type: ignore[no-untyped-call]
        if args.bf16:
            options.setdefault("target_format", "bf16")
        elif args.fp16:
            options.setdefault("target_format", "fp16")
        try:
            if engine is not None:
                self.monitor = ampscope.watch(engine, **options)
            else:
                self.monitor = ampscope.watch(model, scaler, optimizer, **options)
        except Exception as exc:  # a bad option: training goes on, unwatched
            logger.warning("ampscope: not watching this training: %s", exc)

    def on_train_end(self, args: transformers.TrainingArguments,
                     state: transformers.TrainerState, control: transformers.TrainerControl,
                     **kwargs: Any) -> None:
        self.close()

    def record_loss(self, loss: Any) -> None:
        """The loss of one ``training_step`` (``attach``): kept only without a scaler."""
        mon = self.monitor
        if mon is not None and not mon.has_scaler and isinstance(loss, torch.Tensor):
            mon.record_loss(loss)

    def close(self) -> None:
        if self.monitor is not None:  # kept, closed: its run_id and stats stay readable
            self.monitor.close()


def attach(trainer: transformers.Trainer, **watch_options: Any) -> AmpscopeCallback:
    """Add an ``AmpscopeCallback`` to ``trainer``, handing it each step's loss; returns it."""
    callback = AmpscopeCallback(**watch_options)
    callback.trainer = trainer
    trainer.add_callback(callback)
    step = trainer.training_step
    train = trainer.train

    @functools.wraps(step)
    def training_step(*args: Any, **kwargs: Any) -> Any:
        loss = step(*args, **kwargs)
        try:
            callback.record_loss(loss)
        except Exception as exc:  # never into training
            logger.warning("ampscope could not record the loss: %r", exc)
        return loss

    @functools.wraps(train)
    def train_then_detach(*args: Any, **kwargs: Any) -> Any:
        try:
            return train(*args, **kwargs)
        finally:
            callback.close()
            for name in ("training_step", "train"):  # the trainer's own methods again
                vars(trainer).pop(name, None)

    trainer.training_step = training_step  # type: ignore[method-assign]
    trainer.train = train_then_detach  # type: ignore[method-assign]
    return callback
