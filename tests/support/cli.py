"""Running `ampscope …` commands: as the real process, or ``cli.main`` in this one."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from collections.abc import Mapping

from ampscope_server.cli import main as cli_module


def cli(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m ampscope_server.cli *args` as a real process: where the process is what is
    tested (its streams, its exit status, its environment, a server it starts)."""
    return subprocess.run([sys.executable, "-m", "ampscope_server.cli", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """What the process runs (``sys.exit(main(argv))``), here: ``main``'s return value or
    ``SystemExit``'s code (argparse's 2) as the exit status, stdout and stderr captured. The
    same command without an interpreter boot (~0.9 CPU-s each); never for ``serve``."""
    assert args[:1] != ("serve",), "serve runs as a process (cli)"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_module.main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    return subprocess.CompletedProcess(["ampscope", *args], code, out.getvalue(),
                                       err.getvalue())
