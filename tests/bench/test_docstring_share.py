"""``bench/docstring_share.py`` on a two-file package: what counts as a docstring line, a comment
line and a lab note."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MODULE = '''"""A module.

Measured at 1.5 ms in session 4 on an H200."""

LIMIT = 3
"""An attribute docstring, 2 lines,
the second quoting ~10 µs."""


class A:
    """One line."""

    def f(self) -> str:  # a trailing comment, run 12
        # a comment line
        return """not a docstring: 5 ms"""
'''


def test_it_counts_docstrings_comments_and_lab_notes(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(MODULE, encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text('def g() -> None:\n    """Two\n    lines."""\n')
    done = subprocess.run([sys.executable, "bench/docstring_share.py", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.splitlines() == [
        "lines 18", "docstring lines 8", "comment lines 2", "docstring share 44.4 %",
        "timing quotes 2", "run citations 2", "GPU figures 1"]
