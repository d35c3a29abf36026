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


def _plant(server_dir: Path, module: str, line: str) -> None:
    path = server_dir / "ampscope_server" / module
    path.write_text(path.read_text() + f"\n{line}  # planted\n")


def test_every_contract_is_kept() -> None:
    done = _lint(ROOT / "server")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 3 kept, 0 broken." in done.stdout


def test_the_store_importing_a_route_breaks_the_layers(planted: Path) -> None:
    _plant(planted, "store/models.py", "from ampscope_server.api import deps")
    done = _lint(planted)
    assert done.returncode == 1
    assert "ampscope_server.store is not allowed to import ampscope_server.api" in done.stdout
    assert "ampscope_server.store.models -> ampscope_server.api.deps" in done.stdout


def test_a_domain_importing_the_cli_breaks_the_layers(planted: Path) -> None:
    _plant(planted, "charts/reads.py", "from ampscope_server.cli import serving")
    done = _lint(planted)
    assert done.returncode == 1
    assert "ampscope_server.charts is not allowed to import ampscope_server.cli" in done.stdout


def test_the_server_importing_torch_breaks_its_contract(planted: Path) -> None:
    _plant(planted, "runs/reads.py", "import torch")
    done = _lint(planted)
    assert done.returncode == 1
    assert "ampscope_server is not allowed to import torch" in done.stdout


def test_the_root_holds_the_layers_and_nothing_else() -> None:
    """`ls server/ampscope_server`: the package's three layers and nine domains, the CLI, and
    the two modules every layer uses. A new entry here is a decision about the layout."""
    entries = sorted(p.name for p in PACKAGE.iterdir()
                     if p.name not in {"__pycache__", "_web", "_migrations"})
    assert entries == ["__init__.py", "access", "alerts", "api", "charts", "cli", "compare",
                       "config.py", "errors.py", "export", "findings", "ingest", "live", "runs",
                       "store"]
