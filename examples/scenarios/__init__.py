"""Failure scenarios: small CPU training scripts, each reproducing one known AMP problem with real
autocast, a real ``GradScaler`` and a real ``ampscope.watch`` hook (issue #5).

Run one as ``python examples/scenarios/NAME.py --server URL`` (or without ``--server`` to run
offline and print what the hook recorded). Each module exposes ``run(server=..., sender=...)``
for the tests (``tests/scenarios/``) and ``build()``, the training it runs (``common.Scenario``).
"""
