"""The reads of issue #11 through a real server: the runs list, its socket, the run page's
requests and a real Chromium first paint (`bench/query.py reads` runs this).

The data is built through HTTP ingest (`POST /api/ingest` with the hook's wire JSON, a real
`ampscope serve` on 127.0.0.1, 4 concurrent senders), never copied rows. Each run has --steps
steps (scalars every step, --layers layers of statistics every 10th step, one overflow skip
every 97 steps). Then, against the same server:

- `GET /api/runs` pages (first, next by cursor, sorted by steps, filtered), p50/p95 ms over
  --repeat requests, after the background analysis of the first page settled (the cold first
  request is printed apart);
- the runs-list socket: one step posted to a run, the time until the socket pushes its summary;
- each request of the run page (detail, last step, series, events, heatmap, skip rate,
  findings) for one run;
- Chromium (Debian's /usr/bin/chromium, headless): navigation to the run page until its first
  chart is drawn.

Times are client-side wall clock on loopback (an upper bound of the server time). The machine's
load is printed beside: other work on this machine slows every figure.

    .venv/bin/python bench/query.py reads                       # SQLite, 2,000 runs x 1,000
    .venv/bin/python bench/query.py reads --db postgres --runs 200 --steps 1000
    .venv/bin/python bench/query.py reads --keep /tmp/reads.db  # build once, then re-read it

`--keep PATH` (SQLite) builds into PATH when it does not exist and reads it back otherwise, so a
change to the reads is measured on the very same data without rebuilding (the build's time is
then not printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import connect
from websockets.typing import Origin

sys.path.insert(0, str(Path(__file__).resolve().parent))
from team_server import (  # type: ignore[import-not-found]
    CLI,
    database,
    free_port,
    wait_healthy,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking"]
LAYER_EVERY = 10
SKIP_EVERY = 97
SENDERS = 4


@contextmanager
def _database(args: argparse.Namespace, folder: Path) -> Iterator[tuple[str, bool]]:
    """(URL, whether it already holds the data): a fresh database, or the kept SQLite file."""
    if args.keep is None:
        with database(args.db, folder) as url:
            yield url, False
        return
    if args.db != "sqlite":
        raise SystemExit("--keep is for SQLite (a file to keep)")
    built = args.keep.exists()
    yield f"sqlite:///{args.keep.resolve()}", built


def _stored_ids(base: str) -> list[str]:
    """The kept database's oldest and newest run ids (all that the reads below use)."""
    with httpx.Client(base_url=base, timeout=60) as client:
        oldest = client.get("/api/runs?sort=started&order=asc&limit=1").json()[0]["id"]
        newest = client.get("/api/runs?sort=started&order=desc&limit=1").json()[0]["id"]
    return [oldest, newest]


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f} on {os.cpu_count()} cores"


@contextmanager
def _server(url: str, folder: Path) -> Iterator[str]:
    """A real `ampscope serve` bound to loopback (auth auto: open on loopback)."""
    subprocess.run([*CLI, "db", "upgrade", "--db", url], check=True, capture_output=True)
    port = free_port()
    env = {**os.environ, "AMPSCOPE_INGEST_RATE_PER_S": "100000",
           "AMPSCOPE_INGEST_BURST": "100000"}
    with open(folder / "server.log", "ab") as log:
        proc = subprocess.Popen([*CLI, "serve", "--port", str(port), "--db", url,
                                 "--log-level", "warning"], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _records(first: int, count: int, layers: int) -> list[dict[str, Any]]:
    out = []
    for step in range(first, first + count):
        skip = step % SKIP_EVERY == SKIP_EVERY - 1
        record: dict[str, Any] = {
            "seq": step, "step": step, "wall_time": 1.7e9 + step, "loss": 2.0 - step * 1e-5,
            "scale_before": 65536.0, "scale_after": 32768.0 if skip else 65536.0,
            "growth_tracker": 0, "found_inf": skip, "skipped": skip,
            "grad_norm": "inf" if skip else 0.75, "lr": 1e-3, "duration": 0.01,
            "layers": None}
        if step % LAYER_EVERY == 0:
            record["layers"] = {
                "amax": [0.5 + 0.01 * i for i in range(layers)], "amin_nz": [1e-9] * layers,
                "zero_frac": [0.01] * layers, "subnormal_frac": [0.001] * layers,
                "underflow_frac": [0.0001] * layers, "nan_count": [0] * layers,
                "inf_count": [0] * layers, "l2": [1.25] * layers}
        out.append(record)
    return out


def _batch(run_id: str, attempt: str, name: str, records: list[dict[str, Any]], layers: int,
           final: bool = False) -> bytes:
    table = [{"index": i, "name": f"block{i}.weight", "shape": [64, 64], "dtype": "float16",
              "numel": 4096, "module_type": "Linear"} for i in range(layers)]
    return json.dumps({
        "schema_version": 1,
        "run": {"id": run_id, "project": f"team{hash(run_id) % 5}", "name": name,
                "tags": ["bench", f"t{hash(run_id) % 7}"], "target_format": "fp16"},
        "attempt": {"id": attempt, "pid": 1, "started_at": 1.7e9},
        "layers": table, "records": records, "final": final}).encode()


def build(base: str, runs: int, steps: int, layers: int, per_batch: int) -> list[str]:
    """`runs` runs of `steps` steps through HTTP ingest; their ids (oldest first)."""
    ids = [str(uuid.uuid4()) for _ in range(runs)]

    def send(index: int) -> None:
        run_id, attempt = ids[index], str(uuid.uuid4())
        with httpx.Client(base_url=base, timeout=120) as client:
            for first in range(0, steps, per_batch):
                count = min(per_batch, steps - first)
                body = _batch(run_id, attempt, f"run-{index:05d}", _records(first, count, layers),
                              layers, final=first + count >= steps and index % 10 != 0)
                response = client.post("/api/ingest", content=body,
                                       headers={"Content-Type": "application/json"})
                response.raise_for_status()

    began = time.perf_counter()
    # In order of creation, so the list's newest-first order is the ids reversed.
    for start in range(0, runs, SENDERS):
        with ThreadPoolExecutor(SENDERS) as pool:
            list(pool.map(send, range(start, min(runs, start + SENDERS))))
    took = time.perf_counter() - began
    print(f"built {runs} runs x {steps} steps ({layers} layers every {LAYER_EVERY}th) through "
          f"HTTP ingest in {took:.0f} s: {runs * steps / took:,.0f} records/s ({_load()})")
    return ids


def _stats(times: list[float]) -> str:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered) * 1e3:8.1f} {p95 * 1e3:8.1f}"


def _time(client: httpx.Client, path: str, repeat: int) -> tuple[list[float], httpx.Response]:
    times = []
    response = None
    for _ in range(repeat):
        began = time.perf_counter()
        response = client.get(path)
        times.append(time.perf_counter() - began)
        assert response.status_code == 200, f"{path}: {response.status_code} {response.text}"
    assert response is not None
    return times, response


def _settle(client: httpx.Client, path: str, timeout_s: float = 300) -> float:
    """Until every run of the page is analysed as of its last step; the seconds it took."""
    began = time.perf_counter()
    while time.perf_counter() - began < timeout_s:
        page = client.get(path).json()
        if all(run["summary_step"] == run["last_step"] for run in page):
            return time.perf_counter() - began
        time.sleep(0.2)
    return float("nan")


def runs_list(client: httpx.Client, repeat: int) -> None:
    began = time.perf_counter()
    cold = client.get("/api/runs")
    cold_s = time.perf_counter() - began
    settled = _settle(client, "/api/runs")
    print(f"GET /api/runs cold (first read after the build): {cold_s * 1e3:.1f} ms, "
          f"{cold.headers.get('X-Total-Count')} runs; first page analysed in {settled:.1f} s")
    link = client.get("/api/runs").headers.get("Link")
    second = "/api/runs" if link is None else link.split(">")[0][1:]
    # The next page's runs were never read: its first read analyses a few of them itself and
    # hands the rest to the background refresher. That transient is printed apart; the table
    # below is the steady state (every run of both pages analysed as of its last step).
    began = time.perf_counter()
    client.get(second)
    cold_next_s = time.perf_counter() - began
    settled_next = _settle(client, second)
    print(f"GET /api/runs next page, first read: {cold_next_s * 1e3:.1f} ms; analysed in "
          f"{settled_next:.1f} s")
    print(f"{'request':58} {'median':>8} {'p95':>8}  ms")
    for label, path in [
        ("GET /api/runs (first page, 100)", "/api/runs"),
        ("GET /api/runs (next page, by cursor)", second),
        ("GET /api/runs?limit=500", "/api/runs?limit=500"),
        ("GET /api/runs?sort=steps&order=asc", "/api/runs?sort=steps&order=asc"),
        ("GET /api/runs?sort=skip_rate", "/api/runs?sort=skip_rate"),
        ("GET /api/runs?q=run-0001 (filtered: scans the runs table)", "/api/runs?q=run-0001"),
    ]:
        times, _ = _time(client, path, repeat)
        print(f"{label:58} {_stats(times)}  ({_load()})")


def runs_socket(base: str, client: httpx.Client, run_id: str, layers: int, repeat: int) -> None:
    latencies = []
    attempt = str(uuid.uuid4())
    before = client.get(f"/api/runs/{run_id}").json()  # a kept database has grown before
    steps, first = before["num_steps"], before["last_step"] + 1
    with connect(f"ws://127.0.0.1:{base.rsplit(':', 1)[1]}/api/runs/live",
                 origin=Origin(base)) as ws:
        snapshot = json.loads(ws.recv(timeout=60))
        assert snapshot["full"] is True
        for i in range(repeat):
            body = _batch(run_id, attempt, "socket", _records(first + i, 1, layers), layers)
            began = time.perf_counter()
            response = client.post("/api/ingest", content=body,
                                   headers={"Content-Type": "application/json"})
            response.raise_for_status()
            while time.perf_counter() - began < 30:
                message = json.loads(ws.recv(timeout=30))
                if any(r["id"] == run_id and r["num_steps"] == steps + i + 1
                       for r in [*message["runs"], *message.get("active", [])]):
                    latencies.append(time.perf_counter() - began)
                    break
            else:
                raise SystemExit(f"the runs-list socket did not push step {first + i} of "
                                 f"{run_id} within 30 s")
            time.sleep(0.6)  # the socket sends at most 2 messages a second
    print(f"{'runs-list socket: step posted -> summary pushed':58} {_stats(latencies)}  "
          f"({_load()}; includes the ingest request)")


def run_page(client: httpx.Client, run_id: str, repeat: int) -> None:
    detail = client.get(f"/api/runs/{run_id}").json()
    base = f"/api/runs/{run_id}"
    for label, path in [
        ("run detail (counters)", base),
        ("last step (/steps after_id=last-1, limit 1)",
         f"{base}/steps?after_id={detail['last_id'] - 1}&limit=1"),
        ("layers", f"{base}/layers"),
        ("series scale", f"{base}/series/scale?max_points=2400"),
        ("series loss", f"{base}/series/loss?max_points=2400"),
        ("series grad_norm", f"{base}/series/grad_norm?max_points=2400"),
        ("events (first page, 1000 event steps)", f"{base}/events?limit=1000"),
        ("events from the last step (the live refetch)", f"{base}/events?limit=1000&start="
                                                        f"{detail['last_step']}"),
        ("layer-stats lost_frac", f"{base}/layer-stats?stat=lost_frac"),
        ("layer-stats amax, a layer line (one row, max_points 2400)",
         f"{base}/layer-stats?stat=amax&max_points=2400&layers=0"),
        ("layer-stats amax, every row at max_points 2400 (before)",
         f"{base}/layer-stats?stat=amax&max_points=2400"),
        ("layer-stats amax, the layer table (last 32 steps)",
         f"{base}/layer-stats?stat=amax&start={max(0, detail['last_step'] - 31)}"
         f"&end={detail['last_step']}&max_points=10000"),
        ("skip-rate", f"{base}/skip-rate?max_points=2400"),
        ("findings", f"{base}/findings"),
    ]:
        times, _ = _time(client, path, repeat)
        print(f"{'run page: ' + label:58} {_stats(times)}  ({_load()})")


PAINT_MARK = """
  new MutationObserver((_, observer) => {
    if (!document.querySelector('#scale-chart .main-svg')) return;
    observer.disconnect();
    // The frame after the chart's SVG went in: a task queued from requestAnimationFrame runs
    // once that frame is painted.
    requestAnimationFrame(() => setTimeout(() => {
      window.__firstChartPainted = performance.now();
    }));
  }).observe(document, { childList: true, subtree: true });
"""
"""Marks, in the page, when the first chart was painted (ms from the navigation's start)."""


def first_paint(base: str, run_id: str, repeat: int) -> None:
    """Navigation to the run page until its first chart is drawn: with a cold cache (a new
    browser context each time: plotly.js and every module downloaded, parsed and compiled) and
    warm (one context, pages after its first: what a returning user pays).

    Two clocks: `painted`, in the page, from the navigation's start to the first frame painted
    after the scale chart's SVG went in (`PAINT_MARK`, performance.now()); `seen`, in this
    process, from `page.goto` until Playwright found that SVG. Playwright reports from its own
    polling in the page, which waits behind the page's later long tasks (the next charts'
    drawing) and needs its driver process scheduled on a busy machine, so `seen` runs later
    than the paint by up to a second here."""
    from playwright.sync_api import Browser, sync_playwright

    def navigate(context: Any) -> tuple[float, float]:
        page = context.new_page()
        page.add_init_script(PAINT_MARK)
        began = time.perf_counter()
        page.goto(f"{base}/runs/{run_id}")
        page.wait_for_selector("#scale-chart .main-svg", timeout=60_000)
        seen = time.perf_counter() - began
        page.wait_for_function("window.__firstChartPainted !== undefined", timeout=60_000)
        painted = float(page.evaluate("window.__firstChartPainted")) / 1000
        page.close()
        return painted, seen

    def contexts(browser: Browser) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
        cold = []
        for _ in range(repeat):
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            cold.append(navigate(context))
            context.close()
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        navigate(context)
        warm = [navigate(context) for _ in range(repeat)]
        context.close()
        return cold, warm

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            cold, warm = contexts(browser)
        finally:
            browser.close()
    for cache, times in (("cold", cold), ("warm", warm)):
        print(f"{'Chromium: run page -> first chart painted, ' + cache + ' cache':58} "
              f"{_stats([painted for painted, _ in times])}  ({_load()})")
        print(f"{'Chromium: ... seen by Playwright, ' + cache + ' cache':58} "
              f"{_stats([seen for _, seen in times])}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench/query.py reads",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=500, help="records per ingest request")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--paint-repeat", type=int, default=5)
    parser.add_argument("--keep", type=Path, metavar="PATH",
                        help="SQLite file to build once and read back on later runs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, _database(args, Path(tmp)) as (url, built), \
            _server(url, Path(tmp)) as base:
        print(f"{args.db if args.keep is None else args.keep}: {_load()}")
        ids = (_stored_ids(base) if built
               else build(base, args.runs, args.steps, args.layers, args.batch))
        with httpx.Client(base_url=base, timeout=60) as client:
            runs_list(client, args.repeat)
            run_page(client, ids[-1], args.repeat)
            runs_socket(base, client, ids[0], args.layers, min(args.repeat, 20))
        first_paint(base, ids[-1], args.paint_repeat)


