"""The findings engine on synthetic snapshots: one class per finding kind, positive and negative,
with exact expectations. Runs are simulated with GradScaler's algorithm (`synthetic.py`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import pytest

from ampscope_server.findings import (
    KINDS,
    Finding,
    ForwardOrigin,
    LayerSample,
    MisuseEvent,
    RunData,
    ShadowSample,
    StepPoint,
    SwallowedSample,
    analyze,
    most_severe,
)
from ampscope_server.findings.facts import NonfiniteKind, RecheckStatus
from ampscope_server.findings.timeline import history
from tests.server.findings.synthetic import (
    LAYERS,
    fits_below,
    healthy_samples,
    nonfinite_at,
    run_data,
    scaler_steps,
)

# Gradients that fit below 2^10: GradScaler comes down 2^16 → 2^10 in 6 skips (steps 0-5), then
# probes 2^11 after every 2000 clean steps (skips at 2006 and 4007).
HEALTHY = scaler_steps(6000, fits_below(2**10))
RECENT = healthy_samples(range(5900, 6000, 10))


def kinds(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.kind, f.severity) for f in findings]


def only(findings: list[Finding], kind: str) -> Finding:
    matching = [f for f in findings if f.kind == kind]
    assert len(matching) == 1, kinds(findings)
    return matching[0]


class TestHealthy:
    def test_no_warning_or_error(self) -> None:
        findings = analyze(run_data(HEALTHY, layer_samples=RECENT))
        assert kinds(findings) == [("calibration_overflow", "info"), ("scaler_tuning", "info")]

    def test_empty_run(self) -> None:
        assert analyze(run_data([])) == []

    def test_every_kind_is_listed(self) -> None:
        assert len(KINDS) == 13


class TestCalibration:
    def test_descent_and_probes(self) -> None:
        found = only(analyze(run_data(HEALTHY)), "calibration_overflow")
        assert found.severity == "info"
        assert (found.step_start, found.step_end) == (0, 4007)
        assert found.evidence == {"calibration_skips": 6, "probe_skips": 2,
                                  "init_scale": 65536.0, "settled_scale": 1024.0}
        assert found.title == ("Benign overflows: 6 calibration skip(s), 2 probe skip(s) after "
                               "growth")

    def test_calibration_skips_alone_are_not_a_storm(self) -> None:
        # 14 back-to-back skips (2^24 → 2^10): more than a storm window's threshold, but benign.
        steps = scaler_steps(3000, fits_below(2**10), init=2.0**24)
        findings = analyze(run_data(steps))
        assert "overflow_storm" not in [f.kind for f in findings]
        assert only(findings, "calibration_overflow").evidence["calibration_skips"] == 14

    def test_a_descent_that_never_fits_is_no_calibration(self) -> None:
        findings = analyze(run_data(scaler_steps(200, lambda step, scale: True)))
        assert "calibration_overflow" not in [f.kind for f in findings]

    def test_a_later_skip_to_a_new_low_carries_the_descent_on(self) -> None:
        """2^24 down to 2^18 back to back, then 2^18 and 2^17 overflow once each on a harder
        batch (steps 40 and 90): the run settles at 2^16, and an init_scale there avoids all 8
        (#30: the descent alone said 6 skips, settled at 2^18, and left two unexplained)."""
        steps = scaler_steps(300, lambda s, scale: scale > 2**18 or (s in (40, 90)
                                                                     and scale > 2**16),
                             init=2.0**24)
        findings = analyze(run_data(steps))
        calibration = only(findings, "calibration_overflow")
        assert calibration.evidence == {"calibration_skips": 8, "probe_skips": 0,
                                        "init_scale": 2.0**24, "settled_scale": 2.0**16}
        assert ("(steps 0-5; step 40 still overflowed at 262144 (2^18); step 90 still "
                "overflowed at 131072 (2^17)); the run held 65536 (2^16) from step 91 on."
                ) in calibration.explanation
        tuning = only(findings, "scaler_tuning")
        assert tuning.evidence == {"recommended_init_scale": 2.0**16,
                                   "avoidable_calibration_skips": 8,
                                   "remaining_skips_at_init_scale": 0}

    def test_a_nan_at_a_moderate_scale_is_not_calibration(self) -> None:
        """A later skip at 2^16 whose gradients turned NaN first is no range overflow by its
        look: nan_not_range's, not the descent's."""
        steps = scaler_steps(300, lambda s, scale: scale > 2**16 or s == 90, init=2.0**20)
        nonfinite = nonfinite_at({90}, (1, "nan"))
        h = history(run_data(steps, nonfinite=nonfinite))
        assert h is not None and h.calibration == [0, 1, 2, 3] and h.settled_scale == 2.0**16
        inf_first = history(run_data(steps, nonfinite=nonfinite_at({90}, (1, "inf"))))
        assert inf_first is not None and inf_first.calibration == [0, 1, 2, 3, 90]


class TestOverflowStorm:
    STORM = frozenset(range(2500, 2600, 12))  # 9 overflows in 100 steps

    def test_storm_with_culprits(self) -> None:
        steps = scaler_steps(6000, lambda s, scale: scale > 2**10 or s in self.STORM)
        nonfinite = nonfinite_at(self.STORM, (3, "inf"), (1, "inf"))
        found = only(analyze(run_data(steps, nonfinite=nonfinite)), "overflow_storm")
        assert found.severity == "error"
        assert (found.step_start, found.step_end) == (2500, 2596)
        assert found.layers == ["fc2.weight", "fc1.weight"]
        assert found.evidence["skipped_steps"] == 9
        assert found.evidence["max_skips_per_window"] == 9
        assert found.evidence["scale_before_storm"] == 1024.0
        assert found.evidence["scale_after_storm"] == 2.0

    def test_a_steady_loss_keeps_the_generic_advice(self) -> None:
        steps = scaler_steps(6000, lambda s, scale: scale > 2**10 or s in self.STORM)
        found = only(analyze(run_data(steps)), "overflow_storm")
        assert found.recommendation.startswith("Find why the gradients blow up")
        assert "loss_growth" not in found.evidence

    def test_four_skips_in_a_window_are_not_a_storm(self) -> None:
        storm = {3000, 3020, 3040, 3060}
        steps = scaler_steps(6000, lambda s, scale: scale > 2**10 or s in storm)
        assert "overflow_storm" not in [f.kind for f in analyze(run_data(steps))]


class TestForwardOrigin:
    """Where a forward overflow began (#30): the re-check's forward hooks name the module in
    forward order; a NaN loss makes every gradient NaN, so backward order would name the last
    layer. Backward order stays for backward-born overflows (a finite loss)."""

    STORM = TestOverflowStorm.STORM
    ORIGIN = ForwardOrigin("encoder.0", input_finite=True, format="fp16")

    def storm(self, loss_bad: bool) -> RunData:
        steps = scaler_steps(6000, lambda s, scale: scale > 2**10 or s in self.STORM,
                             loss=lambda s: math.inf if loss_bad and s in self.STORM else 1.0)
        run = run_data(steps, nonfinite=nonfinite_at(self.STORM, (3, "nan"), (1, "nan")))
        return dataclasses.replace(run, forward_origins={s: self.ORIGIN for s in self.STORM})

    def test_a_forward_born_storm_names_the_module_in_forward_order(self) -> None:
        found = only(analyze(self.storm(loss_bad=True)), "overflow_storm")
        assert found.layers == ["encoder.0"]
        assert found.explanation.endswith(
            "The overflow began in encoder.0 (forward) at step 2500: the first module in "
            "forward order whose output went beyond fp16's range; its input was finite (9 of "
            "the 9 re-checked step(s) began there).")
        assert "started in fc2.weight" not in found.explanation

    def test_a_backward_born_storm_keeps_the_backward_order(self) -> None:
        found = only(analyze(self.storm(loss_bad=False)), "overflow_storm")
        assert found.layers == ["fc2.weight", "fc1.weight"]
        assert "The overflow started in fc2.weight on 9 of these steps" in found.explanation
        assert "(forward)" not in found.explanation

    def test_forward_overflow_names_where_it_began(self) -> None:
        steps = scaler_steps(1000, lambda s, scale: scale > 2**10 or s in (300, 301),
                             loss=lambda s: math.nan if s in (300, 301) else 1.0)
        data = ForwardOrigin("0", input_finite=False, format="fp32")
        run = dataclasses.replace(run_data(steps), forward_origins={301: data})
        found = only(analyze(run), "forward_overflow")
        assert found.layers == ["0"]
        assert found.evidence["forward_origin_steps"] == 1
        assert ("The overflow began in 0 (forward) at step 301: the first module in forward "
                "order whose output went non-finite in FP32 too; its input was already "
                "non-finite (the data or an earlier op).") in found.explanation
        without = only(analyze(run_data(steps)), "forward_overflow")
        assert without.layers == [] and "(forward)" not in without.explanation

    def test_where_most_steps_began_is_said_when_it_is_not_the_first(self) -> None:
        bad = (300, 301, 302)
        steps = scaler_steps(1000, lambda s, scale: scale > 2**10 or s in bad,
                             loss=lambda s: math.inf if s in bad else 1.0)
        later = ForwardOrigin("2", input_finite=True, format="fp16")
        run = dataclasses.replace(
            run_data(steps), forward_origins={300: self.ORIGIN, 301: later, 302: later})
        found = only(analyze(run), "forward_overflow")
        assert found.layers == ["2", "encoder.0"]
        assert ("The overflow began in encoder.0 (forward) at step 300: the first module in "
                "forward order whose output went beyond fp16's range; its input was finite "
                "(1 of the 3 re-checked step(s) began there, 2 in 2).") in found.explanation


class TestDivergence:
    """Is it the precision or the run: the run's own magnitude decides (findings/divergence)."""

    STORM = TestOverflowStorm.STORM

    def test_a_diverging_loss_is_the_root_cause(self) -> None:
        # The loss grows 10x every 10 steps from 1.0 at step 2500 to 1e10 at 2600.
        steps = scaler_steps(6000, lambda s, scale: scale > 2**10 or s in self.STORM,
                             loss=lambda s: 10.0 ** ((min(max(s, 2500), 2600) - 2500) / 10))
        findings = analyze(run_data(steps))
        assert kinds(findings)[:2] == [("divergence", "error"), ("overflow_storm", "error")]
        found = findings[0]
        assert found.cause is None and findings[1].cause == "divergence"
        assert found.title == "Training diverges: the loss reached 1e+10x its healthy value"
        assert found.recommendation.startswith("Lower the learning rate (it is 0.001) or add "
                                               "warm-up, and clip the gradients")
        assert found.evidence == {"healthy_loss": 1.0, "loss_peak": 1e10, "loss_growth": 1e10}
        # The first step 100x the healthy loss, and the peak.
        assert (found.step_start, found.step_end) == (2520, 2600)

    def test_a_spike_the_run_comes_back_from_is_no_divergence(self) -> None:
        # 1e10 for steps 2500-2509, then 1.0 again: a storm, not a divergence.
        steps = scaler_steps(6000, lambda s, scale: scale > 2**10 or s in self.STORM,
                             loss=lambda s: 1e10 if 2500 <= s < 2510 else 1.0)
        assert "divergence" not in [f.kind for f in analyze(run_data(steps))]

    def test_fifty_times_is_no_divergence(self) -> None:
        steps = scaler_steps(6000, lambda s, scale: scale > 2**10 or s in self.STORM,
                             loss=lambda s: 50.0 if s >= 2500 else 1.0)
        assert "divergence" not in [f.kind for f in analyze(run_data(steps))]

    def _overflowing(self, fp32_loss: Callable[[int], float]) -> list[Finding]:
        """A loss finite at step 0 (0.4), NaN from step 1 on; every step re-checked in FP32,
        every re-check finite (vanished) at `fp32_loss(step)`."""
        steps = scaler_steps(40, lambda s, scale: s >= 1,
                             loss=lambda s: 0.4 if s == 0 else math.nan)
        bad = range(1, 40)
        return analyze(run_data(steps, rechecks={s: "vanished" for s in bad},
                                recheck_losses={s: fp32_loss(s) for s in bad}))

    def test_an_fp32_recheck_orders_of_magnitude_out_is_a_divergence(self) -> None:
        findings = self._overflowing(lambda s: 4e26 + s * 1e25)
        assert [(f.kind, f.cause) for f in findings] == [
            ("divergence", None), ("overflow_storm", "divergence"),
            ("forward_overflow", "divergence"), ("scale_collapse", "divergence")]
        root, forward = findings[0], findings[2]
        assert root.title == ("Training diverges: the loss reached 1.97e+27x its healthy value "
                              "(in FP32 too)")
        assert root.evidence["fp32_loss_peak"] == 4e26 + 39 * 1e25
        assert root.evidence["fp32_diverged_steps"] == 39
        assert forward.title == ("Non-finite loss on 39 step(s): FP32 reaches 7.9e+26 there, "
                                 "1.97e+27x the run's healthy loss (a divergence, not the range)")
        assert forward.evidence["recheck_diverged_steps"] == 39
        assert forward.evidence["recheck_vanished_steps"] == 0
        # Nothing says the loss is finite in FP32 as if that cleared the run.
        assert not any("finite in FP32" in f.title + f.explanation for f in findings)

    def test_an_fp32_recheck_at_the_runs_magnitude_is_the_range(self) -> None:
        findings = self._overflowing(lambda s: 0.3 + s / 100)
        assert "divergence" not in [f.kind for f in findings]
        forward = only(findings, "forward_overflow")
        assert forward.cause is None
        assert forward.title == ("Forward overflow on 39 step(s): the loss is finite in FP32, "
                                 "non-finite in fp16")
        assert forward.evidence["recheck_vanished_steps"] == 39

    def test_without_a_finite_loss_the_fp32_rechecks_set_the_magnitude(self) -> None:
        """Non-finite from the first step (activations beyond FP16 from the start): the run's
        magnitude is the FP32 one, 1e8 here, and 1.5e8 is not a divergence."""
        steps = scaler_steps(20, lambda s, scale: True, loss=lambda s: math.inf)
        findings = analyze(run_data(steps, rechecks={s: "vanished" for s in range(20)},
                                    recheck_losses={s: 1e8 + s * 2.5e6 for s in range(20)}))
        assert "divergence" not in [f.kind for f in findings]
        assert findings[0].kind == "forward_overflow"

    def test_a_gradient_norm_ten_thousand_times_the_healthy_one(self) -> None:
        steps = [dataclasses.replace(p, grad_norm=0.5 if p.step < 900 else 6000.0)
                 for p in HEALTHY[:1000]]
        found = only(analyze(run_data(steps)), "divergence")
        assert found.title == "Training diverges: the gradient norm grew 1.2e+04x"
        assert found.evidence == {"healthy_loss": 2.0 * math.exp(-2 / 500),
                                  "healthy_grad_norm": 0.5, "grad_norm_peak": 6000.0,
                                  "grad_norm_growth": 12000.0}

    def test_a_forward_overflow_after_taken_steps_asks_for_the_recheck(self) -> None:
        steps = scaler_steps(1000, lambda s, scale: scale > 2**10 or s in (300, 301),
                             loss=lambda s: math.inf if s in (300, 301) else 1.0)
        found = only(analyze(run_data(steps)), "forward_overflow")
        assert ("The loss was finite before step 300, so the update just before may have "
                "diverged (too high a learning rate) as well as overflowed the format: "
                "register the FP32 re-check (mon.recheck) to tell them apart.") in \
            found.explanation


class TestScaleCollapse:
    def test_collapse_below_one_is_an_error(self) -> None:
        findings = analyze(run_data(scaler_steps(200, lambda step, scale: True)))
        assert kinds(findings) == [("overflow_storm", "error"), ("scale_collapse", "error")]
        found = only(findings, "scale_collapse")
        assert found.step_start == 15  # 2^16 halved 16 times: the backoff that reached 1
        assert found.evidence["skipped_steps"] == 200

    def test_falling_scale_is_a_warning(self) -> None:
        # The gradients grow 2x every 100 steps in the second half: one backoff per 100 steps.
        steps = scaler_steps(
            2000, lambda s, scale: scale > 2.0 ** (12 - max(0, s - 1000) // 100))
        found = only(analyze(run_data(steps)), "scale_collapse")
        assert found.severity == "warning"
        assert found.evidence == {"scale_mid": 4096.0, "final_scale": 8.0, "net_halvings": 9.0}
        assert (found.step_start, found.step_end) == (1000, 1999)

    def test_stable_low_scale_is_not_a_collapse(self) -> None:
        steps = scaler_steps(3000, fits_below(8.0))
        assert "scale_collapse" not in [f.kind for f in analyze(run_data(steps))]


class TestForwardOverflow:
    def test_infinite_loss(self) -> None:
        steps = scaler_steps(1000, lambda s, scale: scale > 2**10 or s in (300, 301),
                             loss=lambda s: math.inf if s in (300, 301) else 1.0)
        found = only(analyze(run_data(steps)), "forward_overflow")
        assert found.severity == "error"
        assert (found.step_start, found.step_end) == (300, 301)
        assert found.evidence == {"nonfinite_loss_steps": 2, "nan_loss_steps": 0,
                                  "inf_loss_steps": 2}
        assert "no scale can fix this" in found.explanation

    def test_without_a_scaler_the_steps_were_applied(self) -> None:
        """A BF16 run without a GradScaler: no scale, nothing skipped; the finding says the
        NaN reached the weights and does not advise BF16."""
        steps = [StepPoint(step=s, scale_before=None, scale_after=None, found_inf=s >= 40,
                           skipped=False, loss=math.nan if s >= 41 else 1.0) for s in range(50)]
        found = only(analyze(run_data(steps, target_format="bf16")), "forward_overflow")
        assert (found.step_start, found.step_end) == (41, 49)
        assert found.explanation.endswith(
            "This run has no loss scale (no GradScaler): nothing skipped these steps, so the "
            "optimizer applied them and the NaN/inf reached the weights.")
        assert "scaler will skip" not in found.explanation
        assert found.recommendation.endswith("or by computing the loss in FP32.")

    def test_backward_overflow_is_not_forward(self) -> None:
        assert "forward_overflow" not in [f.kind for f in analyze(run_data(HEALTHY))]

    @pytest.mark.parametrize("status", ["persisted", "vanished"])
    def test_the_fp32_recheck_names_the_cause(self, status: RecheckStatus) -> None:
        steps = scaler_steps(1000, lambda s, scale: scale > 2**10 or s == 300,
                             loss=lambda s: math.nan if s == 300 else 1.0)
        found = only(analyze(run_data(steps, rechecks={300: status})), "forward_overflow")
        assert found.severity == "error" and (found.step_start, found.step_end) == (300, 300)
        assert found.evidence == {
            "nonfinite_loss_steps": 1, "nan_loss_steps": 1, "inf_loss_steps": 0,
            "recheck_persisted_steps": int(status == "persisted"),
            "recheck_vanished_steps": int(status == "vanished")}
        if status == "persisted":
            assert found.title == "Non-finite loss on 1 step(s), also in FP32: not a range overflow"
            assert "will not help" in found.recommendation
        else:
            assert found.title == ("Forward overflow on 1 step(s): the loss is finite in FP32, "
                                   "non-finite in fp16")
            assert "exceeds FP16's range" in found.explanation
            assert found.recommendation.startswith("Bring the forward pass into the format's")
            assert "already ran" in found.recommendation


class TestNanNotRange:
    def _run(self, kind: NonfiniteKind, amax: float) -> list[Finding]:
        steps = scaler_steps(6000, lambda s, scale: scale > 2**10 or s == 3000)
        context = [dataclasses.replace(s, amax=amax) for s in healthy_samples([2990])]
        return analyze(run_data(
            steps, nonfinite=nonfinite_at({3000}, (2, kind), (1, kind)),
            nan_context={3000: context}))

    def test_nan_with_ample_headroom(self) -> None:
        found = only(self._run("nan", 0.05), "nan_not_range")
        assert found.severity == "error"
        assert (found.step_start, found.step_end) == (3000, 3000)
        assert found.layers == ["fc1.bias", "fc1.weight"]
        # log2(65504 / (0.05 * 1024)) = 10.32 doublings of headroom just before.
        assert found.evidence["headroom_bits_before"] == math.log2(65504 / (0.05 * 1024))
        assert "FP32" in found.recommendation

    def test_inf_is_a_range_problem(self) -> None:
        assert "nan_not_range" not in [f.kind for f in self._run("inf", 0.05)]

    def test_nan_near_the_format_max_is_not_flagged(self) -> None:
        # amax 30 at scale 1024: 1.09 doublings of headroom, the NaN may come from an overflow.
        assert "nan_not_range" not in [f.kind for f in self._run("nan", 30.0)]

    def test_nan_persisting_after_backoffs(self) -> None:
        steps = scaler_steps(6000, lambda s, scale: scale > 2**10 or 3000 <= s < 3006)
        found = only(analyze(run_data(steps, nonfinite=nonfinite_at(range(3000, 3006),
                                                                    (2, "nan")))),
                     "nan_not_range")
        # 1024 → 64 after four backoffs: steps 3004 and 3005 still NaN.
        assert (found.step_start, found.step_end) == (3004, 3005)
        assert found.evidence["persisting_nan_steps"] == 2
        assert found.severity == "warning"  # could be an explosion: the re-check would tell

    def test_a_persisted_recheck_of_a_nan_loss_is_forward_overflows_alone(self) -> None:
        # The data-NaN of nan_in_data: the loss is NaN and the FP32 re-check reproduced it.
        steps = scaler_steps(1000, lambda s, scale: scale > 2**10 or s == 300,
                             loss=lambda s: math.nan if s == 300 else 1.0)
        findings = analyze(run_data(steps, rechecks={300: "persisted"}))
        assert "nan_not_range" not in [f.kind for f in findings]
        assert only(findings, "forward_overflow").title == (
            "Non-finite loss on 1 step(s), also in FP32: not a range overflow")

    def test_no_advice_to_run_a_recheck_that_ran(self) -> None:
        # A NaN gradient with a finite loss, re-checked in FP32: it persisted.
        steps = scaler_steps(6000, lambda s, scale: scale > 2**10 or s == 3000)
        found = only(analyze(run_data(
            steps, nonfinite=nonfinite_at({3000}, (2, "nan")), rechecks={3000: "persisted"})),
            "nan_not_range")
        assert found.recommendation.startswith(
            "The FP32 re-check already ran and the NaN persisted: inspect the inputs of step 3000")
        assert "(mon.recheck)" not in found.recommendation

    def test_v1_runs_fall_back_on_a_nan_grad_norm(self) -> None:
        steps = [dataclasses.replace(p, grad_norm=math.nan) if p.step == 3000 else p
                 for p in scaler_steps(6000, lambda s, scale: scale > 2**10 or s == 3000)]
        found = only(analyze(run_data(steps, nan_context={3000: healthy_samples([2990])})),
                     "nan_not_range")
        assert found.layers == []


def _underflowing(fc2_amax: float) -> list[LayerSample]:
    """fc1.weight loses 60 % of its gradient (typical magnitude 1e-9) at scale 2^10: its
    non-zero values are subnormal there (1e-9 x 1024 < 2^-14), so its zeros are flushed."""
    out = []
    for sample in RECENT:
        if sample.layer == 1:
            sample = dataclasses.replace(sample, zero_frac=0.6, subnormal_frac=0.4,
                                         l2=1e-9 * math.sqrt(512))
        if sample.layer == 3:
            sample = dataclasses.replace(sample, amax=fc2_amax)
        out.append(sample)
    return out


class TestGradientUnderflow:
    def test_rescued_by_doublings(self) -> None:
        found = only(analyze(run_data(HEALTHY, layer_samples=_underflowing(0.05))),
                     "gradient_underflow")
        assert found.severity == "warning"
        assert found.layers == ["fc1.weight"]
        # ceil(log2(2^-14 / (1e-9 * 1024))) = 6 doublings; 10.3 bits of headroom allow 9.
        assert found.evidence["doublings_needed"] == 6
        assert found.evidence["recommended_scale"] == 65536.0
        assert found.recommendation.startswith("Raise the loss scale 64x to 65536")
        assert (found.step_start, found.step_end) == (5950, 5990)

    def test_a_run_without_a_scaler_is_told_to_add_one(self) -> None:
        """FP16 without a GradScaler: the scale is null (1 in effect), the gradients lie below
        the format; the advice adds a scaler rather than raising one."""
        samples = [dataclasses.replace(s, scale=None) for s in _underflowing(0.05)]
        found = only(analyze(run_data(HEALTHY, layer_samples=samples)), "gradient_underflow")
        # ceil(log2(2^-14 / 1e-9)) = 16 doublings at scale 1; 20.3 bits of headroom allow them.
        assert found.evidence["doublings_needed"] == 16
        assert found.recommendation.startswith(
            "This run has no loss scale: add one, torch.amp.GradScaler(init_scale=65536) "
            "(65536x), which also skips the steps that would overflow: the layer closest to "
            "overflow, embed.weight, has 20.3 doublings of headroom, enough for that.")
        assert found.explanation.startswith("Without a loss scale, fc1.weight loses 60% of its")

    def test_format_cannot_serve_both(self) -> None:
        found = only(analyze(run_data(HEALTHY, layer_samples=_underflowing(30.0))),
                     "gradient_underflow")
        assert "recommended_scale" not in found.evidence
        assert found.recommendation.startswith(
            "The format cannot serve both: fc1.weight needs about 6 more doublings of the "
            "scale, but fc2.weight overflows after 1.1. Train in BF16")

    def test_embedding_zeros_are_not_underflow(self) -> None:
        # RECENT gives the embedding a 90 % zero fraction: row-sparse by construction.
        assert "gradient_underflow" not in [
            f.kind for f in analyze(run_data(HEALTHY, layer_samples=RECENT))]


class TestSwallowedUpdates:
    def test_fp16_parameters(self) -> None:
        half = [dataclasses.replace(layer, dtype="float16") for layer in LAYERS]
        found = only(analyze(run_data(HEALTHY, layers=half, layer_samples=RECENT)),
                     "swallowed_updates")
        assert found.severity == "warning"
        # update = lr 1e-3 x rms 2e-3; half spacing of FP16 at |w|: 2^-11 for the embedding
        # (N(0,1)), 2^-14 for fc1.weight (|w| ~ 1/sqrt(48)), 2^-15 for fc2.weight; no estimate
        # for the bias.
        assert found.layers == ["embed.weight", "fc1.weight", "fc2.weight"]
        assert found.evidence["half_spacing"] == 2.0**-11
        assert math.isclose(found.evidence["update"], 2e-6)

    def test_a_measured_weight_magnitude_wins(self) -> None:
        half = [dataclasses.replace(layer, dtype="float16") for layer in LAYERS]
        samples = [dataclasses.replace(s, param_rms=1e-4) for s in RECENT]
        # at |w| = 1e-4 the half spacing is 2^-25 ≈ 3e-8: a 2e-6 update survives.
        assert "swallowed_updates" not in [
            f.kind for f in analyze(run_data(HEALTHY, layers=half, layer_samples=samples))]

    def test_fp32_parameters_are_never_judged(self) -> None:
        assert "swallowed_updates" not in [
            f.kind for f in analyze(run_data(HEALTHY, layer_samples=RECENT))]


class TestAmpMisuse:
    def test_hook_events(self) -> None:
        misuse = [MisuseEvent(s, "clip_before_unscale", "clip saw scaled grads")
                  for s in (10, 11, 12)]
        found = only(analyze(run_data(HEALTHY, misuse=misuse)), "amp_misuse")
        assert found.severity == "warning"
        assert found.title == "Gradients clipped while still scaled (3 step(s))"
        assert (found.step_start, found.step_end) == (10, 12)

    def test_scheduler_on_skipped_steps(self) -> None:
        steps = scaler_steps(6000, fits_below(2**10), lr=lambda s: 1e-3 * min(1, (s + 1) / 1000))
        found = only(analyze(run_data(steps)), "amp_misuse")
        assert found.severity == "info"  # 6 of 6000 steps: below LR_SKIP_WARN_FRACTION
        assert found.evidence == {"skipped_steps_with_lr_change": 6, "fraction_of_run": 0.001}

    def test_scheduler_on_many_skipped_steps_warns(self) -> None:
        steps = scaler_steps(400, fits_below(2**10), lr=lambda s: 1e-3 * (s + 1))
        found = only(analyze(run_data(steps)), "amp_misuse")
        assert found.severity == "warning"  # 6 of 400 = 1.5 %


class TestScalerTuning:
    def test_init_scale_and_growth_interval(self) -> None:
        found = only(analyze(run_data(scaler_steps(10_000, fits_below(2**10)))), "scaler_tuning")
        assert found.recommendation == "GradScaler(init_scale=1024, growth_interval=5000)."
        assert found.evidence == {
            "recommended_init_scale": 1024.0, "avoidable_calibration_skips": 6,
            "remaining_skips_at_init_scale": 0,
            "observed_growth_interval": 2000.0, "probe_skips": 4, "steps_after_growth": 1.0,
            # Started at 1024, 5000 clean steps, a growth, a probe: once in the ~9990 steps
            # after calibration (the 2000 of the run probed 4 times).
            "recommended_growth_interval": 5000, "avoidable_probe_skips": 3}

    def test_nothing_to_tune(self) -> None:
        steps = scaler_steps(1500, fits_below(2**15))  # one calibration skip, no probe yet
        assert "scaler_tuning" not in [f.kind for f in analyze(run_data(steps))]


def _diverging() -> tuple[list[StepPoint], list[StepPoint], list[LayerSample],
                         list[LayerSample]]:
    """(run, baseline, run samples, baseline samples): the run's loss 10 % above the
    baseline's from step 500, its layer 1's l2 doubled from there."""
    base = scaler_steps(1000, fits_below(2**10), loss=lambda s: 2.0 - s / 1000)
    run = scaler_steps(1000, fits_below(2**10),
                       loss=lambda s: (2.0 - s / 1000) * (1.1 if s >= 500 else 1.0))
    base_samples = healthy_samples(range(0, 1000, 10))
    samples = [dataclasses.replace(s, l2=(s.l2 or 0) * 2)
               if s.layer == 1 and s.step >= 500 else s for s in base_samples]
    return run, base, samples, base_samples


class TestBaselineDivergence:
    def test_first_step_and_layers(self) -> None:
        run, base, samples, base_samples = _diverging()
        found = only(analyze(run_data(run, layer_samples=samples),
                             run_data(base, layer_samples=base_samples, name="fp32")),
                     "baseline_divergence")
        assert (found.severity, found.step_start, found.layers) == ("warning", 500, ["fc1.weight"])
        assert math.isclose(found.evidence["relative"], 0.1)

    def test_a_wrapped_run_matches_a_plain_baseline_by_canonical_name(self) -> None:
        """The run was compiled and wrapped in DDP (`_orig_mod.module.` before every name): its
        layers still meet the plain baseline's, and the finding names them as the run does."""
        run, base, samples, base_samples = _diverging()
        wrapped = [dataclasses.replace(layer, name=f"_orig_mod.module.{layer.name}")
                   for layer in LAYERS]
        found = only(analyze(run_data(run, layers=wrapped, layer_samples=samples),
                             run_data(base, layer_samples=base_samples, name="fp32")),
                     "baseline_divergence")
        assert found.layers == ["_orig_mod.module.fc1.weight"]

    def test_identical_runs_do_not_diverge(self) -> None:
        data = run_data(HEALTHY)
        assert "baseline_divergence" not in [f.kind for f in analyze(data, data)]


class TestOrdering:
    def test_most_severe_first(self) -> None:
        steps = [dataclasses.replace(p, loss=math.nan) if p.step == 100 else p for p in HEALTHY]
        findings = analyze(run_data(steps))
        assert kinds(findings)[0] == ("forward_overflow", "error")
        assert most_severe(findings) is findings[0]
        assert most_severe([]) is None

    def test_resent_steps_count_once(self) -> None:
        again = [*HEALTHY[:10], *HEALTHY]
        assert analyze(run_data(again)) == analyze(run_data(HEALTHY))

    def test_unknown_scale_is_tolerated(self) -> None:
        steps = [StepPoint(s, None, None, False, False, loss=1.0) for s in range(100)]
        assert analyze(run_data(steps, layer_samples=RECENT)) == []


class TestProbes:
    def test_frequent_probes_are_tuning_not_a_storm(self) -> None:
        # growth_interval 20: the scaler probes 2^11 every 21 steps, 5 skips per 100 steps.
        steps = scaler_steps(1000, fits_below(2**10), growth_interval=20)
        findings = analyze(run_data(steps))
        assert kinds(findings) == [("calibration_overflow", "info"), ("scaler_tuning", "info")]
        tuning = only(findings, "scaler_tuning")
        assert tuning.evidence["recommended_growth_interval"] == 50
        assert tuning.evidence["observed_growth_interval"] == 20


class TestRechecksAndMeasuredSwallowing:
    def test_persisted_recheck_is_not_a_range_problem(self) -> None:
        steps = scaler_steps(6000, lambda s, scale: scale > 2**10 or s == 3000)
        found = only(analyze(run_data(steps, rechecks={3000: "persisted"})), "nan_not_range")
        assert (found.step_start, found.evidence["recheck_persisted_steps"]) == (3000, 1)

    def test_vanished_recheck_clears_a_nan(self) -> None:
        steps = scaler_steps(6000, lambda s, scale: scale > 2**10 or s == 3000)
        data = run_data(steps, nonfinite=nonfinite_at({3000}, (2, "nan")),
                        nan_context={3000: healthy_samples([2990])},
                        rechecks={3000: "vanished"})
        assert "nan_not_range" not in [f.kind for f in analyze(data)]

    def test_measured_fraction_wins_over_the_estimate(self) -> None:
        swallowed = [SwallowedSample(step, layer, 0.8 if layer == 3 else 0.0)
                     for step in range(5950, 6000, 10) for layer in range(4)]
        found = only(analyze(run_data(HEALTHY, swallowed=swallowed)), "swallowed_updates")
        assert found.layers == ["fc2.weight"]
        assert found.evidence == {"layers_flagged": 1, "swallowed_frac": 0.8}


def shadows(losses: dict[int, float], rel_err: tuple[float | None, ...] = (1e-3,) * 4
            ) -> list[ShadowSample]:
    return [ShadowSample(step, loss, rel_err, (1.0,) * len(rel_err), (1.0,) * len(rel_err))
            for step, loss in sorted(losses.items())]


class TestPrecisionSensitive:
    """The FP32 shadow steps' per-layer rel_err (findings/precision.py): a layer whose median
    over the recent shadow steps where its FP32 gradient is not negligible (1e-3 of the largest
    layer's at the step) is 10 % or more is named."""

    ERRS = ((1e-3, 0.2, math.nan, 0.1), (2e-3, 0.3, math.nan, 0.12),
            (1e-3, 0.25, 0.05, 0.09))

    def _findings(self, errs: Sequence[tuple[float | None, ...]],
                  norms: Sequence[tuple[float | None, ...]] | None = None,
                  cosines: Sequence[tuple[float | None, ...]] | None = None) -> list[Finding]:
        norms = norms or [(1.0,) * len(e) for e in errs]
        cosines = cosines or [(1.0,) * len(e) for e in errs]
        samples = [ShadowSample(100 * (i + 1), 1.0, e, n, c)
                   for i, (e, n, c) in enumerate(zip(errs, norms, cosines, strict=True))]
        return analyze(dataclasses.replace(run_data(HEALTHY, layer_samples=RECENT),
                                           shadows=samples))

    def test_the_layers_at_ten_percent_or_more_worst_first(self) -> None:
        found = only(self._findings(self.ERRS), "precision_sensitive")
        assert found.severity == "warning" and found.cause is None
        # fc1.bias: NaN twice (FP32's gradient 0: no measurement) and 0.05: not named.
        assert found.layers == ["fc1.weight", "fc2.weight"]
        assert found.title == ("2 layer(s) compute a gradient 25% off FP32's: keep fc1.weight, "
                               "fc2.weight in FP32/BF16")
        assert found.evidence == {"shadow_steps": 3, "max_median_rel_err": 0.25,
                                  "sensitive_layers": 2, "negligible_layers": 0,
                                  "threshold": 0.1, "negligible_norm_frac": 1e-3}
        assert "not judged" not in found.explanation
        assert (found.step_start, found.step_end) == (100, 300)
        assert "fc1.weight (0.25), fc2.weight (0.1)" in found.explanation
        assert found.recommendation.startswith("Keep fc1.weight, fc2.weight in FP32/BF16")

    def test_below_ten_percent_or_without_shadow_steps_nothing(self) -> None:
        below = [(1e-3, 0.099, None, 0.05)] * 3
        assert "precision_sensitive" not in [f.kind for f in self._findings(below)]
        assert "precision_sensitive" not in [f.kind for f in self._findings([])]

    def test_a_layer_with_a_negligible_fp32_gradient_is_not_judged(self) -> None:
        """embed.weight: rel_err 1000 on an FP32 norm of 1e-8 beside fc1.bias's 2.0 (like a
        bias before BatchNorm: a true gradient of 0, rounding noise in FP32): left out.
        fc1.weight at a real norm with rel_err 0.3 is named; fc2.weight at exactly 1e-3 of the
        largest is judged (0.01, not named)."""
        errs = [(1000.0, 0.3, 1e-3, 0.01)] * 3
        norms = [(1e-8, 0.5, 2.0, 2e-3)] * 3
        cosines = [(0.87, 1.0, 1.0, 1.0), (-0.4, 1.0, 1.0, 1.0), (0.3, 1.0, 1.0, 1.0)]
        found = only(self._findings(errs, norms, cosines), "precision_sensitive")
        assert found.layers == ["fc1.weight"]
        assert found.title == ("1 layer(s) compute a gradient 30% off FP32's: keep fc1.weight "
                               "in FP32/BF16")
        assert found.evidence == {"shadow_steps": 3, "max_median_rel_err": 0.3,
                                  "sensitive_layers": 1, "negligible_layers": 1,
                                  "threshold": 0.1, "negligible_norm_frac": 1e-3}
        assert found.explanation.endswith(
            " 1 layer(s) whose FP32 gradient was below 0.001 of the largest layer's at every "
            "shadow step, in no steady direction (a true gradient of ~0, rounding noise in FP32 "
            "too), were not judged.")

    def test_a_small_real_gradient_keeps_its_direction_and_is_judged(self) -> None:
        """embed.weight's FP32 norm is 1e-7 of the largest (inputs subnormal in FP16), but the
        AMP gradient points the same way (median cosine 0.97 >= 0.9): a real gradient computed
        from too few bits, rel_err 0.25, named. At a median cosine of 0.89 it is left out."""
        errs = [(0.3, 1e-3, 1e-3, 1e-3), (0.25, 1e-3, 1e-3, 1e-3), (0.2, 1e-3, 1e-3, 1e-3)]
        norms = [(1e-7, 1.0, 1.0, 1.0)] * 3
        coherent = [(0.93, 1.0, 1.0, 1.0), (0.97, 1.0, 1.0, 1.0), (0.99, 1.0, 1.0, 1.0)]
        found = only(self._findings(errs, norms, coherent), "precision_sensitive")
        assert found.layers == ["embed.weight"]
        assert found.evidence["max_median_rel_err"] == 0.25
        assert found.evidence["negligible_layers"] == 0
        wavering = [(0.99, 1.0, 1.0, 1.0), (0.89, 1.0, 1.0, 1.0), (0.5, 1.0, 1.0, 1.0)]
        assert "precision_sensitive" not in [
            f.kind for f in self._findings(errs, norms, wavering)]

    def test_the_median_is_over_the_steps_where_a_layer_was_judged(self) -> None:
        """embed.weight is negligible at two of four steps (rel_err 500 there) and at 0.2 and
        0.4 where judged: median 0.3, not 350. A layer negligible at one step is judged at the
        others, so it is not counted as left out."""
        errs = [(500.0, 1e-3, 1e-3, 1e-3), (0.2, 1e-3, 1e-3, 1e-3),
                (500.0, 1e-3, 1e-3, 1e-3), (0.4, 1e-3, 1e-3, 1e-3)]
        norms = [(1e-9, 1.0, 1.0, 1.0), (0.5, 1.0, 1.0, 1.0),
                 (1e-9, 1.0, 1.0, 1.0), (0.5, 1.0, 1.0, 1.0)]
        cosines = [(0.1, 1.0, 1.0, 1.0), (1.0, 1.0, 1.0, 1.0),
                   (-0.6, 1.0, 1.0, 1.0), (1.0, 1.0, 1.0, 1.0)]  # noise where negligible
        found = only(self._findings(errs, norms, cosines), "precision_sensitive")
        assert found.layers == ["embed.weight"]
        assert found.evidence["max_median_rel_err"] == pytest.approx(0.3)
        assert found.evidence["negligible_layers"] == 0

    def test_every_layer_negligible_or_zero_nothing(self) -> None:
        """All norms 0 (rel_err 0 where both gradients are 0) or a single non-zero layer whose
        rel_err is small: nothing to name."""
        zero = [(0.0, 0.0, 0.0, 0.0)] * 3
        assert "precision_sensitive" not in [f.kind for f in self._findings(zero, zero)]
        errs = [(5.0, 5.0, 5.0, 1e-3)] * 3
        norms = [(1e-7, 0.0, None, 1.0)] * 3
        cosines = [(0.2, math.nan, None, 1.0)] * 3
        assert "precision_sensitive" not in [
            f.kind for f in self._findings(errs, norms, cosines)]


class TestShadowEvidence:
    """The FP32 shadow losses as evidence for range or divergence (findings/divergence.py,
    nonfinite.py), and no finding saying what they contradict."""

    def _overflowing(self, shadow_loss: float) -> list[Finding]:
        """A loss of 1.0 until step 19, +inf from step 20 (every step skipped); FP32 shadow
        steps at 9 and 19 (applied steps), the one at 19 giving `shadow_loss`."""
        steps = scaler_steps(40, lambda s, scale: s >= 20,
                             loss=lambda s: 1.0 if s < 20 else math.inf)
        return analyze(dataclasses.replace(
            run_data(steps), shadows=shadows({9: 1.0, 19: shadow_loss})))

    def test_a_shadow_loss_at_the_healthy_magnitude_while_amp_overflows_is_the_range(
        self
    ) -> None:
        findings = self._overflowing(1.1)
        assert "divergence" not in [f.kind for f in findings]
        forward = only(findings, "forward_overflow")
        assert forward.cause is None
        assert forward.title == ("Forward overflow on 20 step(s): the loss is finite in FP32, "
                                 "non-finite in fp16")
        assert forward.evidence == {"nonfinite_loss_steps": 20, "nan_loss_steps": 0,
                                    "inf_loss_steps": 20, "shadow_healthy_steps": 1,
                                    "shadow_loss_max": 1.1, "healthy_loss": 1.0}
        assert forward.explanation.startswith(
            "The FP32 shadow step(s) at step(s) 19 (the same weights and batch, no autocast, "
            "no scaling) gave losses up to 1.1, at the run's healthy magnitude: the weights "
            "have not diverged.")
        # The shadow step rules out the divergence the finding would otherwise leave open.
        assert "may have diverged" not in forward.explanation

    def test_a_shadow_loss_a_hundred_times_the_healthy_one_is_a_divergence(self) -> None:
        findings = self._overflowing(500.0)
        assert [(f.kind, f.cause) for f in findings] == [
            ("divergence", None), ("overflow_storm", "divergence"),
            ("forward_overflow", "divergence"), ("scale_collapse", "divergence")]
        root, forward = findings[0], findings[2]
        assert root.title == ("Training diverges: the loss reached 500x its healthy value "
                              "(in FP32 too)")
        assert root.evidence == {"healthy_loss": 1.0, "shadow_loss_peak": 500.0,
                                 "shadow_loss_growth": 500.0, "shadow_diverged_steps": 1}
        assert (root.step_start, root.step_end) == (19, 19)
        assert forward.title == ("Non-finite loss on 20 step(s): FP32 reaches 500 there, 500x "
                                 "the run's healthy loss (a divergence, not the range)")
        assert not any("finite in FP32" in f.title + f.explanation for f in findings)

    def test_an_amp_loss_out_there_that_fp32_keeps_healthy_is_no_divergence(self) -> None:
        """The AMP loss 1000x the healthy one from step 2500, FP32 on the same weights at 1.0
        after it: the weights did not diverge; the AMP computation is what went wrong."""
        steps = scaler_steps(3000, fits_below(2**10),
                             loss=lambda s: 1e3 if s >= 2500 else 1.0)
        amp_only = analyze(run_data(steps))
        assert only(amp_only, "divergence").title == (
            "Training diverges: the loss reached 1e+03x its healthy value")
        healthy = analyze(dataclasses.replace(run_data(steps),
                                              shadows=shadows({2400: 1.0, 2600: 1.0})))
        assert "divergence" not in [f.kind for f in healthy]
        out = only(analyze(dataclasses.replace(
            run_data(steps), shadows=shadows({2400: 1.0, 2600: 900.0}))), "divergence")
        assert out.title == "Training diverges: the loss reached 1e+03x its healthy value " \
                            "(in FP32 too)"
        assert out.evidence["shadow_loss_peak"] == 900.0
