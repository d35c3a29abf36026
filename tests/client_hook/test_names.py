"""Canonical layer names (`ampscope.names`): the shared cases, then real wrapped torch models."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    _CHECKPOINT_WRAPPED_MODULE,
    checkpoint_wrapper,
)
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp._common_utils import FSDP_WRAPPED_MODULE
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from ampscope.names import INNER_WRAPPERS, canonical_name, canonical_names
from tests.support.layer_names import CASES, COLLIDING


class TestCanonicalName:
    @pytest.mark.parametrize(("raw", "expected"), CASES)
    def test_cases(self, raw: str, expected: str) -> None:
        assert canonical_name(raw) == expected

    @pytest.mark.parametrize(("raw", "expected"), CASES)
    def test_idempotent(self, raw: str, expected: str) -> None:
        assert canonical_name(expected) == expected

    def test_the_components_are_torchs(self) -> None:
        """Typed in `names.py` (the hook imports no private torch module): checked here."""
        compiled = torch.compile(nn.Linear(2, 2), backend="eager")
        assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
        assert {FSDP_WRAPPED_MODULE, _CHECKPOINT_WRAPPED_MODULE, "_orig_mod"} == INNER_WRAPPERS
        assert next(name for name, _ in compiled.named_parameters()).startswith("_orig_mod.")


class TestCanonicalNames:
    @pytest.mark.parametrize(("raws", "expected"), COLLIDING)
    def test_collisions_keep_raw_names(self, raws: list[str], expected: list[str]) -> None:
        assert canonical_names(raws) == expected


# --- real wrapped models -------------------------------------------------------------------------

class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList([_Block(), _Block()])
        self.head = nn.Linear(4, 2)


PLAIN = [
    "embed.weight",
    "layers.0.attn.weight", "layers.0.attn.bias", "layers.0.norm.weight", "layers.0.norm.bias",
    "layers.1.attn.weight", "layers.1.attn.bias", "layers.1.norm.weight", "layers.1.norm.bias",
    "head.weight", "head.bias",
]


def _names(model: object) -> list[str]:
    # torch.compile is typed as returning a callable: the OptimizedModule is checked here.
    assert isinstance(model, nn.Module)
    return [name for name, _ in model.named_parameters()]


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    """A one-process gloo group over a file store: DDP and FSDP1 on the CPU, no network."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class TestWrappedModels:
    def test_plain(self) -> None:
        assert _names(_Net()) == PLAIN
        assert canonical_names(PLAIN) == PLAIN

    def test_compile(self) -> None:
        # backend="eager": the prefix is the OptimizedModule's whatever the backend, and the
        # default (inductor) imports modules that warn on import (the suite's warnings are
        # errors); nothing is compiled until a forward anyway.
        names = _names(torch.compile(_Net(), backend="eager"))
        assert names == [f"_orig_mod.{name}" for name in PLAIN]
        assert canonical_names(names) == PLAIN

    def test_data_parallel(self) -> None:
        names = _names(nn.DataParallel(_Net()))  # on the CPU it only holds the model
        assert names == [f"module.{name}" for name in PLAIN]
        assert canonical_names(names) == PLAIN

    def test_distributed_data_parallel(self, process_group: None) -> None:
        names = _names(nn.parallel.DistributedDataParallel(_Net()))
        assert names == [f"module.{name}" for name in PLAIN]
        assert canonical_names(names) == PLAIN

    def test_checkpoint_wrapper_inside_data_parallel_inside_compile(self) -> None:
        net = _Net()
        net.layers[0] = checkpoint_wrapper(net.layers[0])
        names = _names(torch.compile(nn.DataParallel(net), backend="eager"))
        assert names[:3] == [
            "_orig_mod.module.embed.weight",
            "_orig_mod.module.layers.0._checkpoint_wrapped_module.attn.weight",
            "_orig_mod.module.layers.0._checkpoint_wrapped_module.attn.bias",
        ]
        assert names[5] == "_orig_mod.module.layers.1.attn.weight"
        assert canonical_names(names) == PLAIN

    def test_fsdp1_with_original_parameters(self, process_group: None) -> None:
        with warnings.catch_warnings():
            # One process: FSDP says it falls back to NO_SHARD, which is all this test needs.
            warnings.filterwarnings("ignore", message="FSDP is switching to use `NO_SHARD`")
            model = FullyShardedDataParallel(
                _Net(), device_id=torch.device("cpu"), use_orig_params=True,
                auto_wrap_policy=ModuleWrapPolicy({_Block}))
        names = _names(model)
        assert names[:2] == ["_fsdp_wrapped_module.embed.weight",
                             "_fsdp_wrapped_module.layers.0._fsdp_wrapped_module.attn.weight"]
        assert canonical_names(names) == PLAIN
