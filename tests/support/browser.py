"""Headless Chromium for the web UI tests: Playwright driving Debian's system browser.

`chromium_page()` skips the test, naming why, when Playwright or /usr/bin/chromium is missing
(`make test` installs the browser when it can: bin/ensure-test-packages). Every page the tests open
records its console errors and failed requests, so a test can assert there were none.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

CHROMIUM = os.environ.get("ELASTANE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def skip_reason() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    try:
        import playwright.sync_api  # noqa: F401, PLC0415 - optional test dependency
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (apt-get install -y chromium; `make test` does it as root)"
    return None


class ErrorLog:
    """The console errors, page errors and failed requests of the pages of one browser."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def watch(self, page: Any) -> Any:
        page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url} {r.failure}"))
        return page


@contextmanager
def chromium_page() -> Iterator[tuple[Any, ErrorLog]]:
    """A fresh headless Chromium (own user-data dir) and one page in it, with its error log."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 - optional test dependency

    profile = tempfile.mkdtemp(prefix="elastane-chromium-")
    try:
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                        args=CHROMIUM_ARGS)
            try:
                log = ErrorLog()
                page = log.watch(ctx.pages[0] if ctx.pages else ctx.new_page())
                page.set_default_timeout(30_000)
                yield page, log
            finally:
                ctx.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
