"""Real headless Chromium for the browser tests (Debian's, never a downloaded one): a page that
records console errors, uncaught exceptions and CSP violations, to assert none happened."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from playwright.sync_api import ConsoleMessage, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
RECORD_CSP = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(`${e.violatedDirective} blocked ${e.blockedURI || 'inline'}`);
});
"""


@dataclass
class Watched:
    page: Page
    errors: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        violations: list[str] = self.page.evaluate("() => window.__cspViolations || []")
        assert violations == [], "\n".join(violations)
        assert self.errors == [], "\n".join(self.errors)


@contextmanager
def chromium_page(width: int = 1440, height: int = 900) -> Iterator[Watched]:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            context.add_init_script(RECORD_CSP)
            watched = Watched(context.new_page())

            def on_console(msg: ConsoleMessage) -> None:
                if msg.type == "error":
                    watched.errors.append(f"console.error: {msg.text}")

            watched.page.on("console", on_console)
            watched.page.on("pageerror", lambda exc: watched.errors.append(f"uncaught: {exc}"))
            yield watched
        finally:
            browser.close()
