"""Headless Chromium for the viewer's browser tests and `scripts/trace_screenshot.py`.

Uses Playwright for Python with the system Chromium (Debian package `chromium`), never a browser that
Playwright downloads. Neither is a runtime dependency of minfer: this module imports Playwright only
when called.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import MinferError

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
INSTALL_HINT = "apt-get install -y chromium && pip install playwright (do not run `playwright install`)"


def chromium_path() -> str:
    """The system Chromium executable; MinferError with the install commands when absent."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise MinferError(f"no system Chromium found; install it: {INSTALL_HINT}")


def launch(playwright):
    """Launch headless system Chromium through a started `sync_playwright()` instance."""
    return playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)


def screenshot_viewer(trace: str | Path, out_png: str | Path, query: str = "", size=(1500, 950)) -> Path:
    """Serve `trace`, open the viewer (with extra URL `query`, e.g. "&step=3&node=output"), save a PNG."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise MinferError(f"playwright is not installed; {INSTALL_HINT}") from None
    from .server import TraceServer

    out = Path(out_png)
    with TraceServer(trace) as server, sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page(viewport={"width": size[0], "height": size[1]})
            page.goto(server.url + query)
            page.wait_for_selector("body[data-loaded='1']", timeout=20_000)
            page.screenshot(path=str(out))
        finally:
            browser.close()
    return out
