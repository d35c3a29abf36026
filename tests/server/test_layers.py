"""The server's layers hold (pyproject.toml's `[tool.importlinter]`), and the check can fail:
an upward import or a torch import planted in a copy of the package breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "server" / "ampscope_server"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(server_dir: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` over the package found in `server_dir` (PYTHONPATH wins over the editable
    install's finder, which Python asks last)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(server_dir),
                                                        str(ROOT / "client_hook")])}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config",
                           str(ROOT / "pyproject.toml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A copy of the package to plant imports in."""
    shutil.copytree(PACKAGE, tmp_path / "ampscope_server",
                    ignore=shutil.ignore_patterns("__pycache__", "_web", "_migrations"))
    return tmp_path


def test_every_contract_is_kept() -> None:
    done = _lint(ROOT / "server")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 3 kept, 0 broken." in done.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("store/models.py", "from ampscope_server.api import deps",
     "ampscope_server.store is not allowed to import ampscope_server.api"),
    ("charts/reads.py", "from ampscope_server.cli import serving",
     "ampscope_server.charts is not allowed to import ampscope_server.cli"),
    ("runs/reads.py", "import torch", "ampscope_server is not allowed to import torch"),
], ids=["store-imports-api", "domain-imports-cli", "server-imports-torch"])
def test_a_planted_import_breaks_its_contract(planted: Path, module: str, line: str,
                                              broken: str) -> None:
    path = planted / "ampscope_server" / module
    path.write_text(path.read_text() + f"\n{line}  # planted\n")
    done = _lint(planted)
    assert done.returncode == 1
    assert broken in done.stdout
    assert "Contracts: 2 kept, 1 broken." in done.stdout


def test_the_root_holds_the_layers_and_nothing_else() -> None:
    """`ls server/ampscope_server`: the package's three layers and nine domains, the CLI, and
    the two modules every layer uses. A new entry here is a decision about the layout."""
    entries = sorted(p.name for p in PACKAGE.iterdir()
                     if p.name not in {"__pycache__", "_web", "_migrations"})
    assert entries == ["__init__.py", "access", "alerts", "api", "charts", "cli", "compare",
                       "config.py", "errors.py", "export", "findings", "ingest", "live", "runs",
                       "store"]
