"""The order in which the watched parameters' gradients become ready in the backward pass.

Learned once, by ``register_post_accumulate_grad_hook``s during the first cycle that runs a
backward, then removed (later steps pay nothing). Overflow events list non-finite layers in this
order; layers not seen (or all, without the hook API) follow in reverse model order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["BackwardOrder"]


class BackwardOrder:
    def __init__(self, params: Sequence[torch.nn.Parameter]) -> None:
        self._num = len(params)
        self._seen: list[int] = []
        self._seen_set: set[int] = set()
        self._handles: list[Any] = []
        self._order: list[int] | None = None
        # Plain attributes (the step cycle reads them every step; a property is a Python call):
        # whether the hooks are still learning, and the order once it is final.
        self.learning = False
        self.final: list[int] | None = None
        if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
            self._order = self.final = list(range(self._num - 1, -1, -1))
            return
        for i, p in enumerate(params):
            self._handles.append(p.register_post_accumulate_grad_hook(self._hook(i)))
        self.learning = bool(self._handles)

    def _hook(self, index: int) -> Any:
        def ready(_: torch.Tensor) -> None:
            if index not in self._seen_set:  # set/list appends cannot raise into backward
                self._seen_set.add(index)
                self._seen.append(index)
        return ready

    def end_cycle(self) -> None:
        """At ``update()``: stop learning once a backward has been seen (or give up on close)."""
        if self._handles and self._seen:
            self.remove()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.learning = False
        self.final = self.order()

    def order(self) -> list[int]:
        """Layer indices in backward order (a permutation of all watched layers)."""
        if self._order is None and not self._handles:
            rest = [i for i in range(self._num - 1, -1, -1) if i not in self._seen_set]
            self._order = self._seen + rest
        if self._order is not None:
            return self._order
        return self._seen + [i for i in range(self._num - 1, -1, -1) if i not in self._seen_set]
