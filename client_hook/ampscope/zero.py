"""DeepSpeed engines: the step cycle's source and this rank's pieces of the gradients (a service).

DeepSpeed has no ``GradScaler``: ``engine.backward(loss)`` divides the loss by the accumulation
steps (in FP16 also scales it), and its ZeRO optimizer's ``step()`` checks the gradients, moves
the loss scale and skips an overflowed update. The hook wraps both: the loss from ``backward``,
the capture before ``step`` and the record after, its ``overflow`` flag and loss scale being
host values (``ZeroView``). Stages 1-2: ``_hp_mapping`` gives this rank's piece of each
gradient (DeepSpeed's fragment accessors, without their all-reduce), reduced already, still
scaled in FP16; pieces are disjoint and cover the parameter, so they merge as FSDP's shards do.
Stage 3: the parameter's view into the flat gradient partition, from the optimizer's private map
(the public accessor syncs a stream per parameter). Offloaded: losses, scale and skips only.
DeepSpeed is never imported: an engine is recognised by what it has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ampscope.cycle import ScalerView

__all__ = ["ZeroEngine", "ZeroView", "engine_of", "is_engine", "partitioned"]


# ZeRO stage 3's per-parameter views of its gradient partitions, keyed by ``ds_id`` (private,
# name-mangled, feature-checked: its public accessor synchronizes a stream per parameter on CUDA).
_STAGE3_PARTITIONS = "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition"


@dataclass(frozen=True)
class ZeroEngine:
    """A DeepSpeed engine with a ZeRO optimizer, as the hook uses it."""

    engine: Any  # deepspeed.DeepSpeedEngine (an nn.Module)
    optimizer: Any  # its ZeRO optimizer: step(), overflow, loss_scale
    stage: int
    fp16: bool

    @property
    def module(self) -> torch.nn.Module:
        """The user's model inside the engine: its parameters are the layers."""
        module = self.engine.module
        assert isinstance(module, torch.nn.Module)
        return module

    @property
    def torch_optimizer(self) -> torch.optim.Optimizer | None:
        """The torch optimizer the ZeRO optimizer steps: its parameter groups carry the lrs."""
        inner = getattr(self.optimizer, "optimizer", None)
        return inner if isinstance(inner, torch.optim.Optimizer) else None

    @property
    def has_pieces(self) -> bool:
        """Whether this rank's pieces are readable (not with an offloaded stage 3)."""
        if self.stage != 3:
            return True
        return (not getattr(self.optimizer, "offload_optimizer", False)
                and isinstance(getattr(self.optimizer, _STAGE3_PARTITIONS, None), dict))

    def reader(self, params: Sequence[torch.nn.Parameter]) -> Callable[
            [Sequence[torch.nn.Parameter]], list[torch.Tensor | None]]:
        """What the capture reads between a step's last backward and the optimizer's ``step``:
        each parameter's 1-D piece on this rank (None: none)."""
        if not self.has_pieces:
            return lambda ps: [None] * len(ps)
        if self.stage != 3:
            return lambda ps: [_piece(p) for p in ps]
        keys = [(getattr(p, "ds_id", None), _stage3_valid(p)) for p in params]
        optimizer = self.optimizer

        def stage3(_: Sequence[torch.nn.Parameter]) -> list[torch.Tensor | None]:
            # Looked up each step: DeepSpeed replaces the map when it offloads its states.
            partitions = getattr(optimizer, _STAGE3_PARTITIONS)
            return [None if valid == 0 or (grad := partitions.get(key)) is None
                    else grad.reshape(-1)[:valid] for key, valid in keys]

        return stage3

    def piece_numels(self, params: Sequence[torch.nn.Parameter]) -> list[int]:
        """This rank's number of elements of each parameter (0: none of it)."""
        if self.stage == 3:
            return [_stage3_valid(p) for p in params]
        return [0 if (m := getattr(p, "_hp_mapping", None)) is None
                else int(m.lp_fragment_address.numel) for p in params]

    def full_shapes(self) -> dict[int, tuple[list[int], int]] | None:
        """Stage 3: each parameter's real shape and size by id (outside forward, a placeholder)."""
        if self.stage != 3:
            return None
        return {id(p): (list(p.ds_shape), int(p.ds_numel)) for p in self.module.parameters()
                if hasattr(p, "ds_shape") and hasattr(p, "ds_numel")}

    def loss_share(self, loss: torch.Tensor, scale_wrt_gas: bool) -> torch.Tensor:
        """One ``backward``'s share of the loss, divided by the accumulation steps as DeepSpeed."""
        steps = int(self.engine.gradient_accumulation_steps())
        return loss / steps if scale_wrt_gas and steps > 1 else loss


def is_engine(model: Any) -> bool:
    """Whether ``model`` is a DeepSpeed engine (duck-typed: DeepSpeed is never imported)."""
    return (isinstance(model, torch.nn.Module)
            and callable(getattr(model, "zero_optimization_stage", None))
            and isinstance(getattr(model, "module", None), torch.nn.Module))


def engine_of(model: Any) -> ZeroEngine | None:
    """``model`` as a DeepSpeed engine with a ZeRO optimizer (stage ≥ 1), else None; stage 0
    (whose own FP16/BF16 optimizers the hook does not wrap) raises, saying so."""
    if not is_engine(model):
        return None
    stage = int(model.zero_optimization_stage())
    optimizer = getattr(model, "optimizer", None)
    if stage < 1 or not callable(getattr(optimizer, "step", None)):
        raise ValueError(
            "ampscope watches DeepSpeed engines with ZeRO stage 1, 2 or 3 (this one has stage "
            f"{stage}{'' if optimizer is not None else ' and no optimizer'}); for stage 0 watch "
            "a plain torch loop, or set zero_optimization.stage")
    fp16 = bool(getattr(model, "fp16_enabled", lambda: False)())
    return ZeroEngine(model, optimizer, stage, fp16)


def partitioned(model: torch.nn.Module) -> bool:
    """Whether a ZeRO optimizer manages ``model``'s parameters (an engine's inner module)."""
    return any(hasattr(p, "_hp_mapping") or hasattr(p, "ds_id") for p in model.parameters())


def _piece(p: torch.nn.Parameter) -> torch.Tensor | None:
    mapping = getattr(p, "_hp_mapping", None)
    if mapping is None:
        return None
    grad = mapping.get_lp_grad_fragment(p._index_in_param_group)  # type: ignore[attr-defined]
    address = mapping.lp_fragment_address
    flat: torch.Tensor = grad.reshape(-1)
    if flat.numel() != address.numel:
        # A whole-parameter buffer (DeepSpeed's BF16 accumulation keeps one on every rank): only
        # this rank's piece counts, as in DeepSpeed's own get_full_hp_grad.
        flat = flat.narrow(0, address.start, address.numel)
    return flat


def _stage3_valid(p: Any) -> int:
    """How many of a stage-3 parameter's elements this rank's (padded) partition holds."""
    size = int(p.ds_tensor.ds_numel)
    rank = int(getattr(p, "ds_zero_partition_rank", 0))
    return max(0, min(size, int(p.ds_numel) - rank * size))


class ZeroView(ScalerView):
    """The ZeRO optimizer read as a scaler: its FP16 loss scale and whether it skipped."""

    def __init__(self, zero: ZeroEngine) -> None:
        super().__init__(None)
        self._zero = zero
        self.present = self.on = zero.fp16
        self.skips_on_host = True

    def _scale(self) -> float:
        return float(self._zero.optimizer.loss_scale)

    def scale_in_effect(self) -> torch.Tensor | float:
        return self._scale() if self._zero.fp16 else 1.0

    def stage(self, optimizer: torch.optim.Optimizer) -> str | None:
        return None

    def scaled_state(
        self,
        optimizer: torch.optim.Optimizer,
        optimizers: Sequence[torch.optim.Optimizer],
        params: Sequence[torch.nn.Parameter],
    ) -> bool | list[bool]:
        # Captured before the ZeRO step, which unscales: FP16 pieces still carry the scale.
        return self._zero.fp16 if params else []

    def before_update(
        self, each: bool | Sequence[torch.optim.Optimizer] = False
    ) -> dict[str, Any]:
        return {"scale_host": self._scale()} if self._zero.fp16 else {}

    def host_skip(self) -> bool | None:
        return bool(getattr(self._zero.optimizer, "overflow", False))

    def after_update(
        self, before: Mapping[str, Any], device: torch.device, snapshot: bool = False
    ) -> tuple[list[torch.Tensor], set[str], bool]:
        if not self._zero.fp16:
            return super().after_update(before, device, snapshot)

        def const(x: float) -> torch.Tensor:
            return torch.full((), x, dtype=torch.float64, device=device)

        found = 1.0 if self.host_skip() else 0.0
        values = [const(before.get("scale_host", float("nan"))), const(self._scale()),
                  const(0.0), const(found)]
        return values, {"growth_tracker"}, False
