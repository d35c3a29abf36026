"""A run's page in a notebook cell: what Jupyter renders for `mon.show()` / `ampscope.notebook`."""

from __future__ import annotations

import ampscope
from ampscope.run_view import RunView


def test_a_cell_shows_the_run_page_in_a_frame_and_links_to_it() -> None:
    view = ampscope.notebook("0f1e2d3c-aaaa", server="http://127.0.0.1:8765/", height=500)
    assert repr(view) == "ampscope run 0f1e2d3c-aaaa: http://127.0.0.1:8765/runs/0f1e2d3c-aaaa"
    assert view._repr_html_() == (
        '<iframe src="http://127.0.0.1:8765/runs/0f1e2d3c-aaaa" title="ampscope run '
        '0f1e2d3c-aaaa" width="100%" height="500" style="border:0"></iframe>'
        '<p><a href="http://127.0.0.1:8765/runs/0f1e2d3c-aaaa" target="_blank" '
        'rel="noopener">Open the run page</a></p>')


def test_markup_in_a_run_id_or_server_stays_text() -> None:
    html = RunView('http://h/"><script>x</script>', "<b>id</b>")._repr_html_()
    assert "<script>" not in html and "<b>" not in html
    assert "/runs/%3Cb%3Eid%3C%2Fb%3E" in html


def test_an_offline_run_says_where_its_records_are() -> None:
    view = RunView(None, "abc")
    assert repr(view) == "ampscope run abc (offline: not sent to a server)"
    assert view._repr_html_() == (
        "<p>ampscope run <code>abc</code> is offline: it is spooled, not sent to a server "
        "(<code>ampscope sync</code>).</p>")
