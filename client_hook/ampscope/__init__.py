"""ampscope: observability for mixed-precision (AMP) PyTorch training.

    mon = ampscope.watch(model, scaler, optimizer, run="demo")
    ...  # the usual scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
    mon.close()

The public names are imported lazily, so the torch-free modules (``ampscope.wire``,
``ampscope.transport``, ``ampscope.spool``) load without torch: ``ampscope sync`` uses them on
machines that have no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ampscope.formats import TargetFormat
    from ampscope.monitor import AmpscopeWarning, Monitor, MonitorStats, watch
    from ampscope.run_view import RunView, notebook

__all__ = ["AmpscopeWarning", "Monitor", "MonitorStats", "RunView", "TargetFormat", "notebook",
           "watch"]

_HOME = {
    "AmpscopeWarning": "ampscope.monitor",
    "Monitor": "ampscope.monitor",
    "MonitorStats": "ampscope.monitor",
    "watch": "ampscope.monitor",
    "TargetFormat": "ampscope.formats",
    "RunView": "ampscope.run_view",
    "notebook": "ampscope.run_view",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'ampscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
