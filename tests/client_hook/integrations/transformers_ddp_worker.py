"""One process of a 2-process Hugging Face ``Trainer`` job on the CPU (DDP over gloo, as
``torchrun`` would start it: ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` in the
environment), with ``attach``; for ``test_transformers.test_a_ddp_job_is_one_run``. Writes what
its monitor recorded to ``OUT/rankN.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ampscope.integrations.transformers import attach
from ampscope.transport import MemorySender
from tests.client_hook.integrations.test_transformers import STEPS, make_trainer
from tests.support.distributed import leave


def main(out: Path) -> None:
    trainer, log = make_trainer(out / "trainer", bf16=True)
    sender = MemorySender()
    callback = attach(trainer, sender=sender, activation_every=0, layer_every=2,
                      dist_timeout_s=20)
    trainer.train()
    rank = torch.distributed.get_rank()
    monitor = callback.monitor
    payloads = sender.payloads()
    (out / f"rank{rank}.json").write_text(json.dumps({
        "world_size": trainer.args.world_size,
        "state": None if monitor is None else monitor.state.value,
        "run": payloads[0]["run"] if payloads else None,
        "records": [r for p in payloads for r in p["records"]],
        "logged": log.losses,
        "steps": STEPS,
    }))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    leave()  # the exit status is the work's, not torch's teardown's
