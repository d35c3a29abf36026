"""A 2-process Lightning DDP fit on the CPU (``strategy="ddp"``, gloo) with ``AmpscopeCallback``,
for ``test_lightning.TestDistributed``. Lightning's launcher starts the second process by
running this module again; each process writes what its monitor recorded to ``OUT/rankN.json``,
with the losses its ``training_step`` returned."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from ampscope.integrations.lightning import AmpscopeCallback
from ampscope.transport import MemorySender
from tests.client_hook.integrations.test_lightning import Regressor
from tests.support.distributed import leave

STEPS = 6


def main(out: Path) -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4 * 2 * STEPS, 8), torch.randn(4 * 2 * STEPS, 4))
    sender = MemorySender()
    callback = AmpscopeCallback(sender=sender, activation_every=0, layer_every=2,
                                dist_timeout_s=20)
    module = Regressor()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", precision="bf16-mixed",
                         max_steps=STEPS, callbacks=[callback], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(module, DataLoader(data, batch_size=4, shuffle=False))
    monitor = callback.monitor
    payloads = sender.payloads()
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps({
        "rank": trainer.global_rank,
        "state": None if monitor is None else monitor.state.value,
        "run": payloads[0]["run"] if payloads else None,
        "records": [r for p in payloads for r in p["records"]],
        "losses": module.losses,
    }))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    leave()  # the exit status is the work's, not torch's teardown's
