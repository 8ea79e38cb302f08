"""The Batch API on a real `gateway serve --model tiny-random` process: the official openai
client end to end, a 200-line batch beside an interactive tenant's SLO, SIGKILL and restart.

The SLO test holds the server's own TTFT (arrival to first token, its histogram) to the SLO
for every interactive request; the client's wall time, which also counts this process and
the OS sharing a 2-core machine with the server, may miss it for one request in ten (a
loaded CI run saw one of 29 at 0.92 s where the others took 0.02-0.4 s)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from tests.gateway.batches.helpers import auth, jsonl, line
from tests.gateway.batches.server import ServerProcess

SLO_MS = 500
MAX_WAITING = 2  # the feeder's default batch.max_waiting


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = ServerProcess(tmp_path_factory.mktemp("batch-server"), slo_ms=SLO_MS).start()
    try:
        yield s
    finally:
        s.close()


def _client(server: ServerProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def _poll(client: openai.OpenAI, batch_id: str, timeout_s: float = 120) -> openai.types.Batch:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)


def test_openai_client_end_to_end_and_tenant_isolation(server: ServerProcess) -> None:
    client, other = _client(server, "sk-nightly-1"), _client(server, "sk-ide-1")
    data = jsonl([line(i, max_tokens=6) for i in range(10)])
    uploaded = client.files.create(file=("requests.jsonl", data), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(data)
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"job": "nightly-eval"})
    assert batch.status == "validating" and batch.metadata == {"job": "nightly-eval"}
    done = _poll(client, batch.id)
    assert done.status == "completed" and done.output_file_id and done.error_file_id is None
    assert done.request_counts is not None and done.request_counts.completed == 10
    rows = [orjson.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert [r["custom_id"] for r in rows] == [f"req-{i}" for i in range(10)]
    assert all(r["response"]["body"]["usage"]["completion_tokens"] <= 6 for r in rows)
    assert batch.id in [b.id for b in client.batches.list(limit=5)]
    for read in (lambda: other.files.retrieve(uploaded.id),
                 lambda: other.files.content(done.output_file_id or ""),
                 lambda: other.batches.retrieve(batch.id),
                 lambda: other.batches.cancel(batch.id),
                 lambda: other.files.delete(uploaded.id)):
        with pytest.raises(openai.NotFoundError):
            read()
    client.close()
    other.close()


async def _interactive(client: httpx.AsyncClient, stop: asyncio.Event,
                       ttfts: list[float]) -> None:
    """An interactive tenant streaming short chats at ~5 per second; TTFT as the client sees."""
    i = 0
    while not stop.is_set():
        body = {"model": "tiny-random", "max_tokens": 8, "stream": True, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"interactive question {i} " * 8}]}
        start = time.monotonic()
        async with client.stream("POST", "/v1/chat/completions", json=body,
                                 headers=auth("sk-ide-1")) as r:
            assert r.status_code == 200
            async for chunk in r.aiter_lines():
                if chunk.startswith("data: {") and '"content":""' not in chunk:
                    ttfts.append(time.monotonic() - start)
                    break
        i += 1
        await asyncio.sleep(0.2)


async def _server_ttfts(client: httpx.AsyncClient, tenant: str) -> tuple[int, int]:
    """(first tokens, those within the SLO) by the server's own TTFT histogram for a tenant."""
    rows = [row for row in (await client.get("/metrics")).text.splitlines()
            if row.startswith("vllm:time_to_first_token_seconds_") and f'tenant="{tenant}"' in row]

    def total(part: str) -> int:
        return sum(int(float(row.rsplit(" ", 1)[1])) for row in rows if part in row)
    return total("_count{"), total(f'le="{SLO_MS / 1000}"')


async def _settled_ttfts(client: httpx.AsyncClient, count: int) -> tuple[int, int]:
    """The ide tenant's counts once `count` requests are in (a request counts as it ends)."""
    deadline = time.monotonic() + 10
    while (counts := await _server_ttfts(client, "ide"))[0] < count \
            and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return counts


async def _low_waiting(client: httpx.AsyncClient) -> int:
    text = (await client.get("/metrics")).text
    return sum(int(float(row.rsplit(" ", 1)[1])) for row in text.splitlines()
               if row.startswith("vllm:num_requests_waiting{") and 'priority="low"' in row)


@pytest.mark.asyncio(loop_scope="session")
async def test_two_hundred_lines_complete_while_interactive_requests_meet_their_slo(
        server: ServerProcess) -> None:
    data = jsonl([line(i, max_tokens=32, ignore_eos=True) for i in range(200)])
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        file_id = (await client.post("/v1/files", headers=auth("sk-nightly-1"),
                                     data={"purpose": "batch"},
                                     files={"file": ("in.jsonl", data)})).json()["id"]
        ttfts: list[float] = []
        before = await _server_ttfts(client, "ide")
        stop = asyncio.Event()
        load = asyncio.create_task(_interactive(client, stop, ttfts))
        batch = (await client.post("/v1/batches", headers=auth("sk-nightly-1"), json={
            "input_file_id": file_id, "endpoint": "/v1/chat/completions",
            "completion_window": "24h"})).json()
        waiting: list[int] = []
        while batch["status"] not in ("completed", "failed"):
            waiting.append(await _low_waiting(client))
            await asyncio.sleep(0.1)
            batch = (await client.get(f"/v1/batches/{batch['id']}",
                                      headers=auth("sk-nightly-1"))).json()
        stop.set()
        await load
        after = await _settled_ttfts(client, before[0] + len(ttfts))
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 200, "completed": 200, "failed": 0}
    assert len(ttfts) >= 5, ttfts
    served, within = after[0] - before[0], after[1] - before[1]
    assert served == len(ttfts) and within == served, (served, within)  # the server's own TTFT
    late = [round(t, 3) for t in ttfts if t > SLO_MS / 1000]
    assert len(late) <= len(ttfts) // 10, f"{late} of {len(ttfts)} missed {SLO_MS} ms"
    assert max(waiting) <= MAX_WAITING, waiting  # the low queue stayed short


def test_sigkill_mid_batch_then_restart_answers_every_line_once(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "srv").start()
    try:
        client = _client(server, "sk-nightly-1")
        data = jsonl([line(i, max_tokens=48, ignore_eos=True) for i in range(200)])
        uploaded = client.files.create(file=("in.jsonl", data), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id,
                                      endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.monotonic() + 60
        while (counts := client.batches.retrieve(batch.id).request_counts) is None \
                or counts.completed < 20:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.kill()
        assert counts.completed < 200  # killed mid-batch
        client.close()
        server.start()  # the same data dir and port
        client = _client(server, "sk-nightly-1")
        done = _poll(client, batch.id)
        assert done.status == "completed", done
        assert done.request_counts is not None and done.request_counts.total == 200
        assert done.request_counts.completed == 200 and done.error_file_id is None
        rows = [orjson.loads(x) for x in
                client.files.content(done.output_file_id or "").text.splitlines()]
        assert [r["custom_id"] for r in rows] == [f"req-{i}" for i in range(200)]
        assert all(r["response"]["status_code"] == 200 for r in rows)
        assert uploaded.id in [f.id for f in client.files.list()]
        client.close()
    finally:
        server.close()
