"""The hook's docstrings keep rules, not lab notes (#32): no timing, benchmark run or GPU figure
in a docstring or comment (``bench/docstring_share.py`` counts them), and every
``docs/hook-cost.md#anchor`` they link to names a heading there."""

from __future__ import annotations

from tests.support.docstrings import ROOT, lab_notes, links

HOOK = ROOT / "client_hook" / "ampscope"


def test_no_docstring_or_comment_quotes_a_timing_a_run_or_a_gpu() -> None:
    assert lab_notes(HOOK) == []


def test_every_link_into_hook_cost_names_a_heading() -> None:
    found = links(HOOK, "hook-cost.md")
    assert found
    assert [link for link, named in found.items() if not named] == []
