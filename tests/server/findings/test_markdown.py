"""The Markdown post-mortem renderer (pure): structure, numbers, and user text kept inert."""

from __future__ import annotations

import dataclasses

from ampscope_server.findings import analyze
from ampscope_server.findings.markdown import _code, render
from tests.server.findings.synthetic import (
    LAYERS,
    fits_below,
    healthy_samples,
    run_data,
    scaler_steps,
)


def test_code_spans_cannot_be_closed_by_user_text() -> None:
    assert _code("fc1.weight") == "`fc1.weight`"
    assert _code("a`b") == "``a`b``"
    assert _code("`x`") == "`` `x` ``"
    assert _code("line\n# heading") == "`line # heading`"


def test_healthy_run_report() -> None:
    data = run_data(scaler_steps(6000, fits_below(2**10)),
                    layer_samples=healthy_samples(range(5900, 6000, 10)), name="healthy")
    text = render("run-1", data, analyze(data))
    assert text.startswith(
        "# ampscope post-mortem: `healthy`\n\n- run `run-1`, target format `fp16`, 4 layer(s)\n"
        "- findings: 0 error(s), 0 warning(s), 2 info\n")
    assert "- start 65536 (2^16), end 1024 (2^10), min 1024 (2^10), max 65536 (2^16)\n" in text
    assert "- 2 growth(s), 8 backoff/skip(s)\n" in text
    assert "| 0-1199 | 6 | 0.00% |\n" in text
    # An embedding's zeros are its unused rows: structural, not lost to the format.
    assert "| `embed.weight` | 0.00% | 90.00% | 10.32 |\n" in text
    assert text.endswith("## Recommendations\n\n1. [info] GradScaler(init_scale=1024).\n")


def test_hostile_layer_name_stays_inside_its_code_span() -> None:
    layers = [dataclasses.replace(LAYERS[0], name="x`\n## injected"), *LAYERS[1:]]
    data = run_data(scaler_steps(100, fits_below(2**10)), layers=layers,
                    layer_samples=healthy_samples([90]))
    text = render("r", data, analyze(data))
    assert "\n## injected" not in text
    assert "``x` ## injected``" in text


def test_empty_run() -> None:
    text = render("r", run_data([]), [])
    assert "Nothing found: no overflow, underflow or misuse worth reporting.\n" in text
    assert "No steps recorded.\n" in text
    assert text.endswith("None: the run looks healthy.\n")
