"""The fused kernel's cold compile in a child interpreter, off the training process's GIL.

A cold ``torch.compile`` is minutes of Python holding the GIL the training thread waits for (no
nice value helps), so ``fused._compile`` can first run it in ``python -m
ampscope._compile_child``, filling inductor's on-disk caches (keyed by the traced graph); the
parent then only loads from them (docs/hook-cost.md#the-fused-kernels-compile). The child runs
at the compile's nice value with the parent's environment and cache directory, never imports the
user's script (``-m``, ``-P``) and leads its own process group, not a session (autogroup would
schedule a session as training's equal), so ``kill_all`` ends it with its compilers, as does
its stdin closing (the parent died). The parent waits in one blocking ``waitpid`` (no GIL;
``Popen.wait(timeout)`` would poll). Its answer, one JSON line ``{"attempt": k}`` (the index in
``compile_options``), or None from ``run``: the caller then compiles in-process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ampscope.fused import LayoutKey

logger = logging.getLogger("ampscope")

_CHILDREN: set[subprocess.Popen[bytes]] = set()
_LOCK = threading.Lock()
_STDERR_TAIL = 2000  # characters of a failed child's stderr in the log


def encode(key: LayoutKey, under: int, normal: int) -> str:
    """The layout and the format's threshold bits as one JSON object."""
    return json.dumps({
        "device": str(key.device), "scaled": list(key.scaled), "fmt": key.fmt,
        "specs": [[list(shape), list(stride), str(dtype).removeprefix("torch.")]
                  for shape, stride, dtype in key.specs],
        "histogram": key.histogram, "absent": [list(a) for a in key.absent],
        "native": key.native,
        "under": under, "normal": normal,
    })


def decode(text: str) -> tuple[LayoutKey, int, int]:
    """``encode``'s inverse: (key, under bits, normal bits)."""
    from ampscope.fused import LayoutKey

    d = json.loads(text)
    specs = tuple((tuple(shape), tuple(stride), getattr(torch, dtype))
                  for shape, stride, dtype in d["specs"])
    key = LayoutKey(torch.device(d["device"]), tuple(d["scaled"]), d["fmt"], specs,
                    d["histogram"], tuple((i, n) for i, n in d["absent"]), d["native"])
    return key, d["under"], d["normal"]


def command() -> list[str]:
    """The child's command line (tests replace it)."""
    return [sys.executable, "-P", "-m", "ampscope._compile_child"]


def environment() -> dict[str, str]:
    """The parent's environment, with its inductor cache and ``ampscope``'s root on the path."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    import ampscope

    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(ampscope.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                  else []))
    return env


def run(key: LayoutKey, under: int, normal: int, niceness: int, timeout: float) -> int | None:
    """Compile ``key``'s kernel in a child; the index of the options that compiled, or None.
    Never raises. The calling thread blocks in one ``waitpid`` (no GIL, no wake-up: see the
    module docstring) until the child ends, which it does by ``timeout`` s (its own alarm)."""
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                [*command(), str(math.ceil(timeout))], env=environment(),
                stdin=subprocess.PIPE, stdout=out, stderr=err, process_group=0)
            with _LOCK:
                _CHILDREN.add(proc)
            try:
                _renice(proc.pid, niceness)
                assert proc.stdin is not None
                proc.stdin.write(encode(key, under, normal).encode() + b"\n")
                proc.stdin.flush()  # and left open: the child's ``_orphan_watch``
                proc.wait()
            finally:
                _kill(proc)  # its stragglers, if any (a no-op once the group is gone)
                with _LOCK:
                    _CHILDREN.discard(proc)
            out.seek(0)
            err.seek(0)
            answer, errors = out.read(), err.read()
    except Exception as exc:  # no interpreter, no fork, a closed pipe, anything: in-process
        logger.info("ampscope: the fused kernel's compile child failed (%s: %s)",
                    type(exc).__name__, exc)
        return None
    if proc.returncode == -signal.SIGALRM:
        logger.info("ampscope: the fused kernel's compile child ran past %.0f s", timeout)
        return None
    if proc.returncode != 0:
        logger.info("ampscope: the fused kernel's compile child exited with status %s: %s",
                    proc.returncode, errors.decode(errors="replace")[-_STDERR_TAIL:])
        return None
    try:
        attempt = json.loads(answer.decode().strip().splitlines()[-1])["attempt"]
    except (ValueError, IndexError, KeyError, TypeError):
        logger.info("ampscope: the fused kernel's compile child answered %r", answer[-200:])
        return None
    return attempt if isinstance(attempt, int) else None


def _renice(pid: int, niceness: int) -> None:
    """Raise the child's nice value by ``niceness`` (up to 19) from here, before it starts any
    thread or process (they inherit it); the compile thread keeps its own priority."""
    if niceness > 0 and hasattr(os, "setpriority"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid,
                           min(19, os.getpriority(os.PRIO_PROCESS, pid) + niceness))


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """End the child's process group (its compilers too) and reap the child."""
    with contextlib.suppress(OSError):  # the group is gone already
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(5.0)
    except Exception:  # left to init: nothing else to do
        pass


def kill_all() -> int:
    """End every running child (the interpreter's exit); how many there were."""
    with _LOCK:
        children = list(_CHILDREN)
        _CHILDREN.clear()
    for proc in children:
        _kill(proc)
    return len(children)


def _orphan_watch() -> None:
    """The parent holds our stdin open: at its end (the parent died), end our process group."""
    sys.stdin.buffer.read()
    os.killpg(os.getpgid(0), signal.SIGKILL)


def main(argv: list[str]) -> int:
    """The child: ``argv`` its time limit (SIGALRM past it), the layout's JSON on stdin."""
    from ampscope import fused

    if argv and hasattr(signal, "alarm"):
        signal.alarm(max(1, int(argv[0])))
    key, under, normal = decode(sys.stdin.buffer.readline().decode())
    threading.Thread(target=_orphan_watch, daemon=True).start()
    attempt: Any = fused.build_kernel(key, under, normal, fused.compile_options(key.device))[1]
    sys.stdout.write(json.dumps({"attempt": attempt}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
