"""Where the test suite's CPU goes, per test file (#27): a pytest plugin, and its report.

The plugin adds, per test file, the CPU time of the test process and of the children it has
reaped (``getrusage`` SELF + CHILDREN, user + system) over each test's set-up, call and
teardown, and the wall time of the same, and writes one JSON file per pytest-xdist worker at
the end. What it cannot see: processes that are not the test process's reaped descendants (the
Postgres backends: read the postmaster's ``cutime``/``cstime`` in ``/proc`` around a run),
children still alive when a test ends (a module's server is counted at the teardown that stops
it), and the time before the first test (collection, interpreter start).

    PYTHONPATH=bench .venv/bin/pytest -p suite_cpu -n 4 --dist loadfile -q
    .venv/bin/python bench/suite_cpu.py          # the files by CPU, most first

``SUITE_CPU_DIR`` names the folder of the JSON files (default ``.suite-cpu`` here).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

OUT = Path(os.environ.get("SUITE_CPU_DIR", ".suite-cpu"))
_cpu: defaultdict[str, float] = defaultdict(float)
_wall: defaultdict[str, float] = defaultdict(float)


def _cpu_now() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    cpu, wall = _cpu_now(), time.monotonic()
    yield
    path = item.nodeid.split("::")[0]
    _cpu[path] += _cpu_now() - cpu
    _wall[path] += time.monotonic() - wall


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _cpu:
        return
    OUT.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (OUT / f"{worker}.json").write_text(json.dumps({"cpu": _cpu, "wall": _wall}))


def report(folder: Path, most: int) -> None:
    cpu: defaultdict[str, float] = defaultdict(float)
    wall: defaultdict[str, float] = defaultdict(float)
    for path in sorted(folder.glob("*.json")):
        data: dict[str, Any] = json.loads(path.read_text())
        for name, seconds in data["cpu"].items():
            cpu[name] += seconds
        for name, seconds in data["wall"].items():
            wall[name] += seconds
    print(f"{len(cpu)} files: {sum(cpu.values()):.0f} CPU-s, {sum(wall.values()):.0f} s of "
          f"workers' wall time; load {os.getloadavg()[0]:.2f} now")
    for name in sorted(cpu, key=cpu.__getitem__, reverse=True)[:most]:
        print(f"{cpu[name]:8.1f} CPU-s {wall[name]:8.1f} s  {name}")


if __name__ == "__main__":
    report(OUT, int(sys.argv[1]) if len(sys.argv) > 1 else 40)
