"""The server's docstrings keep rules, not lab notes (#32): no benchmark run or GPU figure in a
docstring or comment, and no timing but DESIGN.md §8's budgets, which are requirements
(``bench/docstring_share.py`` counts them); every ``docs/storage.md#anchor`` they link to names
a heading there."""

from __future__ import annotations

from tests.support.docstrings import ROOT, lab_notes, links

SERVER = ROOT / "server" / "ampscope_server"
BUDGETS = "DESIGN.md §8"


def test_no_docstring_or_comment_quotes_a_run_a_gpu_or_a_timing_but_a_budget() -> None:
    notes = lab_notes(SERVER)
    assert [(kind, line) for kind, line in notes
            if not (kind == "timing quotes" and BUDGETS in line)] == []


def test_every_link_into_storage_names_a_heading() -> None:
    found = links(SERVER, "storage.md")
    assert found
    assert [link for link, named in found.items() if not named] == []
