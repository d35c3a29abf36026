"""How much of a package is docstring, and how many docstring or comment lines quote lab notes.

Docstrings are the string statements ``ast`` finds first in a module, class or function, plus
the attribute docstrings (a string statement right after an assignment); each counts every line
it spans. Comment lines are the lines holding a ``#`` comment token. A lab note is a line of
either that quotes a timing (a number next to µs/us/ms/ns/s), cites a benchmark run (``run 12``,
``run F``, ``bench run``, ``session 4``, a date) or names a GPU model (issue #32).

Usage: ``python bench/docstring_share.py client_hook/ampscope``.
"""

from __future__ import annotations

import argparse
import ast
import re
import tokenize
from pathlib import Path

NOTES = {
    "timing quotes": re.compile(r"\d\s*(?:µs|us|ms|ns|s)\b"),
    "run citations": re.compile(
        r"\brun (?:\d+|[A-Z])\b|\bbench run|\bsession \d+|\b20\d\d-\d\d-\d\d\b"
        r"|\b\d{1,2} (?:January|February|March|April|May|June|July|August|September|October"
        r"|November|December) 20\d\d\b"),
    "GPU figures": re.compile(r"\b(?:H100|H200|A100)\b"),
}


def docstring_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for i, stmt in enumerate(node.body):
            after_assign = i > 0 and isinstance(node.body[i - 1], (ast.Assign, ast.AnnAssign))
            if (i == 0 or after_assign) and isinstance(stmt, ast.Expr) \
                    and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def comment_lines(path: Path) -> set[int]:
    with path.open("rb") as f:
        return {t.start[0] for t in tokenize.tokenize(f.readline) if t.type == tokenize.COMMENT}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("package", type=Path)
    package: Path = parser.parse_args().package
    total = docs = comments = 0
    notes = dict.fromkeys(NOTES, 0)
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8").splitlines()
        doc, com = docstring_lines(ast.parse("\n".join(text))), comment_lines(path)
        total, docs, comments = total + len(text), docs + len(doc), comments + len(com)
        for line in sorted(doc | com):
            for name, pattern in NOTES.items():
                notes[name] += bool(pattern.search(text[line - 1]))
    print(f"lines {total}")
    print(f"docstring lines {docs}")
    print(f"comment lines {comments}")
    print(f"docstring share {100 * docs / total:.1f} %")
    for name, count in notes.items():
        print(f"{name} {count}")


if __name__ == "__main__":
    main()
