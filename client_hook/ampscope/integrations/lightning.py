"""``AmpscopeCallback``: ampscope inside a Lightning ``Trainer``, in one line.

    trainer = Trainer(precision="bf16-mixed", callbacks=[AmpscopeCallback(layer_every=10)])

At ``fit`` start, on every rank, it watches the ``LightningModule`` with the precision plugin's
scaler and the trainer's optimizers; without one (``bf16-mixed``, ``32``, ``16-mixed`` on a CPU,
which Lightning makes bf16) the loss comes from ``on_before_backward``, divided by
``accumulate_grad_batches`` as Lightning does. Run name, config and format come from the logger,
``hparams`` and the precision (``watch`` options override them); it closes when ``fit`` ends or
raises.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
import torch

import ampscope
from ampscope.monitor import HookState, Monitor

__all__ = ["AmpscopeCallback"]

logger = logging.getLogger("ampscope")


def _target_format(precision: str) -> str | None:
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "fp16"
    return None  # 32/64: ``watch``'s default (bf16 without a scaler)


def _run_name(trainer: pl.Trainer) -> str | None:
    log = trainer.logger
    if log is None:
        return None
    version = log.version
    return log.name if version is None or version == "" else f"{log.name}/{version}"


class AmpscopeCallback(pl.Callback):
    """See the module docstring; ``watch_options`` are ``ampscope.watch``'s keywords."""

    def __init__(self, **watch_options: Any) -> None:
        self.options = watch_options
        self.monitor: Monitor | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.monitor is not None and self.monitor.state is not HookState.CLOSED:
            return
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if not isinstance(scaler, torch.amp.GradScaler):
            scaler = None
        precision = str(trainer.precision)
        if scaler is None and precision.startswith("16") and trainer.is_global_zero:
            logger.warning(
                "ampscope: Lightning runs precision=%r without a GradScaler: FP16 gradients are "
                "not scaled and underflow; use precision='bf16-mixed', or give the trainer "
                "plugins=[MixedPrecision('16-mixed', device, scaler=torch.amp.GradScaler())]",
                precision)
        options = dict(self.options)
        options.setdefault("run", _run_name(trainer))
        options.setdefault("config", dict(pl_module.hparams))
        fmt = _target_format(precision)
        if fmt is not None:
            options.setdefault("target_format", fmt)
        try:
            self.monitor = ampscope.watch(pl_module, scaler, list(trainer.optimizers), **options)
        except Exception as exc:  # a bad option or no optimizer: fit goes on, unwatched
            logger.warning("ampscope: not watching this fit: %s", exc)

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        if self.monitor is not None and not self.monitor.has_scaler:  # else: scaler.scale
            self.monitor.record_loss(loss)  # a closed monitor ignores it

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._close()

    def _close(self) -> None:
        if self.monitor is not None:  # kept, closed: its run_id and stats stay readable
            self.monitor.close()
