"""/admin/ui in Debian's chromium (Playwright), against a real tiny-model server under load."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, sync_playwright

from gateway.ui.browser import CHROMIUM_ARGS, find_chromium
from tests.gateway.batches.helpers import auth, jsonl, line
from tests.gateway.batches.server import ServerProcess

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary "
                                "(./slicegate.sh test installs Debian's chromium)")


def _load(url: str, stop: threading.Event) -> None:
    """An interactive tenant's short chats, and a batch of 200 lines running beside them."""
    with httpx.Client(base_url=url, timeout=60) as client:
        file_id = client.post("/v1/files", headers=auth("sk-nightly-1"), data={
            "purpose": "batch"}, files={"file": ("in.jsonl", jsonl(
                [line(i, max_tokens=64, ignore_eos=True) for i in range(200)]))}).json()["id"]
        client.post("/v1/batches", headers=auth("sk-nightly-1"), json={
            "input_file_id": file_id, "endpoint": "/v1/chat/completions",
            "completion_window": "24h"})
        i = 0
        while not stop.is_set():
            client.post("/v1/chat/completions", headers=auth("sk-ide-1"), json={
                "max_tokens": 8, "messages": [{"role": "user", "content": f"hi {i}"}]})
            i += 1
            stop.wait(0.1)


@pytest.fixture
def loaded_server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "srv").start()
    stop = threading.Event()
    load = threading.Thread(target=_load, args=(server.url, stop), daemon=True)
    load.start()
    try:
        yield server
    finally:
        stop.set()
        load.join(timeout=30)
        server.close()


def _wait(page: Page, condition: str, timeout_s: float) -> Any:
    page.wait_for_function(condition, timeout=timeout_s * 1000)
    return page.evaluate("window.slicegate")


def test_admin_page_draws_a_moving_timeline_without_console_errors(
        loaded_server: ServerProcess) -> None:
    devices = [d["device"] for d in httpx.get(f"{loaded_server.url}/admin/gmg", headers=auth(
        "sk-admin-1")).json()["devices"]]
    assert len(devices) == 2
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{loaded_server.url}/admin/ui#key=sk-admin-1")
        every = " && ".join(f"(window.slicegate.counts[{d!r}] || 0) > 0" for d in devices)
        seen = _wait(page, every, 20)
        assert set(seen["counts"]) == set(devices)
        last_end, renders = seen["lastEnd"], seen["renders"]
        started = time.monotonic()
        moved = _wait(page, f"window.slicegate.lastEnd > {last_end} && "
                            f"window.slicegate.renders > {renders}", 2)
        assert time.monotonic() - started <= 2.0 and moved["polls"] > seen["polls"]
        box = page.locator("#gantt").bounding_box()
        assert moved["sampleBar"] is not None and box is not None
        tip = page.locator("#tip")
        for _ in range(10):  # NOTE: bars move as the timeline scrolls: aim at a fresh one
            bar = page.evaluate("window.slicegate.sampleBar")
            page.mouse.move(box["x"] + bar["x"], box["y"] + bar["y"])
            if tip.is_visible():
                break
            page.wait_for_timeout(300)
        tip.wait_for(state="visible", timeout=2000)
        assert "class " in tip.inner_text() and "tenant " in tip.inner_text()
        assert "live" in page.locator("#status").inner_text()
        _wait(page, "document.querySelectorAll('#batches .batch').length > 0", 5)
        assert errors == [], errors
        refused = browser.new_page()
        refused.goto(f"{loaded_server.url}/admin/ui#key=sk-ide-1")  # a tenant's key
        refused.locator("#keyform").wait_for(state="visible", timeout=5000)
        browser.close()
