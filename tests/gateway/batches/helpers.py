"""Batch API test helpers: JSONL inputs, uploads and polling over an httpx client."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TERMINAL = ("completed", "failed", "expired", "cancelled")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def line(i: int, url: str = CHAT, **body: Any) -> dict[str, Any]:
    """Input line `req-i`: a chat (or completion) request of 4 tokens unless `body` says else."""
    base: dict[str, Any] = {"max_tokens": 4, "temperature": 0}
    if url == CHAT:
        base["messages"] = [{"role": "user", "content": f"question {i}"}]
    else:
        base["prompt"] = f"line {i} says"
    return {"custom_id": f"req-{i}", "method": "POST", "url": url, "body": {**base, **body}}


def jsonl(lines: list[Any]) -> bytes:
    return b"".join(orjson.dumps(x) + b"\n" for x in lines)


async def upload(client: httpx.AsyncClient, key: str, data: bytes,
                 purpose: str = "batch") -> httpx.Response:
    return await client.post("/v1/files", headers=auth(key), data={"purpose": purpose},
                             files={"file": ("input.jsonl", data, "application/jsonl")})


async def create(client: httpx.AsyncClient, key: str, file_id: str,
                 endpoint: str = CHAT) -> dict[str, Any]:
    r = await client.post("/v1/batches", headers=auth(key), json={
        "input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def submit(client: httpx.AsyncClient, key: str, lines: list[Any],
                 endpoint: str = CHAT) -> dict[str, Any]:
    r = await upload(client, key, jsonl(lines))
    assert r.status_code == 200, r.text
    return await create(client, key, r.json()["id"], endpoint)


async def wait_for(client: httpx.AsyncClient, key: str, batch_id: str,
                   statuses: tuple[str, ...] = TERMINAL, timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        r = await client.get(f"/v1/batches/{batch_id}", headers=auth(key))
        assert r.status_code == 200, r.text
        batch = dict(r.json())
        if batch["status"] in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch['status']}: {batch}"
        await asyncio.sleep(0.02)


async def results(client: httpx.AsyncClient, key: str, file_id: str | None) -> list[Any]:
    if file_id is None:
        return []
    r = await client.get(f"/v1/files/{file_id}/content", headers=auth(key))
    assert r.status_code == 200, r.text
    return [orjson.loads(x) for x in r.content.splitlines()]
