"""`python -m gateway.ui.screenshot`: the admin page of a running server, under load, as a PNG.

While it waits it keeps the server busy itself: an interactive tenant sends
short streamed chats and a batch tenant's batch of chat lines runs, so every
panel has something to show.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Sequence

import httpx
import orjson

from gateway.ui.browser import CHROMIUM_ARGS, find_chromium


def _interactive(url: str, key: str, stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        i = 0
        while not stop.is_set():
            body = {"max_tokens": 16, "messages": [
                {"role": "user", "content": f"Give me one fact about the number {i}."}]}
            client.post("/v1/chat/completions", json=body,
                        headers={"Authorization": f"Bearer {key}"})
            i += 1
            stop.wait(0.3)


def _submit_batch(url: str, key: str, lines: int, max_tokens: int) -> str:
    rows = [{"custom_id": f"shot-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"max_tokens": max_tokens, "messages": [
                 {"role": "user", "content": f"Write a short note about topic {i}."}]}}
            for i in range(lines)]
    data = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, timeout=60) as client:
        file = client.post("/v1/files", headers=auth, data={"purpose": "batch"},
                           files={"file": ("screenshot.jsonl", data)})
        file.raise_for_status()
        batch = client.post("/v1/batches", headers=auth, json={
            "input_file_id": file.json()["id"], "endpoint": "/v1/chat/completions",
            "completion_window": "24h"})
        batch.raise_for_status()
        return str(batch.json()["id"])


def take(url: str, admin_key: str, out: str, wait_s: float, width: int = 1400) -> None:
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("error: no chromium binary (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=list(CHROMIUM_ARGS))
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(f"{url}/admin/ui#key={admin_key}")
        time.sleep(wait_s)
        page.screenshot(path=out, full_page=True)
        browser.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.ui.screenshot", description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--admin-key", default="sk-admin-1")
    parser.add_argument("--interactive-key", default="sk-ide-1")
    parser.add_argument("--batch-key", default="sk-nightly-1")
    parser.add_argument("--batch-lines", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--wait", type=float, default=20.0, help="seconds of load before the shot")
    parser.add_argument("--out", default="admin-ui.png")
    args = parser.parse_args(argv)
    stop = threading.Event()
    load = threading.Thread(target=_interactive, args=(args.url, args.interactive_key, stop),
                            daemon=True)
    load.start()
    batch_id = _submit_batch(args.url, args.batch_key, args.batch_lines, args.max_tokens)
    try:
        take(args.url, args.admin_key, args.out, args.wait)
    finally:
        stop.set()
        load.join(timeout=60)
    print(f"wrote {args.out} (batch {batch_id} keeps running on the server)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
