"""Render the self-contained HTML report of a run. Pure: text in, text out.

The file works offline and opened from disk: plotly.js, the renderer and the data are inlined.
Its Content-Security-Policy (a <meta> in the file, and the same header on the download) allows
exactly those inline scripts and the stylesheet by their sha256 hashes and nothing from the
network (`default-src 'none'`). The data sits in a `<script type="application/json">` block with
every `<`, `>` and `&` written as a JSON \\u escape, so no user text can close the block; the
renderer puts user text into the page only through `textContent`.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).parent / "templates"
_SLOT = re.compile(r"\{\{(\w+)\}\}")
_SCRIPT_END = re.compile(r"</(script)", re.IGNORECASE)


def sha256_source(text: str) -> str:
    """A CSP hash source of an inline element's exact text."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def json_block(data: Any) -> str:
    """JSON safe inside <script type="application/json">: no raw `<`, `>`, `&`, no NaN token."""
    text = json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def inline_script(source: str) -> str:
    """Script text that cannot end its <script> element early (`</script` → `<\\/script`).

    plotly.min.js holds no such sequence today; the guard keeps a future bundle from breaking
    the page. `<\\/` means the same as `</` in a JavaScript string or regular expression.
    """
    return _SCRIPT_END.sub(r"<\\/\1", source)


_IMAGE_DECLARATIONS = re.compile(r"CSS_DECLARATIONS=(\[\[[^;]*?\]\])")


def plotly_attribute_styles(plotly_js: str) -> list[str]:
    """The one style attribute plotly.js writes with setAttribute: its heatmap image's
    `image-rendering` list (crisp cells), rebuilt from the bundle as plotly builds it."""
    match = _IMAGE_DECLARATIONS.search(plotly_js)
    if match is None:
        return []
    declarations = json.loads(match.group(1))
    return ["".join(f"{name}: {value}; " for name, value in declarations)]


def report_csp(scripts: list[str], styles: list[str], attribute_styles: list[str]) -> str:
    """The policy of the report: its own inline scripts and styles, nothing else.

    Style attributes are refused except the exact ones listed (by hash, which CSP allows for
    attributes only with 'unsafe-hashes'); `style-src` stays for browsers without the split.
    """
    elements = " ".join(sha256_source(s) for s in styles)
    attributes = (
        " ".join(["'unsafe-hashes'", *(sha256_source(s) for s in attribute_styles)])
        if attribute_styles else "'none'"
    )
    return (
        "default-src 'none'; "
        f"script-src {' '.join(sha256_source(s) for s in scripts)}; "
        f"style-src {elements}; style-src-elem {elements}; "
        f"style-src-attr {attributes}; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )


def render(data: dict[str, Any], plotly_js: str, plotly_css: str) -> tuple[str, str]:
    """(the report's HTML, its CSP) for `report.report_data(...)`, plotly.js and its CSS rules.

    `plotly_css` is web/css/plotly.css: plotly.js injects its own <style> unless an element with
    id `plotly.js-style-global` exists, and the CSP would block that, so the report's one
    stylesheet (which has that id) carries plotly's rules itself.
    """
    plotly = inline_script(plotly_js)
    renderer = inline_script((TEMPLATES / "report.js").read_text(encoding="utf-8"))
    style = (TEMPLATES / "report.css").read_text(encoding="utf-8") + "\n" + plotly_css
    policy = report_csp([plotly, renderer], [style], plotly_attribute_styles(plotly_js))
    run = data.get("run", {})
    values = {
        "csp": html.escape(policy),
        "title": html.escape(f"{run.get('name', 'run')} · ampscope report"),
        "style": style,
        "plotly": plotly,
        "data": json_block(data),
        "renderer": renderer,
    }
    template = (TEMPLATES / "report.html").read_text(encoding="utf-8")
    # One pass over the template only: inserted text (plotly.js) is never scanned for slots.
    return _SLOT.sub(lambda m: values[m.group(1)], template), policy
