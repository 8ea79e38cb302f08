"""LoRA adapters through a real server and the official client: an unload that waits for
the streams in flight, and greedy tokens of adapters equal to transformers + peft."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.harness import (
    EngineFactory,
    FakeAdapterHost,
    adapter_folder,
    auth_config,
    live_server,
    with_adapters,
)

ADMIN = {"authorization": "Bearer sk-admin-1"}
UNLOAD = "/v1/unload_lora_adapter"


def test_unload_waits_for_streams_in_flight(make_engine: EngineFactory, tmp_path: Path) -> None:
    """Two streams run on an adapter; it is unloaded meanwhile: new requests on it are 404
    at once, both streams end normally, and the adapter leaves only after the last."""
    host = FakeAdapterHost()
    engine = with_adapters(make_engine(token_delay_s=0.02), host,
                           sql=adapter_folder(tmp_path / "sql"))
    with live_server(auth_config(), engine) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-ide-1", max_retries=0)
        texts: list[str] = []
        errors: list[BaseException] = []

        def stream(max_tokens: int) -> None:
            try:
                parts = [c.choices[0].text for c in client.completions.create(
                    model="sql", prompt="hello", max_tokens=max_tokens, stream=True)
                    if c.choices]
                texts.append("".join(parts))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=stream, args=(n,)) for n in (30, 60)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while engine.adapters.in_flight("sql") < 2:
            assert time.monotonic() < deadline, "the streams did not start"
            time.sleep(0.005)
        r = httpx.post(server.url + UNLOAD, headers=ADMIN, json={"lora_name": "sql"})
        assert r.status_code == 200 and host.removed == []  # still in use
        with pytest.raises(openai.NotFoundError) as gone:
            client.completions.create(model="sql", prompt="hi", max_tokens=2)
        assert gone.value.code == "model_not_found"
        assert "sql" not in [m.id for m in client.models.list()]
        for t in threads:
            t.join(timeout=30)
        assert errors == [] and len(texts) == 2 and all(texts)
        assert host.removed == ["sql"] and engine.adapters.in_flight("sql") == 0
