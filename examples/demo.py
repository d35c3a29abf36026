"""`make demo`: start `ampscope serve` on SQLite, train a real CPU AMP model into it, show the URL.

The training (examples/demo_model.py) overflows at the start (the initial scale is far too high),
overflows again each time the scaler probes upward, and loses part of one branch's gradient to fp16
underflow. The server stays up after training until Ctrl-C, so the charts can be browsed.
SIGTERM stops it as Ctrl-C does: the server child goes with it and frees the port.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ampscope
from demo_model import make_training, train_step


def wait_healthy(url: str, server: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"ampscope serve exited with status {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/api/health", timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"ampscope serve did not answer on {url} within {timeout_s:.0f} s")


def port_in_use(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/health", timeout=1.0):
            return True
    except (urllib.error.URLError, OSError):
        return False


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM as Ctrl-C: unwind through main's `finally`, which stops the server child."""
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--db", default="sqlite:///./.ampscope/ampscope.db")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--steps-per-second", type=float, default=20.0,
                        help="pace the training so the charts can be watched filling in")
    args = parser.parse_args()

    url = f"http://127.0.0.1:{args.port}"
    if port_in_use(url):
        raise SystemExit(f"something already answers on {url}; stop it or use `make demo PORT=...`")
    server = subprocess.Popen([sys.executable, "-m", "ampscope_server.cli", "serve",
                               "--host", "127.0.0.1", "--port", str(args.port), "--db", args.db,
                               "--log-level", "warning"])
    try:
        wait_healthy(url, server)
        model, scaler, optimizer, gen = make_training()
        mon = ampscope.watch(model, scaler, optimizer, run=f"demo-{time.strftime('%H%M%S')}",
                             server=url, tags=["demo", "cpu", "fp16"], layer_every=1,
                             config={"init_scale": 2.0**24, "growth_interval": 50, "lr": 1e-3})
        print(f"\nampscope dashboard: {url}/runs/{mon.run_id}   (all runs: {url}/)\n", flush=True)
        period = 1.0 / args.steps_per_second
        for _ in range(args.steps):
            started = time.monotonic()
            train_step(model, scaler, optimizer, gen)
            time.sleep(max(0.0, period - (time.monotonic() - started)))
        mon.close()
        print(f"training finished: {mon.stats()}", flush=True)
        print(f"server still up at {url}/ ; Ctrl-C to stop", flush=True)
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=10)


if __name__ == "__main__":
    main()
