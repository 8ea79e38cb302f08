"""Debian's chromium driven by Playwright (its own browser download is not used).

Shared by the browser test and the screenshot command.
"""

from __future__ import annotations

import os
import shutil

# NOTE: without the background-networking flags chromium keeps reaching for update and
# sync services, which a closed network refuses, and logs errors for each.
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run")


def find_chromium() -> str | None:
    """`$SLICEGATE_CHROMIUM`, else `chromium` or `chromium-browser` on PATH, else None."""
    env = os.environ.get("SLICEGATE_CHROMIUM")
    if env:
        return env if os.path.exists(env) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")
