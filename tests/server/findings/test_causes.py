"""One root cause first (findings/causes.py): consequences sit under their cause and defer to
its advice; which came first decides between causes that could explain each other."""

from __future__ import annotations

from ampscope_server.findings import Finding, primary
from ampscope_server.findings.causes import group
from ampscope_server.findings.facts import Severity


def _f(kind: str, start: int, end: int, severity: Severity = "error",
       **evidence: float) -> Finding:
    return Finding(kind=kind, severity=severity, title=f"{kind} {start}-{end}",
                   explanation="", recommendation=f"fix {kind}", step_start=start,
                   step_end=end, evidence=dict(evidence))


def _shape(findings: list[Finding]) -> list[tuple[str, str | None]]:
    return [(f.kind, f.cause) for f in findings]


class TestGroup:
    def test_forward_overflow_from_the_first_step_is_the_root(self) -> None:
        # activation_overflow: the loss is non-finite from step 0, every step is skipped.
        out = group([_f("overflow_storm", 0, 29), _f("scale_collapse", 15, 29),
                     _f("forward_overflow", 0, 29)])
        assert _shape(out) == [("forward_overflow", None),
                               ("overflow_storm", "forward_overflow"),
                               ("scale_collapse", "forward_overflow")]
        assert out[1].recommendation == (
            "Follows from “forward_overflow 0-29”: act on that first (its advice); this one "
            "should clear with it.")
        assert out[0].recommendation == "fix forward_overflow"

    def test_gradients_that_blew_up_first_explain_the_forward_overflow(self) -> None:
        # lr_explodes: skips from step 1, the loss non-finite only from step 20.
        out = group([_f("forward_overflow", 20, 59), _f("overflow_storm", 1, 59),
                     _f("scale_collapse", 18, 59),
                     _f("gradient_underflow", 50, 59, "warning", scale=1e-9)])
        assert _shape(out) == [("overflow_storm", None),
                               ("scale_collapse", "overflow_storm"),
                               ("forward_overflow", "overflow_storm"),
                               ("gradient_underflow", "overflow_storm")]
        assert primary(out) is out[0]

    def test_a_later_unrelated_cause_stays_a_root(self) -> None:
        out = group([_f("overflow_storm", 200, 250), _f("forward_overflow", 350, 350)])
        assert _shape(out) == [("overflow_storm", None), ("forward_overflow", None)]

    def test_underflow_at_a_scale_the_storm_did_not_lower_is_its_own(self) -> None:
        out = group([_f("overflow_storm", 10, 20, scale_before_storm=2.0**10),
                     _f("gradient_underflow", 50, 60, "warning", scale=2.0**12)])
        assert _shape(out) == [("overflow_storm", None), ("gradient_underflow", None)]

    def test_groups_ordered_by_their_most_severe_member(self) -> None:
        out = group([_f("scaler_tuning", 0, 5, "info"), _f("gradient_underflow", 9, 9, "warning"),
                     _f("calibration_overflow", 0, 5, "info")])
        assert _shape(out) == [("gradient_underflow", None), ("calibration_overflow", None),
                               ("scaler_tuning", None)]

    def test_empty(self) -> None:
        assert group([]) == [] and primary([]) is None
