"""One process of a 2-process Hugging Face ``Trainer`` job on DeepSpeed ZeRO-2 (BF16, the CPU,
gloo), started as ``torchrun`` would; with ``attach``, which watches the trainer's engine; for
``test_transformers.test_a_deepspeed_job_is_one_run``. Writes what its monitor recorded and what
the trainer logged to ``OUT/rankN.json``. ``argv[2]``: ``attach``, or ``callback`` for a bare
``AmpscopeCallback`` in ``Trainer(callbacks=...)``, which cannot see the engine."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

from ampscope.integrations.transformers import AmpscopeCallback, attach
from ampscope.transport import MemorySender
from tests.client_hook.integrations.test_transformers import make_trainer
from tests.support.distributed import capture_logs, leave, without_deepspeed_shm_build

DEEPSPEED = {
    "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"},
}


def main(out: Path, how: str) -> None:
    without_deepspeed_shm_build()
    trainer, log = make_trainer(out / "trainer", accumulate=2, bf16=True, deepspeed=DEEPSPEED)
    sender = MemorySender()
    options: dict[str, Any] = {"sender": sender, "activation_every": 0, "layer_every": 2,
                               "dist_timeout_s": 20}
    if how == "attach":
        callback = attach(trainer, **options)
    else:
        callback = AmpscopeCallback(**options)
        trainer.add_callback(callback)
    with warnings.catch_warnings(), capture_logs() as logged:
        warnings.simplefilter("ignore")
        trainer.train()
    rank = torch.distributed.get_rank()
    monitor = callback.monitor
    payloads = sender.payloads()
    (out / f"rank{rank}.json").write_text(json.dumps({
        "engine": type(trainer.model_wrapped).__name__,
        "state": None if monitor is None else monitor.state.value,
        "errors": None if monitor is None else monitor.stats().internal_errors,
        "run": payloads[0]["run"] if payloads else None,
        "records": [r for p in payloads for r in p["records"]],
        "logged": log.losses,
        "grad_norms": log.grad_norms,
        "warnings": logged,
    }))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
    leave()  # the exit status is the work's, not torch's teardown's
