"""The fused kernel's cold compile in a child interpreter, off the training process's GIL.

A cold ``torch.compile`` of the fused kernel is minutes of Python work (dynamo, AOT autograd,
inductor's lowering, scheduling and code generation). On a background thread of the training
process it holds the GIL for most of that time, and the training thread waits for it: a nice
value does not help against the GIL (#29: per-layer stats every step cost 1.37x the median step
over the first 2.5 minutes of a fresh process, ~1.05x afterwards).

So ``fused._compile`` first runs the same compile here, in ``python -m ampscope._compile_child``:
the child rebuilds the layout from its JSON (``encode``/``decode``), compiles the kernel with the
same options and runs it once on placeholders, which fills inductor's on-disk caches (the FX
graph cache and the AOTAutograd cache, both on by default, keyed by the traced graph, the
inductor config and the torch version: not by the Python function). The parent's compile of the
same layout then loads from those caches, which holds its GIL for seconds instead of minutes
(``docs/hook-cost.md``, session 12).

The child: runs at the compile's nice value; shares the parent's environment and inductor cache
directory (``TORCHINDUCTOR_CACHE_DIR``, set to the parent's ``cache_dir()``) and finds ``ampscope``
where the parent found it; never imports the user's script (``-m``, and ``-P``: no script or
working directory on its path); leads its own process group, so that ``kill_all`` (the
interpreter's exit, ``fused._at_exit``) ends it with the compiler processes it started; and ends
itself the same way when its stdin closes, i.e. when the parent died without an exit. A process
group, not a session (``setsid``): where the kernel groups CPU time by session (Linux's
autogroup, on by default on desktops and on this machine), a new session is scheduled against
the training process as an equal, whatever its nice value.

The compile thread waits for the child in one blocking ``waitpid`` (``Popen.wait()`` without a
timeout; the child's own ``alarm`` bounds it), at its normal priority: ``Popen.wait(timeout)``
would poll, taking the GIL up to 20 times a second for the minutes of the child's compile.

Its result, one JSON line on stdout: ``{"attempt": k}``, the index in ``compile_options`` of the
options that compiled. ``run`` returns it, or None when the child failed, could not start or ran
past its time; the caller then compiles in-process as before.
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
        "under": under, "normal": normal,
    })


def decode(text: str) -> tuple[LayoutKey, int, int]:
    """``encode``'s inverse: (key, under bits, normal bits)."""
    from ampscope.fused import LayoutKey

    d = json.loads(text)
    specs = tuple((tuple(shape), tuple(stride), getattr(torch, dtype))
                  for shape, stride, dtype in d["specs"])
    key = LayoutKey(torch.device(d["device"]), tuple(d["scaled"]), d["fmt"], specs,
                    d["histogram"], tuple((i, n) for i, n in d["absent"]))
    return key, d["under"], d["normal"]


def command() -> list[str]:
    """The child's command line (tests replace it)."""
    return [sys.executable, "-P", "-m", "ampscope._compile_child"]


def environment() -> dict[str, str]:
    """The parent's environment, with its inductor cache directory and ``ampscope``'s parent
    directory first on ``PYTHONPATH`` (the user may have put it on ``sys.path`` by hand)."""
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
    """Raise the child's nice value by ``niceness`` (up to 19), from here: the compile thread
    itself stays at its priority (``fused._compile``). Before the child starts any thread or
    process, which inherit it; the few milliseconds before are at the thread's priority."""
    if niceness > 0 and hasattr(os, "setpriority"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid,
                           min(19, os.getpriority(os.PRIO_PROCESS, pid) + niceness))


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """End the child's process group (the child, inductor's compile workers, the C++ compiler)
    and reap the child; its stdin pipe is closed."""
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
    """The child: ``argv`` is its time limit in seconds; the layout's JSON comes on stdin. Past
    the limit SIGALRM's default action ends it (the parent then kills its process group)."""
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
