"""Detector for distributed runs (wire v4): which rank went non-finite first.

Under DDP the gradients are averaged across ranks, so one rank's NaN reaches every rank's
update and every later step looks alike: the per-rank values of the *first* bad step are the
only place where the origin shows. When some ranks stayed finite there, the fault is in what
that rank alone saw (its batch: a NaN or inf in the inputs or labels, a degenerate sample), not
in the format's range, which every rank shares. When every rank went non-finite at once, no
rank is singled out and nothing is said here (the other detectors speak to the run's steps).
"""

from __future__ import annotations

import math

from ampscope_server.findings.model import Finding, RunData, is_nonfinite

LISTED = 8
"""Ranks named one by one in a title or explanation; past that, "and N more"."""


def _ranks_text(ranks: list[int]) -> str:
    """"rank 1", "ranks 0, 2 and 3", "ranks 0, 1, …, 7 and 56 more"."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > LISTED:
        return f"ranks {', '.join(map(str, ranks[:LISTED]))} and {len(ranks) - LISTED} more"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


def _what(loss: float | None, count: int | None) -> str:
    """What one rank showed: its loss when non-finite, its layers with NaN/inf gradients."""
    parts = []
    if is_nonfinite(loss):
        assert loss is not None
        parts.append(f"loss was {'NaN' if math.isnan(loss) else ('+inf' if loss > 0 else '-inf')}")
    if count:
        parts.append(f"gradients held NaN/inf in {count} layer{'s' if count != 1 else ''}")
    return " and its ".join(parts)


def rank_nonfinite(run: RunData) -> list[Finding]:
    """Error (a rank's loss was non-finite) or warning (only its gradients were): the first
    step where some, but not all, ranks of a distributed run went non-finite, and which."""
    first = run.first_rank
    if first is None or first.world_size <= 1 or not first.ranks:
        return []
    bad = list(first.ranks)
    finite = [rank for rank in range(len(first.loss)) if rank not in first.ranks]
    if not finite:
        return []
    loss_bad = any(is_nonfinite(first.loss[rank]) for rank in bad)
    details = "; ".join(f"rank {rank}'s {_what(first.loss[rank], first.nonfinite[rank])}"
                        for rank in bad[:LISTED])
    if len(bad) > LISTED:
        details += f"; and {len(bad) - LISTED} more ranks"
    were = "was" if len(finite) == 1 else "were"
    one = len(bad) == 1
    title = (f"{_ranks_text(bad).capitalize()} went non-finite first, at step {first.step}, "
             f"while {_ranks_text(finite)} {were} finite")
    explanation = (
        f"At step {first.step}, {details}, while {_ranks_text(finite)} {were} finite: the "
        "first step of the run where any rank's loss or gradients were non-finite. The ranks "
        "share the model, the format and the loss scale, so what differed is what "
        f"{'that rank' if one else 'those ranks'} computed on: "
        f"{'its' if one else 'their'} own batch. Gradients are averaged across ranks, so from "
        "here on every rank's update carries the NaN/inf and later steps no longer show where "
        "it came from.")
    whose = "that rank's batch" if one else "those ranks' batches"
    recommendation = (
        f"Inspect {whose} at step {first.step} (the shard of the data loader "
        f"{_ranks_text(bad)} read): NaN/inf in the inputs or labels, empty or degenerate "
        "samples, or a value that overflows only there. A smaller loss scale or another "
        "format will not help a fault that only some ranks see.")
    return [Finding(
        kind="rank_nonfinite", severity="error" if loss_bad else "warning", title=title,
        explanation=explanation, recommendation=recommendation, step_start=first.step,
        step_end=first.step,
        evidence={"world_size": first.world_size, "nonfinite_ranks": len(bad),
                  "first_rank": bad[0]},
    )]
