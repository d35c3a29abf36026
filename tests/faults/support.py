"""Helpers for the fault tests: wire batches without torch, and the server's view of a run."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ampscope import wire
from ampscope.transport import HttpSender, Transport

LAYERS = [{"index": 0, "name": "fc.weight", "shape": [4, 2], "dtype": "float32", "numel": 8,
           "module_type": "Linear"}]


@dataclass
class Step:
    seq: int

    def to_wire(self) -> dict[str, Any]:
        return {"seq": self.seq, "step": self.seq, "wall_time": time.time(), "found_inf": False,
                "skipped": False, "loss": 1.0 / (self.seq + 1), "scale_before": 65536.0,
                "scale_after": 65536.0,
                "layers": {name: [0.5] if name != "nan_count" and name != "inf_count" else [0]
                           for name in wire.LAYER_STAT_NAMES}}


def encoder(run_id: str) -> Callable[[list[dict[str, Any]], bool, bool], bytes]:
    run = {"id": run_id, "project": "faults", "name": "faults", "tags": [], "config": {},
           "host": "test", "rank": 0, "target_format": "fp16"}
    attempt = {"id": str(uuid.uuid4()), "pid": 1, "started_at": time.time()}

    def encode(records: list[dict[str, Any]], include_layers: bool, final: bool) -> bytes:
        return wire.dumps({"schema_version": wire.SCHEMA_VERSION, "run": run,
                           "attempt": attempt,
                           "layers": LAYERS if include_layers else None, "records": records,
                           "final": final})
    return encode


def transport(url: str | None, spool: Path, **kw: Any) -> tuple[str, Transport]:
    run_id = str(uuid.uuid4())
    kw.setdefault("flush_interval", 0.05)
    kw.setdefault("backoff_base", 0.05)
    kw.setdefault("backoff_cap", 0.3)
    kw.setdefault("retry_window", 0.3)
    kw.setdefault("request_timeout", 3.0)
    sender = HttpSender(url) if url is not None else None
    return run_id, Transport(sender, encoder(run_id), spool_dir=spool, **kw)


def stored_seqs(url: str, run_id: str) -> list[int]:
    """Every stored (attempt, seq) of the run as a sorted list of seqs (duplicates kept)."""
    resp = httpx.get(f"{url}/api/runs/{run_id}/steps", params={"limit": 100_000}, timeout=10)
    resp.raise_for_status()
    return sorted(s["seq"] for s in resp.json()["steps"])


def wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        time.sleep(0.02)
