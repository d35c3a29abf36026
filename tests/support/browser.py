"""Real headless Chromium for the browser tests, once: Debian's /usr/bin/chromium (never a
downloaded browser), its flags, the init script that records CSP violations, and `Watched`, a
page that records console errors, uncaught exceptions and dialogs, to assert none happened.

The pytest fixtures (tests/e2e/conftest.py and tests/web/conftest.py import them):
- `chromium`: one Chromium launch per test module. Module scope, not session: playwright's sync
  API runs its own event loop on this thread and must not stay alive while another module (under
  xdist `--dist loadscope`, any module of the suite) runs asyncio on it.
- `watched`: a fresh browser context and page per test, watched. A module tunes it by overriding
  `viewport` (default 1440 x 900), `context_options` (e.g. `{"offline": True}`) or
  `console_expected` (console messages it expects, by substring: see test_pages_browser).
Modules that keep pages open across tests (a live run watched from its start) use
`open_watched` under their own module-scoped fixture.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Dialog,
    Page,
    ViewportSize,
    sync_playwright,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
"""Screenshots for a human to look at (`Watched.screenshot`, `artifact`)."""
WAIT_MS = 15_000
"""How long a page gets to show what a test waits for, unless the test says otherwise."""
RECORD_CSP = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(`${e.violatedDirective} blocked ${e.blockedURI || 'inline'}`
    + ` at ${e.sourceFile}:${e.lineNumber}:${e.columnNumber} ${e.sample || ''}`);
});
"""
"""Runs in every page before any of its scripts (through CDP, so the page's CSP does not apply
to it): a CSP violation is recorded even where the browser would not log it to the console."""


def artifact(name: str) -> Path:
    """The path of screenshot `name` under test-artifacts/ (created)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name


@dataclass
class Watched:
    """A page plus every console error, uncaught exception and dialog it produced; its CSP
    violations are read from the page itself (`RECORD_CSP`)."""

    page: Page
    errors: list[str] = field(default_factory=list)
    expected: tuple[str, ...] = ()
    """Console messages containing any of these are expected, not errors."""
    levels: tuple[str, ...] = ("error",)
    """The console message types that count as errors."""

    @property
    def context(self) -> BrowserContext:
        return self.page.context

    def violations(self) -> list[str]:
        found: list[str] | None = self.page.evaluate("() => window.__cspViolations ?? null")
        assert found is not None, "the page has no CSP recorder (RECORD_CSP did not run)"
        return found

    def assert_clean(self) -> None:
        """No console error, uncaught exception, dialog (alert/confirm/prompt) or CSP
        violation."""
        assert self.errors == [], "console errors:\n" + "\n".join(self.errors)
        violations = self.violations()
        assert violations == [], "CSP violations:\n" + "\n".join(violations)

    def js(self, expression: str, arg: Any = None) -> Any:
        """Evaluate a function expression in the page (strings would need 'unsafe-eval')."""
        return self.page.evaluate(expression, arg)

    def wait_for(self, predicate: str, timeout_ms: int = WAIT_MS, arg: Any = None) -> None:
        self.page.wait_for_function(predicate, arg=arg, timeout=timeout_ms)

    def screenshot(self, name: str, full_page: bool = True) -> Path:
        path = artifact(name)
        self.page.screenshot(path=str(path), full_page=full_page)
        return path

    def _on_console(self, msg: ConsoleMessage) -> None:
        if msg.type in self.levels and not any(e in msg.text for e in self.expected):
            url = msg.location.get("url", "")
            self.errors.append(f"console.{msg.type}: {msg.text}" + (f" ({url})" if url else ""))

    def _on_dialog(self, dialog: Dialog) -> None:
        self.errors.append(f"a {dialog.type} dialog fired: {dialog.message!r}")
        dialog.dismiss()


def watch(page: Page, expected: tuple[str, ...] = ()) -> Watched:
    """Start recording `page`'s console errors, uncaught exceptions and dialogs (its context
    must have `RECORD_CSP` for the CSP violations: `open_watched` does both)."""
    watched = Watched(page, expected=expected)
    page.on("console", watched._on_console)
    page.on("pageerror", lambda exc: watched.errors.append(f"uncaught: {exc}"))
    page.on("dialog", watched._on_dialog)
    return watched


@contextmanager
def launch() -> Iterator[Browser]:
    """Debian's headless Chromium under playwright's sync API, closed on exit."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def open_watched(
    browser: Browser, width: int = 1440, height: int = 900, expected: tuple[str, ...] = (),
    **context_options: Any,
) -> Iterator[Watched]:
    """A fresh context (`RECORD_CSP` in each of its pages) with one watched page; closed on
    exit. More pages of the same context: `watch(watched.context.new_page())`."""
    context = browser.new_context(viewport={"width": width, "height": height}, **context_options)
    try:
        context.add_init_script(RECORD_CSP)
        yield watch(context.new_page(), expected)
    finally:
        context.close()


# --- fixtures (imported by tests/e2e/conftest.py and tests/web/conftest.py) --------------------

@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """One Chromium for the module's tests (each gets its own context: `watched`)."""
    with launch() as browser:
        yield browser


@pytest.fixture
def viewport() -> ViewportSize:
    """The page's size; a module overrides this fixture for another."""
    return {"width": 1440, "height": 900}


@pytest.fixture
def context_options() -> dict[str, Any]:
    """More `Browser.new_context` options (e.g. `{"offline": True}`); a module overrides it."""
    return {}


@pytest.fixture
def console_expected() -> tuple[str, ...]:
    """Console messages (substrings) the module's pages log on purpose; a module overrides it."""
    return ()


@pytest.fixture
def watched(
    chromium: Browser, viewport: ViewportSize, context_options: dict[str, Any],
    console_expected: tuple[str, ...],
) -> Iterator[Watched]:
    """A fresh context and page in the module's Chromium, watched; closed after the test."""
    with open_watched(chromium, viewport["width"], viewport["height"], console_expected,
                      **context_options) as fresh:
        yield fresh

