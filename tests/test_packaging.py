"""The Makefile's install recipes, run for real into a fresh virtual environment: `make demo` and
`make test` start with them, so whatever they print is the first thing a new user reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# This machine's pip configuration names local package folders that do not all exist; pip says
# so on every install. That is the machine, not the project.
MACHINE_NOISE = re.compile(r"^WARNING: Location '.*' is ignored: it is neither a file nor a "
                           r"directory\.$")


@pytest.mark.parametrize("target", [".installed-demo", ".installed-test"])
def test_the_install_recipe_prints_nothing(tmp_path: Path, target: str) -> None:
    venv = tmp_path / "venv"
    # TORCH is the recipe's first requirement; "--no-deps" in its place installs the project
    # alone (torch and the rest are the suite's own venv's business), through the same command.
    done = subprocess.run(
        ["make", "--no-print-directory", f"VENV={venv}", "TORCH=--no-deps",
         f"PYTHON={sys.executable}", f"{venv}/{target}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={k: v for k, v in os.environ.items() if not k.startswith("MAKE")})
    assert done.returncode == 0, done.stderr
    printed = [line for line in (done.stdout + done.stderr).splitlines()
               if line.strip() and not MACHINE_NOISE.match(line)]
    recipe = [line for line in printed if line.startswith((str(venv), sys.executable, "touch ",
                                                           "PYTHONWARNINGS="))]
    assert printed == recipe, "\n".join(printed)
    shown = subprocess.run([f"{venv}/bin/pip", "show", "ampscope"], capture_output=True,
                           text=True, check=True).stdout
    assert "Editable project location: " + str(ROOT) in shown


def test_the_wheel_ships_the_files_read_at_run_time(tmp_path: Path) -> None:
    """A wheel built from the project's files (tracked or not ignored, copied apart: a build
    writes into its source tree) holds what the packages read from disk: the hook's C loop,
    which the user's compiler builds, the dashboard and the migrations."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode()
    source = tmp_path / "source"
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "wheel"), str(source)],
                   capture_output=True, text=True, timeout=300, check=True)
    (wheel,) = (tmp_path / "wheel").glob("ampscope-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for shipped in ("ampscope/native_read.c", "ampscope/native_read.py",
                    "ampscope_server/_web/index.html", "ampscope_server/_migrations/env.py"):
        assert shipped in names
