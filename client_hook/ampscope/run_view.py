"""A run's page inside a Jupyter cell, as W&B and TensorBoard show theirs.

`mon.show()` or `ampscope.notebook(run_id)` returns a `RunView`, rendered as an iframe of the
server's run page and a link; the notebook's browser loads it (nothing is fetched here), from a
server that trusts its origin (`AMPSCOPE_FRAME_ANCESTORS`; a loopback-only server allows local
notebooks). Torch-free.
"""

from __future__ import annotations

import html
import urllib.parse
from dataclasses import dataclass

DEFAULT_SERVER = "http://127.0.0.1:8765"


@dataclass(frozen=True)
class RunView:
    server: str | None
    """None: the run is not sent anywhere (offline)."""
    run_id: str
    height: int = 720

    @property
    def url(self) -> str | None:
        if self.server is None:
            return None
        return f"{self.server.rstrip('/')}/runs/{urllib.parse.quote(self.run_id, safe='')}"

    def __repr__(self) -> str:
        if self.url is None:
            return f"ampscope run {self.run_id} (offline: not sent to a server)"
        return f"ampscope run {self.run_id}: {self.url}"

    def _repr_html_(self) -> str:
        if self.url is None:
            return (f"<p>ampscope run <code>{html.escape(self.run_id)}</code> is offline: "
                    "it is spooled, not sent to a server (<code>ampscope sync</code>).</p>")
        url = html.escape(self.url, quote=True)
        return (f'<iframe src="{url}" title="ampscope run {html.escape(self.run_id)}" '
                f'width="100%" height="{int(self.height)}" style="border:0"></iframe>'
                f'<p><a href="{url}" target="_blank" rel="noopener">Open the run page</a></p>')


def notebook(run_id: str, server: str = DEFAULT_SERVER, height: int = 720) -> RunView:
    """The run page of `run_id` on `server`, for a notebook cell to display."""
    return RunView(server, run_id, height)
