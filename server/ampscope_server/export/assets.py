"""Where the dashboard's installed files are: the repo's web/ folder, shipped as the package
`ampscope_server._web`. The pages serve them; the offline report inlines the Plotly bundle.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(name: str) -> Path | None:
    """Where an installed (possibly namespace) package's files are, without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def web_root() -> Path:
    found = package_dir("ampscope_server._web")
    if found is None:
        raise RuntimeError("the dashboard files (ampscope_server._web) are not installed; "
                           "reinstall ampscope with its [server] extra")
    return found


PLOTLY_BUNDLE = "plotly-cartesian.min.js"
"""plotly.js's official "cartesian" partial bundle (npm `plotly.js-cartesian-dist-min`, MIT,
web/vendor/plotly-LICENSE.txt): every trace type the dashboard draws (scatter, heatmap) in
1.5 MB instead of the full bundle's 4.8 MB. A browser parses and runs it before the first
chart, so its size is on a cold run page's critical path
(docs/storage.md#the-dashboards-plotly-bundle)."""


def plotly_js() -> Path:
    return web_root() / "vendor" / PLOTLY_BUNDLE
