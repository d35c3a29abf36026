"""The browser tests' fixtures (tests/support/browser.py): `chromium`, one launch per module;
`watched`, a fresh watched page per test, shaped by `viewport`, `context_options` and
`console_expected`, which a module may override."""

from tests.support.browser import chromium, console_expected, context_options, viewport, watched

__all__ = ["chromium", "console_expected", "context_options", "viewport", "watched"]
