"""The one place that finds the Chrome / Chromium that image exports (kaleido), the browser tests
and scripts/measure_app.py (Playwright) drive. Nothing here downloads a browser.

    find_browser()      the executable, or None
    missing_reason()    None, or the one line that says why there is none and how to get one
    require_browser()   the executable, or BrowserMissing (a ValueError) with that line

BROWSER_PATH, when set, names the browser and nothing else is searched (as kaleido's own search,
choreographer, does: BROWSER_PATH=/nonexistent means "no browser"); otherwise the first of
BROWSER_NAMES found on PATH. Callers pass the path on (kaleido's `path`, Playwright's
`executable_path`), so every layer uses the browser found here.
"""

from __future__ import annotations

import os
import shutil

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
INSTALL_HINT = "install one with `apt-get install -y chromium` or set BROWSER_PATH to a Chrome/Chromium executable"


class BrowserMissing(ValueError):
    """No Chrome / Chromium to drive; the message is one line saying how to get one."""


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_browser() -> str | None:
    """The Chrome / Chromium executable to drive, or None (BROWSER_PATH if set, else PATH)."""
    named = os.environ.get("BROWSER_PATH")
    if named:
        return os.path.realpath(named) if _executable(named) else None
    for name in BROWSER_NAMES:
        found = shutil.which(name)
        if found and _executable(found):
            return found
    return None


def missing_reason(what: str = "this needs Chrome or Chromium") -> str | None:
    """None when a browser is found, else one line: `what`, why none was found, how to get one."""
    if find_browser() is not None:
        return None
    named = os.environ.get("BROWSER_PATH")
    why = (f"BROWSER_PATH={named!r} is not an executable file" if named
           else f"none of {', '.join(BROWSER_NAMES)} is on PATH")
    return f"{what}, but no browser was found ({why}): {INSTALL_HINT}"


def require_browser(what: str = "this needs Chrome or Chromium") -> str:
    """The browser's path; BrowserMissing (one line) when there is none."""
    path = find_browser()
    if path is None:
        raise BrowserMissing(missing_reason(what))
    return path
