"""The Markdown post-mortem of a run (`ampscope report`). Pure: snapshot + findings in, text out.

"Key charts as numbers": the scale history (start, end, range, growths, backoffs, the scale at
each fifth of the run), the skip rate (overall and per fifth, calibration apart) and the worst
layers at the most recent layer-stat step (lost fraction, headroom). User text (run and layer
names) is written inside code spans or escaped so it cannot break the document's structure.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence

from ampscope_server.findings.facts import Finding, LayerInfo, LayerSample, RunData
from ampscope_server.findings.lost import lost_to_format, structural_zeros
from ampscope_server.findings.nonfinite import min_headroom
from ampscope_server.findings.timeline import history

SEVERITY_MARK = {"error": "ERROR", "warning": "WARNING", "info": "info"}
PARTS = 5
WORST_LAYERS = 5


def _code(text: str) -> str:
    """`text` as a Markdown code span that its own backticks cannot close, on one line."""
    text = " ".join(text.split())
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _num(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def _scale(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value > 0 and math.isfinite(value) and math.log2(value).is_integer():
        return f"{_num(value)} (2^{int(math.log2(value))})"
    return _num(value)


def _finding(f: Finding) -> list[str]:
    lines = [f"### [{SEVERITY_MARK[f.severity]}] {f.title}", ""]
    if f.step_start is not None:
        lines += [f"Steps {f.step_start}-{f.step_end}." if f.step_end != f.step_start
                  else f"Step {f.step_start}.", ""]
    lines += [f.explanation, ""]
    if f.layers:
        lines += ["Layers, most responsible first: " + ", ".join(_code(n) for n in f.layers), ""]
    if f.evidence:
        lines += ["| evidence | value |", "|---|---|"]
        lines += [f"| {k} | {_num(v)} |" for k, v in f.evidence.items()]
        lines.append("")
    lines += [f"**Recommendation:** {f.recommendation}", ""]
    return lines


def _charts(run: RunData) -> list[str]:
    h = history(run)
    if h is None:
        return ["No steps recorded.", ""]
    scales = [s for p in h.steps for s in (p.scale_before, p.scale_after)
              if s is not None and math.isfinite(s)]
    lines = ["### Loss scale", ""]
    if scales:
        lines += [
            f"- start {_scale(h.steps[0].scale_before)}, end {_scale(h.scale_at(h.last_step))}, "
            f"min {_scale(min(scales))}, max {_scale(max(scales))}",
            f"- {len(h.growths)} growth(s), {len(h.skips)} backoff/skip(s)",
        ]
        bounds = [h.first_step + (h.span * i) // PARTS for i in range(PARTS + 1)]
        lines.append("- scale at " + ", ".join(
            f"step {b}: {_scale(h.scale_at(b))}" for b in [*bounds[1:-1], h.last_step]))
    else:
        lines.append("- no scale recorded")
    calibration = set(h.calibration)
    lines += ["", "### Skip rate", "",
              f"- {len(h.skips)} of {h.span} steps skipped ({len(h.skips) / h.span:.2%}); "
              f"{len(calibration)} of them calibration", "",
              "| steps | skipped | rate (calibration excluded) |", "|---|---|---|"]
    edges = [h.first_step + (h.span * i) // PARTS for i in range(PARTS + 1)]
    edges[-1] = h.last_step + 1
    for lo, hi in itertools.pairwise(edges):
        if hi <= lo:
            continue
        in_part = [s for s in h.skips if lo <= s < hi]
        later = [s for s in in_part if s not in calibration]
        lines.append(f"| {lo}-{hi - 1} | {len(in_part)} | {len(later) / (hi - lo):.2%} |")
    lines.append("")
    return lines + _worst_layers(run)


def _worst_layers(run: RunData) -> list[str]:
    if not run.layer_samples:
        return ["### Worst layers", "", "No per-layer statistics recorded.", ""]
    last = max(s.step for s in run.layer_samples)
    at = [s for s in run.layer_samples if s.step == last]
    def lost_of(s: LayerSample) -> float:
        return lost_to_format(s, _info(run, s.layer))

    lost = sorted(at, key=lambda s: (-lost_of(s), s.layer))[:WORST_LAYERS]
    lines = [f"### Worst layers (step {last})", "",
             "| layer | lost to the format | structural zeros | headroom bits |",
             "|---|---|---|---|"]
    for s in lost:
        bits = min_headroom([s], run.target_format)
        lines.append(f"| {_code(run.layer_name(s.layer))} | {lost_of(s):.2%} | "
                     f"{structural_zeros(s, _info(run, s.layer)):.2%} | "
                     f"{'n/a' if bits is None else _num(round(bits, 2))} |")
    headrooms = [(b, s) for s in at if (b := min_headroom([s], run.target_format)) is not None]
    if headrooms:
        bits, closest = min(headrooms, key=lambda pair: (pair[0], pair[1].layer))
        lines += ["", f"Closest to overflow: {_code(run.layer_name(closest.layer))} "
                      f"({_num(round(bits, 2))} doublings of headroom)."]
    lost_all = [lost_of(s) for s in at]
    lines += [f"Median share lost to the format over all layers: "
              f"{statistics.median(lost_all):.2%} (structural zeros, such as dead ReLU units, "
              "not counted; docs/findings.md).", ""]
    return lines


def render(run_id: str, run: RunData, findings: Sequence[Finding],
           baseline_id: str | None = None) -> str:
    """The post-mortem: header, findings (most severe first) with evidence, the key charts as
    numbers, and the recommendations in one list."""
    lines = [f"# ampscope post-mortem: {_code(run.name or run_id)}", "",
             f"- run {_code(run_id)}, target format {_code(run.target_format)}, "
             f"{len(run.layers)} layer(s)"]
    if baseline_id is not None:
        lines.append(f"- compared with baseline {_code(baseline_id)}")
    counts = {sev: sum(1 for f in findings if f.severity == sev)
              for sev in ("error", "warning", "info")}
    lines += [f"- findings: {counts['error']} error(s), {counts['warning']} warning(s), "
              f"{counts['info']} info", "", "## Findings", ""]
    if not findings:
        lines += ["Nothing found: no overflow, underflow or misuse worth reporting.", ""]
    for f in findings:
        lines += _finding(f)
    lines += ["## Key charts as numbers", "", *_charts(run)]
    lines += ["## Recommendations", ""]
    # Root causes only: a consequence's advice is "act on the cause first".
    actionable = [f for f in findings if f.cause is None
                  and (f.severity != "info" or f.kind == "scaler_tuning")]
    if actionable:
        lines += [f"{i}. [{SEVERITY_MARK[f.severity]}] {f.recommendation}"
                  for i, f in enumerate(actionable, 1)]
    else:
        lines.append("None: the run looks healthy.")
    return "\n".join(lines) + "\n"


def _info(run: RunData, index: int) -> LayerInfo:
    return run.layers[index] if 0 <= index < len(run.layers) else LayerInfo(f"#{index}")
