"""ampscope: observability for mixed-precision (AMP) PyTorch training.

    mon = ampscope.watch(model, scaler, optimizer, run="demo")
    ...  # the usual scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
    mon.close()
"""

from __future__ import annotations

from ampscope.formats import TargetFormat
from ampscope.monitor import AmpscopeWarning, Monitor, MonitorStats, watch

__all__ = ["AmpscopeWarning", "Monitor", "MonitorStats", "TargetFormat", "watch"]
