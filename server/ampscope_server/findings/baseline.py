"""Divergence from a baseline (e.g. the same training in FP32), reusing the rules of
`compare.maths`: the first common step where loss or grad norm departs by more than
BASELINE_TOLERANCE, and the layers whose gradient norm departs most at the first common
layer-stat step at or after it. Layers are matched by canonical name (`layer_names`), so a
wrapped run (`module.`, `_orig_mod.`, …) has a plain baseline's layers, and the finding names
each layer as the analysed run does (the run page finds the layers it cites by that name)."""

from __future__ import annotations

from collections import defaultdict

from ampscope_server.compare import maths
from ampscope_server.findings.facts import Finding, RunData
from ampscope_server.findings.thresholds import BASELINE_MAX_LAYERS, BASELINE_TOLERANCE
from ampscope_server.findings.timeline import ordered
from ampscope_server.runs import layer_names


def _series(run: RunData, metric: maths.Metric) -> dict[int, float]:
    return maths.by_step((p.step, getattr(p, metric)) for p in ordered(run.steps))


def _canonical(run: RunData) -> list[str]:
    return layer_names.canonical_names([layer.name for layer in run.layers])


def _l2(run: RunData) -> dict[int, dict[str, float]]:
    """{step: {canonical layer name: l2}}."""
    names = _canonical(run)
    out: dict[int, dict[str, float]] = defaultdict(dict)
    for s in run.layer_samples:
        if s.l2 is not None:
            name = names[s.layer] if 0 <= s.layer < len(names) else run.layer_name(s.layer)
            out[s.step][name] = s.l2
    return out


def baseline_divergence(run: RunData, baseline: RunData) -> list[Finding]:
    found = maths.earliest(
        maths.first_divergence("loss", _series(baseline, "loss"), _series(run, "loss"),
                                 BASELINE_TOLERANCE),
        maths.first_divergence("grad_norm", _series(baseline, "grad_norm"),
                                 _series(run, "grad_norm"), BASELINE_TOLERANCE),
    )
    if found is None:
        return []
    mine, theirs = _l2(run), _l2(baseline)
    at = next((s for s in sorted(mine.keys() & theirs.keys()) if s >= found.step), None)
    departures: list[tuple[float, str]] = []
    if at is not None:
        for name, value in mine[at].items():
            if name in theirs[at]:
                relative = maths.relative_difference(theirs[at][name], value)
                if relative > BASELINE_TOLERANCE:
                    departures.append((relative, name))
    departures.sort(key=lambda pair: -pair[0])
    own = dict(zip(_canonical(run), (layer.name for layer in run.layers), strict=True))
    layers = [own.get(name, name) for _, name in departures[:BASELINE_MAX_LAYERS]]
    evidence: dict[str, float] = {
        "step": found.step, "baseline_value": found.reference, "value": found.value,
        "relative": found.relative, "tolerance": BASELINE_TOLERANCE,
    }
    if at is not None:
        evidence["layer_step"] = at
    where = (f" At layer-stat step {at}, the gradient norms that depart most are in "
             f"{', '.join(layers)}." if layers else "")
    return [Finding(
        kind="baseline_divergence", severity="warning",
        title=f"Departs from the baseline at step {found.step} ({found.metric})",
        explanation=(
            f"{found.metric} is {found.value:.4g} here against {found.reference:.4g} in the "
            f"baseline{' ' + repr(baseline.name) if baseline.name else ''} at step {found.step}, "
            f"a relative difference of {found.relative:.1%} (tolerance "
            f"{BASELINE_TOLERANCE:.0%}), the first common step past it.{where}"),
        recommendation=(
            "Look at the steps just before the divergence for skipped steps or underflow; keep "
            "the named layers in FP32 and re-compare to confirm."),
        step_start=found.step, step_end=found.step, layers=layers, evidence=evidence,
    )]
