"""Which layers a recipe keeps in BF16 (findings/recipe_fit.py), from samples made by hand."""

from __future__ import annotations

import math

from ampscope_server.findings.facts import FormatsSample
from ampscope_server.findings.recipe_fit import KeepReason, RecipeVerdict, verdicts
from ampscope_server.findings.thresholds import RECIPE_GRAD_MIN_SNR
from ampscope_server.store.format_packing import FORMAT_STATS, OPERAND_STATS, OPERANDS

NAMES = ["embed.weight", "embed.bias", "block.fc.weight", "block.fc.bias", "head.weight"]
LAYERS = (0, 2, 4)  # the modules' weights
UNDERFLOW, REL_RMSE, SCALE_MIN = 0, 2, 3


def _sample(step: int, cells: dict[tuple[int, int, int, int], float],
            recipes: tuple[str, ...] = ("fp8_tensorwise", "mxfp8"),
            base: float = 0.03) -> FormatsSample:
    """Every layer loses `base` relative error and nothing else, but where `cells` says
    otherwise: {(layer position, operand, recipe position, stat): value}."""
    values = []
    for k in range(len(LAYERS)):
        for o in range(len(OPERANDS)):
            for r in range(len(recipes)):
                for s in range(len(FORMAT_STATS)):
                    values.append(cells.get((k, o, r, s), base if s == REL_RMSE else 0.0))
    operands = [1.0] * (len(LAYERS) * len(OPERANDS) * len(OPERAND_STATS))
    return FormatsSample(step, recipes, LAYERS, values, operands)


GRAD = OPERANDS.index("grad_output")
INPUT = OPERANDS.index("input")


def test_a_healthy_run_fits_every_recipe() -> None:
    assert verdicts([_sample(0, {}), _sample(100, {})], NAMES) == [
        RecipeVerdict("fp8_tensorwise", 100, 3, (), 0.0), RecipeVerdict("mxfp8", 100, 3, (), 0.0)]
    assert verdicts([_sample(0, {})], NAMES)[1].summary == "mxfp8: all 3 layers fit"


def test_a_gradient_below_root_3_times_its_noise_stays_in_bf16() -> None:
    """rel_rmse 0.58 > 1/√3 (0.577...): the head's gradient is noise under MXFP8 only."""
    assert 0.58 * RECIPE_GRAD_MIN_SNR > 1 > 0.57 * RECIPE_GRAD_MIN_SNR
    noisy = {(2, GRAD, 1, REL_RMSE): 0.58, (1, GRAD, 1, REL_RMSE): 0.57,
             (2, GRAD, 1, SCALE_MIN): 0.3}
    fp8, mx = verdicts([_sample(0, noisy)], NAMES)
    assert fp8.keep == ()
    assert mx.keep == (("head.weight", KeepReason("grad_output", "rel_rmse", 0.58, math.nan,
                                                  0.3)),)
    assert mx.summary == "mxfp8: 1 of 3 layers need BF16 (head.weight)"


def test_a_layer_losing_4x_the_others_median_stays_in_bf16() -> None:
    """The middle layer's input underflows 12 % under MXFP8 where the others lose 0.2 and
    0.4 %: 4x the others' median (0.3 %) is 1.2 %. At 1 % it would pass: 1 % < 1.2 %."""
    cells = {(0, INPUT, 1, UNDERFLOW): 0.002, (2, INPUT, 1, UNDERFLOW): 0.004,
             (1, INPUT, 1, UNDERFLOW): 0.12, (1, INPUT, 1, SCALE_MIN): 0.3}
    _, mx = verdicts([_sample(0, cells)], NAMES)
    assert len(mx.keep) == 1
    name, reason = mx.keep[0]
    assert (name, reason.operand, reason.stat, reason.value, reason.scale_min_frac) == (
        "block.fc.weight", "input", "underflow_frac", 0.12, 0.3)
    assert reason.median == 0.003
    cells[1, INPUT, 1, UNDERFLOW] = 0.01
    assert verdicts([_sample(0, cells)], NAMES)[1].keep == ()


def test_below_the_floors_nothing_is_kept_however_far_from_the_others() -> None:
    """0.9 % underflow and 0.9 % error, against zero elsewhere: below the 1 % floors."""
    cells = {(1, INPUT, 0, UNDERFLOW): 0.009, (1, INPUT, 0, REL_RMSE): 0.009}
    assert verdicts([_sample(0, cells, base=0.0)], NAMES)[0].keep == ()


def test_one_bad_sample_of_three_decides_nothing() -> None:
    """The median of the last three samples: one unusual batch is outvoted; two are not."""
    bad = {(0, GRAD, 0, REL_RMSE): 0.9}
    once = [_sample(0, {}), _sample(100, bad), _sample(200, {})]
    assert verdicts(once, NAMES)[0].keep == ()
    twice = [_sample(0, {}), _sample(100, bad), _sample(200, bad)]
    assert [name for name, _ in verdicts(twice, NAMES)[0].keep] == ["embed.weight"]
    # Only the last three count: two bad ones before them are forgotten.
    assert verdicts([*twice[1:], _sample(300, {}), _sample(400, {}), _sample(500, {})],
                    NAMES)[0].keep == ()


def test_a_recipe_that_loses_the_gradients_everywhere_says_so() -> None:
    """Every layer's gradient flushes 23-30 % under MXFP4: no layer stands out, which the
    summary says beside the loss everywhere; 9 % is below RECIPE_UNIFORM_UNDERFLOW."""
    cells = {(k, GRAD, 1, UNDERFLOW): u for k, u in enumerate((0.23, 0.25, 0.30))}
    _, mx = verdicts([_sample(0, cells, recipes=("fp8_tensorwise", "mxfp4"))], NAMES)
    assert (mx.keep, mx.grad_underflow, mx.uniform_loss) == ((), 0.25, True)
    assert mx.summary == ("mxfp4: no layer stands out, but the median layer's gradient loses "
                          "25% of its values to zero")
    cells = {(k, GRAD, 1, UNDERFLOW): 0.09 for k in range(3)}
    _, fine = verdicts([_sample(0, cells)], NAMES)
    assert (fine.uniform_loss, fine.summary) == (False, "mxfp8: all 3 layers fit")


def test_not_measured_is_not_judged() -> None:
    """A layer whose gradient was never measured (NaN: no gradient flowed) is judged on its
    input and weight alone; the recipes of the latest sample are the ones judged."""
    cells = {(2, GRAD, r, s): math.nan for r in range(1) for s in range(len(FORMAT_STATS))}
    (only,) = verdicts([_sample(0, {}), _sample(100, cells, recipes=("nvfp4",))], NAMES)
    assert (only.recipe, only.measured, only.keep) == ("nvfp4", 3, ())
    assert verdicts([], NAMES) == []


# A run with two normalisation layers: rows 1 and 3 of its layer table are 1-D affine weights.
NORM_NAMES = ["fc.weight", "norm.weight", "head.weight", "final_norm.weight"]
NORMS = frozenset({1, 3})
WEIGHT, SATURATED = OPERANDS.index("weight"), FORMAT_STATS.index("saturated_frac")


def _with_norms(cells: dict[tuple[int, int, int, int], float]) -> FormatsSample:
    """Every cell 3 % error, nothing flushed, but where `cells` says otherwise; the norms' rows
    have their weight measured alone (input and output gradient NaN), as the hook sends them."""
    recipes = ("fp8_tensorwise", "mxfp8")
    values = []
    for k in range(4):
        for o in range(len(OPERANDS)):
            for r in range(len(recipes)):
                for s in range(len(FORMAT_STATS)):
                    unmeasured = k in NORMS and o != WEIGHT
                    default = math.nan if unmeasured else (0.03 if s == REL_RMSE else 0.0)
                    values.append(cells.get((k, o, r, s), default))
    operands = [1.0] * (4 * len(OPERANDS) * len(OPERAND_STATS))
    return FormatsSample(0, recipes, (0, 1, 2, 3), values, operands)


def test_norms_are_counted_apart_and_pass_when_they_lose_what_a_weight_does() -> None:
    for verdict in verdicts([_with_norms({})], NORM_NAMES, NORMS):
        assert (verdict.measured, verdict.keep, verdict.norms_measured, verdict.norms) == (
            2, (), 2, ())
    mx = verdicts([_with_norms({})], NORM_NAMES, NORMS)[1]
    assert mx.summary == "mxfp8: all 2 layers fit"
    # Without `norms` they would be judged as layers: the same four rows, all fitting.
    assert verdicts([_with_norms({})], NORM_NAMES)[1].measured == 4


def test_a_norm_gain_flushed_keeps_its_affine_weight_in_bf16() -> None:
    """Any flushed gain (a channel switched off), under that recipe only, beside the GEMM
    weights' median; a clamped gain (5 % of final_norm's) is judged by the error it makes."""
    cells = {(1, WEIGHT, 1, UNDERFLOW): 0.025, (1, WEIGHT, 1, SCALE_MIN): 0.5,
             (3, WEIGHT, 1, SATURATED): 0.05, (3, WEIGHT, 0, UNDERFLOW): 0.001,
             (0, WEIGHT, 1, UNDERFLOW): 0.008}
    fp8, mx = verdicts([_with_norms(cells)], NORM_NAMES, NORMS)
    assert fp8.norms == (
        ("final_norm.weight", KeepReason("weight", "underflow_frac", 0.001, 0.0, 0.0)),)
    assert mx.norms == (
        ("norm.weight", KeepReason("weight", "underflow_frac", 0.025, 0.004, 0.5)),)
    assert mx.keep == ()
    assert mx.summary == ("mxfp8: all 2 layers fit; quantised too, 1 of 2 norms' affine weights "
                          "need BF16 (norm.weight)")


def test_a_norms_error_counts_against_the_gemm_weights_alone() -> None:
    """The norms lose 13 % where the GEMM weights lose 3 and 13 %: 4x their median (8 %) is
    32 %, so no norm is kept; and the norms' 13 % do not make the GEMM weights' median, so
    fc.weight's 13 % is 4x head's 3 % and it is kept. A norm at 33 % is kept for its error."""
    cells = {(k, WEIGHT, 1, REL_RMSE): 0.13 for k in (0, 1, 3)}
    _, mx = verdicts([_with_norms(cells)], NORM_NAMES, NORMS)
    assert ([name for name, _ in mx.keep], mx.norms) == (["fc.weight"], ())
    cells[1, WEIGHT, 1, REL_RMSE] = 0.33
    _, mx = verdicts([_with_norms(cells)], NORM_NAMES, NORMS)
    assert mx.norms == (("norm.weight", KeepReason("weight", "rel_rmse", 0.33, 0.08, 0.0)),)
    # No GEMM weight measured: nothing to compare a norm's error with, so it is not judged.
    no_peers = {(k, WEIGHT, 1, s): math.nan for k in (0, 2) for s in range(len(FORMAT_STATS))}
    assert verdicts([_with_norms(no_peers | {(1, WEIGHT, 1, REL_RMSE): 0.9})], NORM_NAMES,
                    NORMS)[1].norms == ()
