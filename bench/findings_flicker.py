"""Findings flicker on the live demo, as a user sees it (issue #14): `examples/demo.py` trains and
serves; a real Chromium holds the run page and the runs list open, waits `--warmup` seconds,
then samples both once a second. Prints, as JSON: the appear/disappear flips of findings on the
run page (by identity), the changes of the runs list's headline (its kind and severity; its
title's numbers update in place), and each
finding's titles over the samples (numbers update in place; that is not a flip).

    .venv/bin/python bench/findings_flicker.py --warmup 60 --samples 60
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SHOWN = """() => [...document.querySelectorAll('#findings li[data-identity]')].map((li) => ({
  identity: li.dataset.identity, severity: li.dataset.severity,
  title: li.querySelector('.finding-title').textContent,
  held: li.classList.contains('finding-held')}))"""
HEADLINE = """(id) => {
  const cell = document.querySelector(`tr[data-run-id="${id}"] td.finding-cell`);
  if (!cell) return null;
  return cell.dataset.kind ? `${cell.dataset.severity} ${cell.dataset.kind}` : '—';
}"""


def _flips(samples: list[set[str]]) -> int:
    return sum(len(a ^ b) for a, b in itertools.pairwise(samples))


def measure(port: int, warmup_s: float, samples: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        demo = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "demo.py"), "--port", str(port),
             "--db", f"sqlite:///{tmp}/demo.db"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            run_id = _wait_for_run(url)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                context = browser.new_context(viewport={"width": 1440, "height": 900})
                run_page, list_page = context.new_page(), context.new_page()
                errors: list[str] = []
                for page in (run_page, list_page):
                    page.on("pageerror", lambda exc: errors.append(str(exc)))
                run_page.goto(f"{url}/runs/{run_id}")
                list_page.goto(f"{url}/")
                time.sleep(warmup_s)
                shown: list[list[dict[str, Any]]] = []
                headlines: list[str | None] = []
                steps: list[int] = []
                for _ in range(samples):
                    started = time.monotonic()
                    shown.append(run_page.evaluate(SHOWN))
                    headlines.append(list_page.evaluate(HEADLINE, run_id))
                    steps.append(int(run_page.evaluate(
                        "() => Number(document.getElementById('findings').dataset.step || -1)")))
                    time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
                browser.close()
        finally:
            demo.send_signal(signal.SIGINT)
            demo.wait(timeout=30)
    identities = [{f["identity"] for f in sample} for sample in shown]
    titles: dict[str, list[str]] = {}
    for sample in shown:
        for f in sample:
            seen = titles.setdefault(f["identity"], [])
            if not seen or seen[-1] != f["title"]:
                seen.append(f["title"])
    return {
        "samples": samples, "warmup_s": warmup_s,
        "run_page_flips": _flips(identities),
        "runs_list_headline_changes": sum(a != b for a, b in itertools.pairwise(headlines)),
        "analysed_steps": [steps[0], steps[-1]],
        "present_per_identity": {i: sum(i in s for s in identities)
                                 for i in sorted(set().union(*identities))},
        "titles": titles, "headlines": sorted({h for h in headlines if h}),
        "page_errors": errors,
    }


def _wait_for_run(url: str, timeout_s: float = 120.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            runs = httpx.get(f"{url}/api/runs", timeout=2.0).json()
            if runs:
                return str(runs[0]["id"])
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"no run appeared on {url} within {timeout_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8799)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--samples", type=int, default=60)
    args = parser.parse_args()
    result = measure(args.port, args.warmup, args.samples)
    sys.stdout.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
