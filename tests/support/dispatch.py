"""The aten ops a piece of code dispatches, views not counted: the hook's host work, as the
tests assert it and the benches print it."""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

VIEWS = frozenset({"view", "reshape", "_reshape_alias", "alias", "as_strided", "detach",
                   "unsqueeze", "slice", "select", "expand", "t", "lift_fresh"})
"""Ops that only describe memory already there: no kernel, no pass over data."""


class AtenOps(TorchDispatchMode):
    """Inside ``with AtenOps() as mode:``, ``mode.ops`` lists each dispatched op by name."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name not in VIEWS:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))
