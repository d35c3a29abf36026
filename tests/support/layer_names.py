"""Layer names and their canonical forms, for the hook's `ampscope.names` and the server's copy
`ampscope_server.runs.layer_names`: both are tested on these same cases, so the two cannot drift."""

from __future__ import annotations

CASES: list[tuple[str, str]] = [
    # Plain names stay as they are.
    ("fc1.weight", "fc1.weight"),
    ("weight", "weight"),
    ("layers.0.attn.q_proj.weight", "layers.0.attn.q_proj.weight"),
    # One wrapper in front: DDP / DataParallel, torch.compile, FSDP1, checkpointing.
    ("module.fc1.weight", "fc1.weight"),
    ("_orig_mod.fc1.weight", "fc1.weight"),
    ("_fsdp_wrapped_module.fc1.weight", "fc1.weight"),
    ("_checkpoint_wrapped_module.fc1.weight", "fc1.weight"),
    # Nested and repeated, in front and inside.
    ("_orig_mod.module.layers.0._checkpoint_wrapped_module.attn.weight", "layers.0.attn.weight"),
    ("module._orig_mod.fc1.weight", "fc1.weight"),
    ("module.module.fc1.weight", "fc1.weight"),
    ("_fsdp_wrapped_module.layers.0._fsdp_wrapped_module._checkpoint_wrapped_module.mlp.bias",
     "layers.0.mlp.bias"),
    ("layers.0._orig_mod.attn.weight", "layers.0.attn.weight"),
    ("enc._checkpoint_wrapped_module._checkpoint_wrapped_module.w", "enc.w"),
    # `module` inside a path is a user's attribute name: it stays.
    ("encoder.module.weight", "encoder.module.weight"),
    ("_orig_mod.encoder.module.weight", "encoder.module.weight"),
    # Whole components only, never substrings.
    ("my_module.weight", "my_module.weight"),
    ("module_list.0.weight", "module_list.0.weight"),
    ("modules.0.weight", "modules.0.weight"),
    ("x._orig_mod_copy.weight", "x._orig_mod_copy.weight"),
    ("x.orig_mod.weight", "x.orig_mod.weight"),
    ("_fsdp_wrapped_module_extra.weight", "_fsdp_wrapped_module_extra.weight"),
    # The last component is the parameter's own name: never removed.
    ("module", "module"),
    ("_orig_mod", "_orig_mod"),
    ("module.module", "module"),
    ("x._orig_mod", "x._orig_mod"),
    ("_fsdp_wrapped_module._flat_param", "_flat_param"),
    # Not parameter names, but stored strings the server may hold: no crash, nothing invented.
    ("", ""),
    ("a..b", "a..b"),
    (".weight", ".weight"),
    ("module.", ""),
]

COLLIDING: list[tuple[list[str], list[str]]] = [
    # No collision: every name canonical.
    (["module.fc1.weight", "module.fc1.bias"], ["fc1.weight", "fc1.bias"]),
    # A top-level `weight` beside a child called `module` holding a `weight`: both keep their
    # raw names, the others still become canonical.
    (["module.weight", "weight", "module.fc.bias"], ["module.weight", "weight", "fc.bias"]),
    (["_orig_mod.module.weight", "_orig_mod.weight"], ["_orig_mod.module.weight",
                                                       "_orig_mod.weight"]),
    ([], []),
]
