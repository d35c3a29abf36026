"""A team server under the floods of issue #28, with the default limits, against a real
`ampscope serve --auth required` on 127.0.0.1. Attackers connect from other loopback addresses
(127.0.0.2 and up), the team from 127.0.0.1.

For each flood a second client polls, each poll on a fresh connection, `/api/health` and an
authenticated `GET /api/runs` for `--seconds`: the share answered 200 and the p50/p95 latency.
Inside each poll's clock: the TCP connect and one request's round trip.
1. **idle**: 600 anonymous sockets from one address, each reopened when the server closes it;
   then 1,200 from 20 addresses (past the 1,000 connections a process holds).
2. **websockets**: 600 live sockets with one read token.
3. **trickle**: 600 ingest requests with one ingest token, their bodies sent a byte every 5 s.
4. **memory**: 16 batches of ~8 MiB posted at once: the server's peak RSS (VmHWM) and its RSS
   10 s after, beside its RSS before; each batch's status.
5. **workers** (Postgres, `--workers 2`): one token posts small batches as fast as 8 threads
   can for 10 s; accepted per second against the configured 20/s.

Usage: `python bench/floods.py [--db sqlite|postgres|both] [--seconds 20]`; the machine's load
average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
from websockets.sync.client import ClientConnection, connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: find bench.*
from bench.team_server import (
    CLI,
    batch,
    database,
    free_port,
    records,
    status_kib,
    wait_healthy,
)


@contextmanager
def serve(url: str, folder: Path, workers: int = 1,
          env: dict[str, str] | None = None) -> Iterator[tuple[str, dict[str, str], int]]:
    """(base URL, tokens by scope, the server's pid) with the default limits."""
    subprocess.run([*CLI, "db", "upgrade", "--db", url], check=True, capture_output=True)
    tokens = {scope: subprocess.run(
        [*CLI, "token", "create", "--all-projects", "--scope", scope, "--db", url],
        check=True, capture_output=True, text=True).stdout.strip()
        for scope in ("read", "ingest", "admin")}
    port = free_port()
    with open(folder / "server.log", "ab") as log:
        proc = subprocess.Popen([*CLI, "serve", "--port", str(port), "--db", url, "--auth",
                                 "required", "--log-level", "warning", "--workers",
                                 str(workers)], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base)
    try:
        yield base, tokens, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def polls(base: str, token: str, seconds: float) -> str:
    """The team's view during a flood: health and the runs list, fresh connections."""
    results: dict[str, list[tuple[int, float]]] = {"/api/health": [], "/api/runs": []}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for path, answers in results.items():
            began = time.perf_counter()
            try:
                with httpx.Client(base_url=base, timeout=10.0) as client:
                    code = client.get(path, headers={"Authorization": f"Bearer {token}"}
                                      ).status_code
            except httpx.HTTPError:
                code = 0
            answers.append((code, time.perf_counter() - began))
        time.sleep(0.1)
    parts = []
    for path, answers in results.items():
        ok = [seconds_ for code, seconds_ in answers if code == 200]
        quantiles = statistics.quantiles(ok, n=20) if len(ok) > 1 else [float("nan")] * 19
        parts.append(f"{path} {len(ok)}/{len(answers)} answered 200, p50 "
                     f"{statistics.median(ok) * 1000 if ok else float('nan'):.1f} ms, p95 "
                     f"{quantiles[18] * 1000:.1f} ms")
    return "; ".join(parts)


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


@contextmanager
def idle_flood(base: str, sockets: int, addresses: int) -> Iterator[None]:
    """`sockets` connections that never send a byte, reopened as the server closes them."""
    stop = threading.Event()

    def hold(address: str, count: int) -> None:
        held: list[socket.socket] = []
        while not stop.is_set():
            for sock in list(held):
                sock.setblocking(False)
                try:
                    if sock.recv(1) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    continue
                except OSError:
                    sock.close()
                    held.remove(sock)
            while len(held) < count and not stop.is_set():
                try:
                    held.append(socket.create_connection(
                        ("127.0.0.1", port_of(base)), timeout=5, source_address=(address, 0)))
                except OSError:
                    break
            stop.wait(0.2)
        for sock in held:
            sock.close()

    threads = [threading.Thread(target=hold, args=(f"127.0.0.{2 + i}", sockets // addresses))
               for i in range(addresses)]
    for thread in threads:
        thread.start()
    time.sleep(3)  # the flood in place before the first poll
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join()


@contextmanager
def websocket_flood(base: str, token: str, count: int) -> Iterator[str]:
    opened: list[ClientConnection] = []
    refused = 0
    for _ in range(count):
        try:
            sock = socket.create_connection(("127.0.0.1", port_of(base)), timeout=5,
                                            source_address=("127.0.0.2", 0))
            opened.append(connect(f"ws{base[4:]}/api/runs/live", sock=sock, open_timeout=5,
                                  additional_headers={"Authorization": f"Bearer {token}"},
                                  legacy=True))
        except Exception:  # refused in any way: counted
            refused += 1
    time.sleep(1)
    alive = 0
    for websocket in opened:
        try:
            websocket.recv(timeout=0.01)
            alive += 1
        except TimeoutError:
            alive += 1
        except Exception:  # closed by the server
            pass
    try:
        yield f"{alive} of {count} sockets open"
    finally:
        for websocket in opened:
            websocket.close()


@contextmanager
def trickle_flood(base: str, token: str, count: int) -> Iterator[Callable[[], str]]:
    head = (f"POST /api/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{").encode()
    stop = threading.Event()
    answers: dict[str, int] = {}

    def trickle(sock: socket.socket) -> None:
        try:
            sock.sendall(head)
            while not stop.wait(5):
                sock.sendall(b" ")
        except OSError:
            pass

    sockets = []
    for _ in range(count):
        try:
            sock = socket.create_connection(("127.0.0.1", port_of(base)), timeout=5,
                                            source_address=("127.0.0.2", 0))
        except OSError:
            answers["refused at connect"] = answers.get("refused at connect", 0) + 1
            continue
        sockets.append(sock)
        threading.Thread(target=trickle, args=(sock,), daemon=True).start()

    def tally() -> str:
        for sock in sockets:
            sock.setblocking(False)
            try:
                line = sock.recv(4096).split(b"\r\n", 1)[0].decode() or "closed"
            except BlockingIOError:
                line = "still sending"
            except OSError:
                line = "reset"
            answers[line] = answers.get(line, 0) + 1
        return ", ".join(f"{n} {what}" for what, n in sorted(answers.items()))

    try:
        yield tally
    finally:
        stop.set()
        for sock in sockets:
            sock.close()


def memory(base: str, token: str, pid: int) -> str:
    bodies = [batch(str(uuid.uuid4()), str(uuid.uuid4()), records(0, 1680)) for _ in range(16)]
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM from now
    before = status_kib(pid, "VmRSS")

    def post(body: bytes) -> int:
        with httpx.Client(base_url=base, timeout=120.0) as client:
            return client.post("/api/ingest", content=body, headers={
                "Authorization": f"Bearer {token}", "Content-Type": "application/json"}
                ).status_code

    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(post, bodies))
    peak = status_kib(pid, "VmHWM")
    time.sleep(10)
    after = status_kib(pid, "VmRSS")
    return (f"16 x {len(bodies[0]) / 2**20:.1f} MiB at once: statuses "
            f"{sorted(set(codes))} ({codes.count(200)} stored), RSS before {before / 1024:.0f} "
            f"MiB, peak {peak / 1024:.0f} MiB, 10 s after {after / 1024:.0f} MiB")


def worker_rate(folder: Path) -> str:
    with database("postgres", folder) as url, serve(url, folder, workers=2) as (base, tokens, _):
        body = batch(str(uuid.uuid4()), str(uuid.uuid4()), records(0, 1))
        accepted = limited = 0
        lock = threading.Lock()
        deadline = time.monotonic() + 10.0

        def hammer() -> None:
            nonlocal accepted, limited
            with httpx.Client(base_url=base, timeout=10.0) as client:
                while time.monotonic() < deadline:
                    code = client.post("/api/ingest", content=body, headers={
                        "Authorization": f"Bearer {tokens['ingest']}",
                        "Content-Type": "application/json"}).status_code
                    with lock:
                        accepted += code == 200
                        limited += code == 429

        threads = [threading.Thread(target=hammer) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return (f"2 workers, one token, 10 s: {accepted} accepted ({accepted / 10:.1f}/s "
                f"against 20/s and a burst of 60), {limited} refused 429")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    for kind in kinds:
        with tempfile.TemporaryDirectory() as folder, database(kind, Path(folder)) as url, \
                serve(url, Path(folder)) as (base, tokens, pid):
            print(f"{kind}: no flood: {polls(base, tokens['read'], 5)} ({load()})", flush=True)
            for sockets, addresses in ((600, 1), (1200, 20)):
                with idle_flood(base, sockets, addresses):
                    print(f"{kind}: {sockets} idle sockets from {addresses} address(es): "
                          f"{polls(base, tokens['read'], args.seconds)} ({load()})", flush=True)
            with websocket_flood(base, tokens["read"], 600) as held:
                print(f"{kind}: 600 WebSockets, one token ({held}): "
                      f"{polls(base, tokens['read'], args.seconds)} ({load()})", flush=True)
            with trickle_flood(base, tokens["ingest"], 600) as tally:
                seen = polls(base, tokens["read"], args.seconds)
                print(f"{kind}: 600 trickled bodies, one token: {seen}; the trickles: "
                      f"{tally()} ({load()})", flush=True)
            print(f"{kind}: {memory(base, tokens['ingest'], pid)} ({load()})", flush=True)
    if "postgres" in kinds:
        with tempfile.TemporaryDirectory() as folder:
            print(f"postgres: {worker_rate(Path(folder))} ({load()})", flush=True)


if __name__ == "__main__":
    main()
