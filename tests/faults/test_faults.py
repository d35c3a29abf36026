"""Never loses a step: real `ampscope serve` processes, a TCP fault proxy, exact stored sets.

Every loop is bounded in count and in time; each test asserts the exact set of stored seqs (no
loss, zero duplicates) through the read API, and the transport's accounting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampscope.spool import Frame, scan, spool_files
from ampscope.sync import sync
from ampscope.transport import Mode, Transport, TransportStats
from tests.faults.proxy import FaultProxy
from tests.faults.support import Step, stored_seqs, transport, wait_until
from tests.support.databases import migrated_database
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.slow

# close() returns as soon as everything is delivered; its timeout is only the bound beyond which
# it spools the rest. 5 s was too short under load: after a restart the sender may still be in
# its retry back-off, and a close that stops sending a second before its deadline left 41 of 360
# records in the spool (a loaded run of the whole suite, 2026-12-06).
CLOSE_S = 60.0


def balanced(s: TransportStats) -> bool:
    return s.produced == s.acknowledged + s.spooled + s.dropped + s.pending and min(
        s.acknowledged, s.spooled, s.dropped, s.pending) >= 0



def produce(t: Transport, seqs: range, pace: float = 0.002) -> None:
    for i in seqs:
        t.put(Step(i))
        assert balanced(t.stats())
        time.sleep(pace)


def assert_all_delivered(t: Transport, url: str, run_id: str, n: int) -> TransportStats:
    stats = t.stats()
    assert stored_seqs(url, run_id) == list(range(n))
    assert stats.produced == stats.acknowledged == n
    assert (stats.spooled, stats.dropped, stats.pending) == (0, 0, 0)
    return stats


def test_server_absent_at_start_and_appearing_later(
    sqlite_server: ServerProcess, tmp_path: Path
) -> None:
    run_id, t = transport(sqlite_server.url, tmp_path / "spool")
    produce(t, range(0, 150))
    wait_until(lambda: t.stats().spooled == 150, 5)
    assert t.mode is Mode.SPOOLING
    sqlite_server.start()
    produce(t, range(150, 300))
    t.close(CLOSE_S)
    stats = assert_all_delivered(t, sqlite_server.url, run_id, 300)
    assert stats.replayed >= 150
    assert list((tmp_path / "spool").iterdir()) == []


def kill_and_restart(server: ServerProcess, tmp_path: Path, rounds: int) -> None:
    run_id, t = transport(server.url, tmp_path / "spool")
    n = 0
    for _ in range(rounds):
        produce(t, range(n, n + 80))
        n += 80
        server.kill()
        produce(t, range(n, n + 80))  # the server is gone: these go to the spool
        n += 80
        server.start()
    produce(t, range(n, n + 40))
    n += 40
    t.close(CLOSE_S)
    stats = assert_all_delivered(t, server.url, run_id, n)
    assert stats.replayed > 0 and stats.failed_requests > 0


def test_server_killed_and_restarted_several_times(
    sqlite_server: ServerProcess, tmp_path: Path
) -> None:
    sqlite_server.start()
    kill_and_restart(sqlite_server, tmp_path, rounds=3)


@pytest.mark.postgres
def test_server_killed_and_restarted_on_postgres(tmp_path: Path) -> None:
    with migrated_database("postgres", tmp_path) as url:
        _kill_and_restart_on(url, tmp_path)


def _kill_and_restart_on(url: str, tmp_path: Path) -> None:
    server = ServerProcess(url, tmp_path)
    try:
        server.start()
        kill_and_restart(server, tmp_path, rounds=2)
    finally:
        server.kill()


def test_ack_lost_after_the_server_committed(
    sqlite_server: ServerProcess, tmp_path: Path
) -> None:
    sqlite_server.start()
    proxy = FaultProxy(sqlite_server.port)
    try:
        run_id, t = transport(proxy.url, tmp_path / "spool", batch_size=16)
        produce(t, range(0, 50))
        proxy.drop_responses(3)
        produce(t, range(50, 200))
        wait_until(lambda: proxy.dropped == 3, 10)
        t.close(CLOSE_S)
    finally:
        proxy.close()
    stats = assert_all_delivered(t, sqlite_server.url, run_id, 200)
    assert stats.failed_requests >= 3


def test_blackholed_server_at_close(sqlite_server: ServerProcess, tmp_path: Path) -> None:
    sqlite_server.start()
    proxy = FaultProxy(sqlite_server.port)
    spool = tmp_path / "spool"
    try:
        run_id, t = transport(proxy.url, spool, request_timeout=10.0)
        produce(t, range(0, 100))
        wait_until(lambda: t.stats().acknowledged == 100, 10)
        proxy.mode = "blackhole"
        produce(t, range(100, 300), pace=0.0005)
        start = time.monotonic()
        t.close(5.0)  # the bound itself is what is tested here
        elapsed = time.monotonic() - start
    finally:
        proxy.close()
    assert elapsed <= 5.0
    stats = t.stats()
    assert (stats.acknowledged, stats.spooled, stats.dropped, stats.pending) == (100, 200, 0, 0)
    report = sync(spool, sqlite_server.url)
    assert report.ok and report.accepted == 200 and report.duplicates == 0
    assert stored_seqs(sqlite_server.url, run_id) == list(range(300))


def test_spool_full_drops_are_counted_exactly(
    sqlite_server: ServerProcess, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    run_id, t = transport(None, spool, batch_size=10, spool_max_bytes=40_000)
    produce(t, range(0, 300), pace=0.0)
    t.close(CLOSE_S)
    stats = t.stats()
    frames = [f for p in spool_files(spool) for f in scan(p) if isinstance(f, Frame)]
    on_disk = sum(len(json.loads(f.body)["records"]) for f in frames)
    assert stats.spooled == on_disk and stats.dropped == 300 - on_disk > 0
    assert balanced(stats) and stats.pending == 0
    sqlite_server.start()
    assert sync(spool, sqlite_server.url).ok
    stored = stored_seqs(sqlite_server.url, run_id)
    assert len(stored) == len(set(stored)) == on_disk


def test_truncated_spool_tail_after_a_kill_then_sync_twice(
    sqlite_server: ServerProcess, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    run_id, t = transport(None, spool, batch_size=25)
    produce(t, range(0, 100), pace=0.0)
    t.close(CLOSE_S)
    [path] = spool_files(spool)
    frames = [f for f in scan(path) if isinstance(f, Frame)]
    counts = [len(json.loads(f.body)["records"]) for f in frames]
    # Frames of at most 25 records (four full ones, or more when a loaded machine let the flush
    # interval pass mid-batch: CI saw six frames once), then the empty final one.
    assert sum(counts) == 100 and max(counts) <= 25 and counts[-1] == 0 and len(counts) >= 5
    kept = 100 - counts[-2]  # the records before the frame the kill cuts
    os.truncate(path, frames[-2].end - 7)  # killed in the middle of writing the last records
    sqlite_server.start()
    cmd = [sys.executable, "-m", "ampscope_server.cli", "sync", str(spool),
           "--server", sqlite_server.url]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert f"{kept} records accepted, 0 duplicates" in first.stdout
    assert "truncated" in first.stdout
    assert stored_seqs(sqlite_server.url, run_id) == list(range(kept))
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert f"0 records accepted, {kept} duplicates" in second.stdout
    assert stored_seqs(sqlite_server.url, run_id) == list(range(kept))

