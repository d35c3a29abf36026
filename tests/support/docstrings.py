"""What the docstring tests of the hook and the server share (#32): the docstring and comment
lines `bench/docstring_share.py` counts as lab notes, and the `docs/*.md#anchor` links of a
package that name no heading of their document."""

from __future__ import annotations

import ast
import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lab_notes(package: Path) -> list[tuple[str, str]]:
    """(kind, "path:line: text") of every docstring or comment line under `package` that
    `bench/docstring_share.py` counts as a timing quote, a run citation or a GPU figure."""
    share = runpy.run_path(str(ROOT / "bench" / "docstring_share.py"))
    notes: list[tuple[str, str]] = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8").splitlines()
        lines = share["docstring_lines"](ast.parse("\n".join(text))) | share["comment_lines"](path)
        notes += [(kind, f"{path.relative_to(ROOT)}:{n}: {text[n - 1].strip()}")
                  for n in sorted(lines) for kind, pattern in share["NOTES"].items()
                  if pattern.search(text[n - 1])]
    return notes


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def links(package: Path, doc: str) -> dict[tuple[str, str], bool]:
    """{(module, anchor): whether `docs/<doc>` has that heading} of every `<doc>#anchor` that a
    module under `package` links to."""
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    headings = {anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}
    return {(str(path.relative_to(package)), m.group(1)): m.group(1) in headings
            for path in sorted(package.rglob("*.py"))
            for m in re.finditer(re.escape(doc) + r"#([\w-]+)", path.read_text(encoding="utf-8"))}
