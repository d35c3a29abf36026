"""One process-wide forward hook for the length of a sampled step (the activation and formats
probes): registered by ``arm``, removed by ``disarm``, nothing left on a module.

``generation`` counts both, so a tensor hook a probe left on a graph that is still alive can
tell it belongs to a finished sample and do nothing. A global hook is seen by compiled graphs,
which guard on it; torch's warning about it is filtered at each arm (``catch_warnings``
blocks, pytest's among them, reset the filters).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["SampledHook"]


class SampledHook:
    def __init__(self, hook: Callable[[torch.nn.Module, Any, Any], None]) -> None:
        self._hook = hook
        self._handle: Any = None
        self.generation = 0

    @property
    def registered(self) -> bool:
        return self._handle is not None

    def arm(self) -> None:
        if self._handle is not None:
            return
        self.generation += 1
        warnings.filterwarnings(
            "ignore", category=UserWarning,
            message=r"Using `torch\.compile\(module\)` when there are global hooks")
        self._handle = torch.nn.modules.module.register_module_forward_hook(self._hook)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.generation += 1
