"""Canonical layer names: parameter names without the components that wrappers insert.

Wrappers rename parameters (DDP's ``module.``, ``torch.compile``'s ``_orig_mod.``, FSDP1's and
checkpointing's ``_fsdp_wrapped_module.``/``_checkpoint_wrapped_module.``), so wrapped and plain
runs would compare no layer. The canonical name drops wrapper components at the start of the
path, repeatedly, and the last three anywhere: whole components only, the last always kept
(``module`` inside a path is a user's attribute). Idempotent, pure; the server keeps a copy
(``ampscope_server.runs.layer_names``), checked against this one by a test.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

__all__ = ["canonical_name", "canonical_names"]

# Component names as torch spells them (torch.distributed.fsdp._common_utils.FSDP_WRAPPED_MODULE,
# torch.distributed.algorithms._checkpoint.checkpoint_wrapper._CHECKPOINT_WRAPPED_MODULE,
# torch._dynamo.eval_frame.OptimizedModule's `_orig_mod`), typed here: the hook must not import
# private torch modules that a CPU-only or older build may lack.
INNER_WRAPPERS = frozenset({"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"})
"""Removed wherever they appear in a path."""
LEADING_WRAPPERS = INNER_WRAPPERS | {"module"}
"""Removed from the start of a path."""


def canonical_name(raw: str) -> str:
    """``raw`` (a ``named_parameters()`` name) without wrapper components (module docstring)."""
    parts = raw.split(".")
    start = 0
    while start < len(parts) - 1 and parts[start] in LEADING_WRAPPERS:
        start += 1
    kept = [part for part in parts[start:-1] if part not in INNER_WRAPPERS]
    return ".".join([*kept, parts[-1]])


def canonical_names(raws: Sequence[str]) -> list[str]:
    """The canonical name of each of one model's parameters, except where two would get the same
    one: those keep their raw names, so no two layers of a run ever merge (distinct inputs give
    distinct outputs)."""
    canonical = [canonical_name(raw) for raw in raws]
    counts = Counter(canonical)
    return [name if counts[name] == 1 else raw for raw, name in zip(raws, canonical, strict=True)]
