"""A Lightning run watched by ampscope: ``python examples/integrations/lightning_bf16.py``.

A tiny regression model trained with ``precision="bf16-mixed"`` (no GradScaler) on the CPU, into
the server at ``--server`` (``ampscope serve`` on the default http://127.0.0.1:8765; with
``AMPSCOPE_MODE=offline`` the records go to the spool). The whole integration is the callback.
"""

from __future__ import annotations

import argparse
import warnings

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ampscope.integrations.lightning import AmpscopeCallback


class Regressor(pl.LightningModule):
    def __init__(self, width: int = 64, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(16, width), nn.GELU(), nn.Linear(width, 4))

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        loss: torch.Tensor = nn.functional.mse_loss(self.net(x).float(), y)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", default="http://127.0.0.1:8765")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1024, 16), torch.randn(1024, 4))
    trainer = pl.Trainer(
        max_steps=args.steps, accelerator="cpu", devices=1, precision="bf16-mixed",
        callbacks=[AmpscopeCallback(server=args.server, layer_every=10)],
        enable_checkpointing=False, enable_progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on dataloader workers
        trainer.fit(Regressor(), DataLoader(data, batch_size=32, shuffle=True))


if __name__ == "__main__":
    main()
