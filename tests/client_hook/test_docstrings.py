"""The hook's docstrings keep rules, not lab notes (#32): no timing, benchmark run or GPU figure
in a docstring or comment (``bench/docstring_share.py`` counts them), and every
``docs/hook-cost.md#anchor`` they link to names a heading there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "client_hook" / "ampscope"


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_no_docstring_or_comment_quotes_a_timing_a_run_or_a_gpu() -> None:
    done = subprocess.run([sys.executable, "bench/docstring_share.py", str(HOOK)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    counts = dict(line.rsplit(" ", 1) for line in done.stdout.splitlines()
                  if not line.endswith("%"))
    assert (counts["timing quotes"], counts["run citations"], counts["GPU figures"]) == (
        "0", "0", "0")


def test_every_link_into_hook_cost_names_a_heading() -> None:
    doc = (ROOT / "docs" / "hook-cost.md").read_text(encoding="utf-8")
    headings = {anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", doc, re.MULTILINE)}
    links = {(path.name, m.group(1)) for path in HOOK.rglob("*.py")
             for m in re.finditer(r"hook-cost\.md#([\w-]+)", path.read_text(encoding="utf-8"))}
    assert links
    assert [(name, link) for name, link in sorted(links) if link not in headings] == []
