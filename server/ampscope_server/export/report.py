"""The data of a run's offline HTML report, and the heatmap reduction it needs.

The report must stay a file one can mail, whatever the run's length: series come downsampled
(min/max/last per bucket, `series_math.downsample`), the lost-fraction heatmap is cut to at most
`MAX_COLUMNS` columns by `bucket_max`, events are all kept (never downsampled). The findings
(`findings.reads`) come first in the page, from the same bounded snapshot as the API's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from ampscope_server.charts import reads as chart_reads
from ampscope_server.charts import series_math
from ampscope_server.charts.schemas import SeriesName
from ampscope_server.export import report_html as export_report_html
from ampscope_server.export.assets import plotly_js, web_root
from ampscope_server.findings import Finding
from ampscope_server.findings import reads as finding_reads
from ampscope_server.findings.schemas import FindingRead
from ampscope_server.runs import json_floats
from ampscope_server.runs import reads as runs
from ampscope_server.store.models import Run

MAX_COLUMNS = 2000
MAX_POINTS = 4000
REPORT_SERIES: tuple[SeriesName, ...] = ("scale", "loss", "grad_norm")
REPORT_VERSION = 1


def _max(values: Sequence[float | None]) -> float | None:
    """Max over the non-NaN values (±inf included); NaN when all are NaN, None when all None."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    ordered = [v for v in present if not math.isnan(v)]
    return max(ordered) if ordered else math.nan


def bucket_max(
    steps: Sequence[int], z: Sequence[Sequence[float | None]], max_columns: int = MAX_COLUMNS
) -> tuple[list[int], list[list[float | None]]]:
    """Reduce a row-by-step matrix (columns sorted by step) to at most `max_columns` columns.

    Never strides: the step range [first, last] is cut into contiguous buckets of
    ceil(span / max_columns) steps and each row keeps the *max* of its values in a bucket, so a
    single-step spike survives. A bucket's step is the first step it holds; empty buckets are
    left out. With no more columns than `max_columns` the matrix comes back as is.
    """
    if max_columns < 1:
        raise ValueError(f"max_columns must be at least 1, got {max_columns}")
    for i, row in enumerate(z):
        if len(row) != len(steps):
            raise ValueError(f"row {i} has {len(row)} values for {len(steps)} steps")
    if len(steps) <= max_columns:
        return list(steps), [list(row) for row in z]
    bounds = series_math.bucket_bounds(steps, max_columns)
    return (
        [steps[start] for start, _ in bounds],
        [[_max(row[start:stop]) for start, stop in bounds] for row in z],
    )


def report_data(
    session: Session, run: Run, crash_timeout_s: float, findings: Sequence[Finding] | None = None
) -> dict[str, Any]:
    """Everything the report draws, as JSON-ready data (non-finite floats tagged).

    `findings` defaults to the run's own (`finding_reads.run_findings`); `ampscope report
    --baseline` passes those computed against the baseline."""
    if findings is None:
        findings = finding_reads.run_findings(session, run)
    # The chart read already reduces a long run to about MAX_COLUMNS worst-per-bucket columns
    # (from the rollups, in bounded memory); bucket_max holds the report to its bound whatever
    # that read returns.
    heatmap = chart_reads.heatmap_read(session, run, "lost_frac", None, None, "param",
                                  max_points=MAX_COLUMNS)
    steps, z = bucket_max(heatmap.steps, heatmap.z)
    return {
        "report_version": REPORT_VERSION,
        "generated_at": time.time(),
        "run": runs.detail(session, run, crash_timeout_s).model_dump(mode="json"),
        "series": {
            name: chart_reads.series_read(session, run, name, MAX_POINTS, None, None)
            .model_dump(mode="json")
            for name in REPORT_SERIES
        },
        "heatmap": {
            "stat": "lost_frac", "layers": heatmap.layers, "steps": steps,
            "z": [[json_floats.encode(v) for v in row] for row in z],
            "downsampled": heatmap.downsampled or len(steps) < len(heatmap.steps),
        },
        "events": chart_reads.events_read(session, run).model_dump(mode="json")["events"],
        "findings": [FindingRead.of(f).model_dump(mode="json") for f in findings],
    }


def report_html_of(
    session: Session, run: Run, crash_timeout_s: float, findings: Sequence[Finding] | None = None
) -> tuple[str, str]:
    """(the run's self-contained HTML report, its Content-Security-Policy)."""
    return export_report_html.render(
        report_data(session, run, crash_timeout_s, findings),
        plotly_js().read_text(encoding="utf-8"),
        (web_root() / "css" / "plotly.css").read_text(encoding="utf-8"),
    )
