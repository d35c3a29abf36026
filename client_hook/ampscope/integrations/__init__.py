"""Framework integrations: each a module importing its framework, never imported by ``ampscope``
itself (the hook needs only torch).

- ``ampscope.integrations.lightning.AmpscopeCallback``: a Lightning ``Callback``;
- ``ampscope.integrations.transformers.AmpscopeCallback`` and ``attach``: a Hugging Face
  ``TrainerCallback``.
"""
