"""Canonical layer names: parameter names without the components that wrappers insert.

Wrapping a model renames its parameters: ``DistributedDataParallel``/``DataParallel`` prefix
``module.``, ``torch.compile`` prefixes ``_orig_mod.``, FSDP1 inserts ``_fsdp_wrapped_module.``
and activation checkpointing ``_checkpoint_wrapped_module.`` in front of each wrapped
submodule's parameters. The same model then has other names wrapped and plain, and runs compared
by name (``/api/compare``) would match no layer. The canonical name drops those components:

- any wrapper component, ``module`` included, at the start of the path, repeatedly
  (``_orig_mod.module.fc.weight`` → ``fc.weight``);
- ``_orig_mod``, ``_fsdp_wrapped_module`` and ``_checkpoint_wrapped_module`` anywhere inside it
  (``layers.0._checkpoint_wrapped_module.attn.weight`` → ``layers.0.attn.weight``).

Only whole dotted components go, never substrings (``my_module.weight`` stays). ``module`` is
stripped only at the start: inside a path it is an ordinary attribute name in user models
(``self.module = ...``), and DDP wraps whole models, not submodules. The last component is the
parameter's own name and always stays. The function is idempotent (a canonical name is its own
canonical name).

This is the server's copy of the hook's ``ampscope.names`` (the server never imports the hook
nor torch); a test checks that both give the same result on a shared list of cases. The server
matches layers across runs by these names (``compare.reads``, the baseline finding), and
canonicalises stored names itself because runs stored before the hook sent canonical names
carry raw ones. Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

__all__ = ["canonical_name", "canonical_names"]

# Component names as torch spells them (see the hook's copy for where torch defines them).
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
    """The canonical name of each of one model's parameters, except where two of them would get
    the same one (a top-level ``weight`` beside a child called ``module`` holding another): those
    keep their raw names, so that no two layers of a run ever merge into one.

    Distinct inputs give distinct outputs: the canonical names kept are unique, and a raw name
    kept either is canonical (one per collision at most) or equals no canonical name at all.
    """
    canonical = [canonical_name(raw) for raw in raws]
    counts = Counter(canonical)
    return [name if counts[name] == 1 else raw for raw, name in zip(raws, canonical, strict=True)]
