"""One root cause first: findings that follow from another sit under it and defer to its advice.

An overflow storm drives the scale down (scale collapse), a collapsed scale makes gradients
underflow, a loss that is non-finite from the first step makes every step overflow: shown side
by side, such findings read as several problems and give advice that contradicts the cause's
("raise the scale 2^8" while overflows are what pushed it down). `group` links each consequence
to its root cause (`Finding.cause`), replaces its recommendation with a pointer to the cause's,
and orders the list: each root, most severe group first, followed by its consequences.

The rules (`RULES`) are physical, not statistical: each names a cause kind, a consequence kind
and the condition under which the first explains the second. Conditions on steps decide which
came first when either could explain the other (a forward overflow from step 0 explains the
skips; gradients that blew up before the loss did explain the forward overflow).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ampscope_server.findings.facts import SEVERITY_RANK, Finding

Condition = Callable[[Finding, Finding], bool]


def _always(_cause: Finding, _consequence: Finding) -> bool:
    return True


def _not_later(cause: Finding, consequence: Finding) -> bool:
    """The cause started at or before the consequence."""
    return _start(cause) <= _start(consequence)


def _during(cause: Finding, consequence: Finding) -> bool:
    """The consequence started while the cause was going on (from its first step to its last)."""
    end = cause.step_end if cause.step_end is not None else _start(cause)
    return _start(cause) <= _start(consequence) <= end


def _during_after(cause: Finding, consequence: Finding) -> bool:
    """The consequence started strictly after the cause's first step, before its last."""
    return _during(cause, consequence) and _start(cause) < _start(consequence)


def _scale_pushed_down(storm: Finding, underflow: Finding) -> bool:
    """The underflow is judged at a scale below the one the storm started from."""
    before = storm.evidence.get("scale_before_storm")
    scale = underflow.evidence.get("scale")
    return before is None or scale is None or scale < before


def _start(finding: Finding) -> int:
    return finding.step_start if finding.step_start is not None else -1


RULES: tuple[tuple[str, str, Condition], ...] = (
    # A run that diverges (whatever the precision) overflows, skips, collapses its scale and
    # turns its loss non-finite as a result: the learning rate comes first.
    ("divergence", "forward_overflow", _always),
    ("divergence", "overflow_storm", _always),
    ("divergence", "scale_collapse", _always),
    ("divergence", "nan_not_range", _always),
    # The loss is non-finite before any scaling: every step's backward overflows as a result.
    ("forward_overflow", "overflow_storm", _during),
    ("forward_overflow", "scale_collapse", _not_later),
    ("forward_overflow", "nan_not_range", _during),
    # Gradients that blew up first grow the weights until the forward overflows too.
    ("overflow_storm", "forward_overflow", _during_after),
    ("overflow_storm", "scale_collapse", _always),
    ("overflow_storm", "gradient_underflow", _scale_pushed_down),
    # NaN from the data or the computation is skipped step after step: the skips follow from it.
    ("nan_not_range", "overflow_storm", _during),
    ("nan_not_range", "scale_collapse", _not_later),
    # A collapsed scale lifts nothing: gradients underflow because of it, not on their own.
    ("scale_collapse", "gradient_underflow", _always),
)
"""(cause kind, consequence kind, when the first explains the second). Scaler tuning is never
grouped: its advice (init_scale from the calibration descent, growth_interval from probes
outside storms) holds whatever else happened."""
KIND_ORDER = ("rank_nonfinite", "divergence", "forward_overflow", "nan_not_range", "overflow_storm",
              "scale_collapse",
              "amp_misuse", "precision_sensitive", "swallowed_updates", "gradient_underflow",
              "baseline_divergence", "calibration_overflow", "scaler_tuning")
"""Ties between roots of equal severity and first step: the more fundamental kind first."""


def _parent(finding: Finding, present: Sequence[Finding]) -> Finding | None:
    for cause_kind, consequence_kind, condition in RULES:
        if finding.kind != consequence_kind:
            continue
        for cause in present:
            if cause is not finding and cause.kind == cause_kind and condition(cause, finding):
                return cause
    return None


def _root(finding: Finding, parents: dict[int, Finding | None]) -> Finding:
    seen: set[int] = set()
    current = finding
    while (up := parents[id(current)]) is not None and id(up) not in seen:
        seen.add(id(current))
        current = up
    return current


def _deferred(consequence: Finding, root: Finding) -> Finding:
    return dataclasses.replace(
        consequence, cause=root.identity,
        recommendation=(f"Follows from “{root.title}”: act on that first (its advice); this "
                        "one should clear with it."))


def group(findings: Sequence[Finding]) -> list[Finding]:
    """Roots first, each followed by its consequences (in step order). Groups are ordered by
    their most severe member, then by the root's first step. Pure; the input is not modified."""
    parents = {id(f): _parent(f, findings) for f in findings}
    groups: dict[int, list[Finding]] = {}
    roots: dict[int, Finding] = {}
    for f in findings:
        root = _root(f, parents)
        roots[id(root)] = root
        if root is not f:
            groups.setdefault(id(root), []).append(_deferred(f, root))
    out: list[Finding] = []

    def rank(root: Finding) -> tuple[int, int, int]:
        members = [root, *groups.get(id(root), [])]
        order = KIND_ORDER.index(root.kind) if root.kind in KIND_ORDER else len(KIND_ORDER)
        return (-max(SEVERITY_RANK[m.severity] for m in members), _start(root), order)

    for root in sorted(roots.values(), key=rank):
        out.append(dataclasses.replace(root, cause=None))
        out.extend(sorted(groups.get(id(root), []), key=_start))
    return out


def primary(findings: Sequence[Finding]) -> Finding | None:
    """The root cause to read first (`group`'s first finding)."""
    return findings[0] if findings else None
