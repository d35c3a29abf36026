"""Per-layer statistics as a real model's hook would compute them, for the ingest benches.

Every value is drawn, not constant, so compression and decoding see what a run carries: a layer
table with a ResNet/Transformer mix of sizes, amax log-normal over ~13 decades, amin_nz and l2
derived from it with noise, fractions that are exact counts over the layer's numel (as the hook's
`count / numel` in float64 makes them): zero_frac non-zero for a third of the layers (ReLU and
embedding gradients), subnormal_frac always, underflow_frac for a fifth, NaN/inf counts rare.
`worst` draws every fraction non-zero, the case that compresses least.
"""

from __future__ import annotations

import math
import random
from typing import Any

NUMELS = (64, 256, 512, 2048, 4096, 16_384, 65_536, 262_144, 589_824, 1_048_576, 2_359_296)


def layer_table(layers: int, seed: int = 0) -> list[dict[str, Any]]:
    """The wire's layer table: name, shape, dtype, numel, module type."""
    rng = random.Random(seed)
    table = []
    for index in range(layers):
        numel = rng.choice(NUMELS)
        table.append({"index": index, "name": f"blocks.{index // 4}.layer{index % 4}.weight",
                      "shape": [numel], "dtype": "float32", "numel": numel,
                      "module_type": "Linear" if index % 3 else "Conv2d"})
    return table


def stats(rng: random.Random, numels: list[int], worst: bool = False) -> dict[str, list[float]]:
    """One step's statistics per layer as the hook computes them (NaN amax = no finite element)."""
    amax = [rng.lognormvariate(-6.0, 5.0) for _ in numels]
    zero, sub, under = [], [], []
    for index, numel in enumerate(numels):
        zero.append(rng.randrange(1, numel) / numel if worst or index % 3 == 0 else 0.0)
        sub.append(rng.randrange(1, max(2, numel // 50)) / numel)
        under.append(rng.randrange(1, max(2, numel // 500)) / numel
                     if worst or index % 5 == 0 else 0.0)
    nonfinite = rng.random() < 0.01
    return {
        "amax": amax,
        "amin_nz": [a * rng.random() * 1e-5 for a in amax],
        "zero_frac": zero, "subnormal_frac": sub, "underflow_frac": under,
        "nan_count": [rng.randrange(numel) if nonfinite and i == 0 else 0
                      for i, numel in enumerate(numels)],
        "inf_count": [0] * len(numels),
        "l2": [a * math.sqrt(numel) * rng.uniform(0.05, 0.5) for a, numel in zip(amax, numels,
                                                                                 strict=True)],
    }


def varied(rng: random.Random, pool_stats: dict[str, list[float]]) -> dict[str, list[float]]:
    """A pooled step's statistics with amax, amin_nz and l2 scaled by a fresh factor per layer,
    so a bucket's worst values keep moving as a real run's do (a cycled pool would stop them
    once a bucket has seen the whole pool, and flatter the rollups)."""
    factors = [rng.lognormvariate(0.0, 0.5) for _ in pool_stats["amax"]]
    out = dict(pool_stats)
    for name in ("amax", "amin_nz", "l2"):
        out[name] = [v * f for v, f in zip(pool_stats[name], factors, strict=True)]
    return out
