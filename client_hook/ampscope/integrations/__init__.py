"""Framework integrations: each a module importing its framework, never imported by ``ampscope``
itself (the hook needs only torch).

- ``ampscope.integrations.lightning.AmpscopeCallback``: a Lightning ``Callback``.
"""
