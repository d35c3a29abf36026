"""Named thresholds of the detectors, each with the reason for its value.

They come from how `torch.amp.GradScaler` behaves with its defaults (init_scale 2^16,
growth_factor 2, backoff_factor 0.5, growth_interval 2000), from the PyTorch AMP documentation,
from Micikevicius et al., "Mixed Precision Training" (ICLR 2018) and from the IEEE formats
themselves. None is fitted to a test or a scenario.
"""

from __future__ import annotations

# --- calibration and probing -------------------------------------------------------------------
CALIBRATION_GAP_STEPS = 2
"""Skips at most this many steps apart count as one descent from init_scale. The gradients do not
change in a step or two, so while the scale is too high every step overflows: the descent is a
run of back-to-back skips (one clean step in between is tolerated, as data varies)."""
CALIBRATION_START_STEPS = 2
"""The descent must start within this many steps of the run's first step to be calibration."""
TUNING_MIN_SKIPS = 3
"""Scaler advice is given from 3 avoidable skips on: one or two are noise not worth a knob."""
TUNING_INTERVAL_FACTOR = 2.5
"""Proposed growth_interval = observed interval x 2.5 (2000 → 5000): probes happen 2.5x less
often, so ~60 % of the probe skips go, while the scale still recovers within a few thousand
steps if the gradients shrink (the reason GradScaler grows at all)."""

# --- storms ------------------------------------------------------------------------------------
STORM_WINDOW_STEPS = 100
"""Window of the skip rate. At GradScaler's equilibrium a run skips about one step per
growth_interval (2000 by default: 0.05 %), so a 100-step window holds at most one such skip."""
STORM_MIN_SKIPS = 5
"""Skips (calibration and probes excluded) in one window that make a storm: 5 % of the window's
steps, 100x the equilibrium rate. GradScaler's docstring: after the first few calibration
iterations "step skipping should occur rarely (once every few hundred or thousand
iterations)"; five halvings within 100 steps (a factor 32) means the scaler is not finding a
stable scale."""

# --- precision-sensitive layers (findings/precision.py) -----------------------------------------
SHADOW_REL_ERR_WARN = 0.1
"""A layer whose median FP32 shadow rel_err (`||g_amp - g_fp32|| / ||g_fp32||`) over the recent
shadow steps is 10 % or more computes a gradient the low-precision format gets materially
wrong: keep it in FP32 (or BF16, whose range FP16 lacks)."""
SHADOW_COHERENT_COSINE = 0.9
"""A layer below SHADOW_NEGLIGIBLE_NORM_FRAC at its shadow steps is still judged there when the
median cosine of its AMP and FP32 gradients over those steps is 0.9 or more: a small but real
gradient keeps its direction in the low-precision step (inputs of 5e-8, subnormal in FP16:
norm 1e-7 of the largest layer's, cosine 0.93-0.99, rel_err 0.25), where rounding noise has
none (the conv biases before BatchNorm in `healthy_cnn_bn`: norm 3-4e-8, cosines -0.74 to
0.87, median about 0.3)."""
SHADOW_NEGLIGIBLE_NORM_FRAC = 1e-3
"""A layer is judged at a shadow step only where its FP32 gradient norm is at least 1e-3 of the
largest layer's at that step. Below it the gradient does not matter for the update and its
rel_err measures nothing: a layer whose true gradient is 0 (a bias followed by BatchNorm, whose
mean subtraction cancels it exactly) has an FP32 norm of rounding noise, so any AMP difference
is a "huge" rel_err. 1e-3 is about twice FP16's unit roundoff 2^-11: the AMP backward rounds the
values it carries, of the size of the largest gradients, to that relative precision, so a whole
gradient smaller than it is within the format's own rounding of the rest of the model. Of the
largest layer's norm, not the total's: the total grows with the number of layers (up to sqrt(L)
x the largest), so a deep model would leave out layers a shallow one judges; the largest layer
is the scale of the update at any depth."""

# --- divergence (findings/divergence.py) -------------------------------------------------------
DIVERGENCE_LOSS_FACTOR = 100.0
"""A loss (the run's own, or its FP32 re-check's) 100x the run's healthy loss is the training
diverging, whatever the precision: the learning rate, not the format. Ordinary training noise
moves a loss by a few x, never two orders of magnitude; a loss that the format's range alone
makes non-finite stays at the run's magnitude in FP32."""
DIVERGENCE_NORM_FACTOR = 1e4
"""A gradient norm of a taken step 10^4 x the run's healthy one: four orders of magnitude, far
beyond the growth of a healthy run's norm (a few x to ~100x out of initialisation or warm-up)."""
HEALTHY_STEPS = 5
"""The run's healthy loss (and gradient norm) is the median of its first 5 finite values: a
single odd first batch does not set it, and a divergence that takes off within 5 steps still
leaves it at the run's starting magnitude (the median of 5 needs 3 of them large)."""
EDGE_STEPS = 32
"""Steps read at each end of the run (`findings.reads`): the first HEALTHY_STEPS finite values
are among the first 32 steps unless the run overflowed from the start, and the last 32 are
where the run is now."""

# --- scale collapse ----------------------------------------------------------------------------
COLLAPSE_SCALE = 1.0
"""At or below 1 loss scaling no longer lifts anything: the unscaled gradients themselves
overflow the format (e.g. a model trained in BF16 run in FP16). DeepSpeed and Megatron use 1
as their default `min_loss_scale` floor for the same reason."""
COLLAPSE_WARN_SCALE = 2.0**7
"""Warn below 2^7 = 128 (9 halvings below the default init_scale 2^16), and only while the scale
is falling: a low scale is not wrong by itself (Micikevicius et al. 2018 trained SSD with a
constant scale of 8), a scale still falling toward 1 is. With FP16's min subnormal 2^-24, a
scale of 2^7 already flushes every gradient value below 2^-31 (about 4.7e-10)."""
COLLAPSE_TREND_HALVINGS = 4
"""…and only if the scale fell by a net 2^4 over the latter half of the run: a trend (more
backoffs than growths can undo), not one backoff."""

# --- NaN vs range -----------------------------------------------------------------------------
AMPLE_HEADROOM_BITS = 8.0
"""A layer 8 doublings (256x) below the format's max just before the NaN did not overflow from
one step's gradient change: the NaN comes from the data or the computation."""
NAN_PERSIST_HALVINGS = 4
"""NaN still appearing after the scaler backed off 4 times (16x) since the first NaN: an ordinary
range overflow (a gradient spike of a few x) would have been cured by then. A warning only: a
gradient explosion of many orders of magnitude persists too; the FP32 re-check decides."""
MODERATE_SCALE = 2.0**16
"""A scale at or below GradScaler's default init_scale (2^16) counts as moderate."""

# --- underflow ---------------------------------------------------------------------------------
UNDERFLOW_LOST_FRAC = 0.25
"""A layer losing a quarter of its gradient (zeros + values that flush) at the current scale.
A dense layer's weight gradient is almost never exactly zero in FP32, so a loss this large is
the format's doing (Micikevicius et al. 2018, §3.2: with unscaled FP16 gradients the values
flushed to zero made SSD training diverge); structural zeros are excluded by module type
(embeddings)."""
UNDERFLOW_RECENT_SAMPLES = 5
"""The judgement uses the median over the last 5 layer-stat steps, so one odd batch does not
trigger it."""
HEADROOM_MARGIN_BITS = 1
"""Keep one doubling of headroom when proposing a higher scale: a backoff halves the scale, so
a scale one doubling below overflow survives an ordinary gradient spike."""
SPARSE_MODULE_TYPES = ("Embedding", "EmbeddingBag")
"""Modules whose gradients are row-sparse by construction: their zeros are not underflow."""

# --- swallowed updates -------------------------------------------------------------------------
LOW_PRECISION_PARAM_DTYPES = {"float16": 10, "half": 10}
"""Parameter dtypes (→ mantissa bits) whose updates can be rounded away: FP16 parameters hold
10 mantissa bits, so an update below half a unit in the last place, |w|·2^-11, vanishes.
BF16 parameters (7 bits) are not judged: BF16 is the range format and its users keep FP32
masters by construction in every framework's BF16 mode; a bf16 model is a deliberate choice."""
SWALLOWED_FRAC_WARN = 0.5
"""Measured (wire v3): when most of a layer's elements that had a gradient did not move in the
optimizer step, the layer is not training; below half it is partial rounding, which FP16
training without masters always has a little of."""

# --- misuse ------------------------------------------------------------------------------------
LR_SKIP_WARN_FRACTION = 0.01
"""An LR scheduler stepping on skipped steps shortens the schedule by one step each: worth a
warning once 1 % of the schedule went by without training, else it is noted as info."""

# --- baseline ----------------------------------------------------------------------------------
BASELINE_TOLERANCE = 0.05
"""Relative departure from the baseline that counts as divergence: the compare page's default
tolerance (GET /api/compare), so the finding and the page agree on the step."""
BASELINE_MAX_LAYERS = 5

# --- honest "lost" numbers (findings/lost.py) ---------------------------------------------------
UNDERFLOW_EXIT_FRAC = 0.15
"""Hysteresis: a layer flagged for underflow stays flagged until its median lost share falls
below 15 %, clearly under the 25 % that flags it. A median hovering at the threshold (batches
vary by a few points) then cannot make the finding come and go."""
PRIMARY_MARGIN = 0.10
"""The layer an underflow finding names first stays first while its median lost share is within
10 points of the most lost layer's: two layers a few points apart (batches vary by that much)
would otherwise swap the name in the title from one analysis to the next."""
SWALLOWED_EXIT_FRAC = 0.35
"""Hysteresis of the measured swallowed fraction: flagged from 50 %, kept down to 35 %."""
FLOOR_PRESSURE_FRAC = 0.05
"""Exact zeros count as lost to the format when at least 5 % of the layer's *non-zero* values
are subnormal at the current scale: the distribution then reaches the format's floor, and its
zeros are most plausibly the part that fell through (flushed upstream in an FP16 activation
gradient, then copied into the FP32 master gradient as 0). Zeros beside values all well above
the floor are a gap in the distribution, not its tail: a dead ReLU unit, an unused embedding
row (structural). 5 % because a healthy layer under dynamic loss scaling has next to no
subnormal values (the scaler grows the scale until the next overflow)."""

# --- stability (findings/stability.py) -----------------------------------------------------------
HOLD_STEPS = 200
"""A finding the detectors no longer raise stays shown (marked as no longer seen) until it has
been absent for 200 steps: several live analyses even at the demo's 20 steps a second, at least
20 layer-stat steps at the default cadence. A value near its threshold cannot make it blink."""

# --- activation outliers (findings/outliers.py) ------------------------------------------------
OUTLIER_SAMPLES = 3
"""Early and recent are the medians of the run's first and last three formats samples: one
unusual batch at either end does not make a trend."""
OUTLIER_AMAX_GROWTH = 8.0
"""Three binades of growth in a layer's largest input value: the eight healthy models of
issue #30 grow theirs at most 1.8-fold over their runs (docs/findings.md)."""
OUTLIER_KURTOSIS = 30.0
"""A kurtosis of 30, ten times a Gaussian's 3: a few values far from the rest (the healthy
models' inputs stay at 2 to 8)."""
OUTLIER_KURTOSIS_GROWTH = 2.0
"""And twice what it was early: a tail that was there from the start is the data's."""

# --- recipe fit (findings/recipe_fit.py) --------------------------------------------------------
RECIPE_GRAD_MIN_SNR = 3**0.5
"""A gradient whose norm is below √3 times its quantisation noise's (rel_rmse above 1/√3) stops
being useful for training (arXiv 2505.19115): the layer's backward stays in BF16."""
RECIPE_OUTLIER_FACTOR = 4.0
"""An operand that loses 4x what the median of the run's other layers loses under the same recipe
(error or underflow) is what that recipe gets wrong in this layer, not what the format costs
every layer: two binades of extra error, well beyond the spread of a format's error over
Gaussian-like operands (which depends on the block size, not the layer)."""
RECIPE_ERROR_FLOOR = 0.05
"""Below 5 % relative error no layer is kept back for its error, however small the others'
is: E4M3's own rounding of an operand whose mantissas spread evenly is 2^-3 / (2·√3) ≈ 3.6 %
RMS, and a layer whose values happen to sit on the grid (small integers, a sparse input)
makes the others' median far smaller than that without the recipe doing the others harm."""
RECIPE_UNDERFLOW_FLOOR = 0.01
"""Below 1 % of an operand's elements flushed to zero no layer is kept back for underflow."""
RECIPE_UNIFORM_UNDERFLOW = 0.15
"""A recipe under which the median layer's output gradient loses 15 % of its values to zero
loses them everywhere, which the per-layer comparison cannot see: the verdict says so rather
than "fits". Below it is what FP4 costs any gradient: E2M1's least subnormal is a twelfth of
its max, so a Gaussian block flushes about 6 % under NVFP4 (its E4M3 scale maps the amax near
6) and 10-12 % under MXFP4 (the power-of-two scale maps it anywhere in (3, 6]); the five
healthy scenarios' median layers lose 0.05-7 %."""
RECIPE_RECENT_SAMPLES = 3
"""A verdict is the median of the last three samples (300 steps at the default cadence): one
unusual batch does not decide it, a trend of a few hundred steps does."""
