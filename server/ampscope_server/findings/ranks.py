"""Detector for distributed runs (wire v4): which rank went non-finite first.

Under DDP the gradients are averaged across ranks, so one rank's NaN reaches every rank's
gradients and update at that same step, and every later step looks alike: the per-rank *losses*
of the first bad step (each rank's own forward) are the only place where the origin shows. When
some ranks' losses stayed finite there, the fault is in what that rank alone saw (its batch: a
NaN or inf in the inputs or labels, a degenerate sample), not in the format's range, which every
rank shares. When every rank's loss went non-finite at once, or only gradients did, no rank is
singled out and nothing is said here (the other detectors speak to the run's steps).
"""

from __future__ import annotations

import math

from ampscope_server.findings.facts import Finding, RunData, is_nonfinite

LISTED = 8
"""Ranks named one by one in a title or explanation; past that, "and N more"."""


def _ranks_text(ranks: list[int]) -> str:
    """"rank 1", "ranks 0, 2 and 3", "ranks 0, 1, …, 7 and 56 more"."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > LISTED:
        return f"ranks {', '.join(map(str, ranks[:LISTED]))} and {len(ranks) - LISTED} more"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


def rank_nonfinite(run: RunData) -> list[Finding]:
    """Error: the first step where some, but not all, ranks of a distributed run computed a
    non-finite loss, and which. Nothing when the losses stayed finite there: the gradients each
    rank reports are after the all-reduce, so ranks whose gradients differ hold different
    shards (FSDP) of the same average, not different data, and name no origin."""
    first = run.first_rank
    if first is None or first.world_size <= 1 or not first.ranks:
        return []
    bad = list(first.ranks)
    if not all(is_nonfinite(first.loss[rank]) for rank in bad):
        return []  # gradients only: no rank's own forward went non-finite
    finite = [rank for rank, loss in enumerate(first.loss)
              if loss is not None and math.isfinite(loss)]
    if not finite:
        return []
    details = ", ".join(f"rank {rank}'s loss was {_tag(first.loss[rank])}" for rank in bad[:LISTED])
    if len(bad) > LISTED:
        details += f", and {len(bad) - LISTED} more ranks' were too"
    spread = [rank for rank, count in enumerate(first.nonfinite) if count]
    reached = (f" The NaN/inf reached the gradients of {_ranks_text(spread)} through the "
               "all-reduce at that same step." if spread else "")
    one = len(bad) == 1
    title = (f"{_ranks_text(bad).capitalize()} went non-finite first, at step {first.step}, "
             f"while the loss{'' if len(finite) == 1 else 'es'} of {_ranks_text(finite)} "
             f"{'was' if len(finite) == 1 else 'were'} finite")
    explanation = (
        f"At step {first.step}, {details}, while {_ranks_text(finite)} computed a finite loss: "
        "the first step of the run where any rank's loss or gradients were non-finite."
        f"{reached} The ranks share the model, the format and the loss scale, so what "
        f"differed is what {'that rank' if one else 'those ranks'} computed on: "
        f"{'its' if one else 'their'} own batch. From here on every rank's update carries the "
        "NaN/inf, and later steps no longer show where it came from.")
    whose = "that rank's batch" if one else "those ranks' batches"
    recommendation = (
        f"Inspect {whose} at step {first.step} (the shard of the data loader "
        f"{_ranks_text(bad)} read): NaN/inf in the inputs or labels, empty or degenerate "
        "samples, or a value that overflows only there. A smaller loss scale or another "
        "format will not help a fault that only some ranks see.")
    return [Finding(
        kind="rank_nonfinite", severity="error", title=title,
        explanation=explanation, recommendation=recommendation, step_start=first.step,
        step_end=first.step,
        evidence={"world_size": first.world_size, "nonfinite_ranks": len(bad),
                  "first_rank": bad[0]},
    )]


def _tag(loss: float | None) -> str:
    assert loss is not None
    return "NaN" if math.isnan(loss) else ("+inf" if loss > 0 else "-inf")
