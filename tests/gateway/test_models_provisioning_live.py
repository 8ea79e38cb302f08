"""OpScale with two models, through a real server and the official client: `chat` (the tiny
Llama) and `small` (the tiny Qwen2) both on cpu:0,cpu:1, each starting with its chain on
cpu:0. Only `small` gets requests (of a tenant with a 1 ms TTFT SLO, so any demand asks for
every replica the queueing model can place): the provisioner copies small's chain, and only
small's, to cpu:1, which /admin/gmg shows; then requests of both models complete."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.config import load_config
from gateway.engine import build_engine
from gateway.tenants import parse_tenants
from tests.gateway.harness import ADMIN, LiveServer, live_server, make_config, tenants_yaml

KEY = "sk-ide-1"  # tenant ide: high priority, a 1 ms TTFT SLO here


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    config = load_config(None, {
        "model.dtype": "float32", "scheduler.devices": "cpu:0,cpu:1",
        "scheduler.provisioning": "opscale", "scheduler.provision_interval_s": 0.2,
        "model.models": [{"name": "chat", "spec": "tiny-random"},
                         {"name": "small", "spec": "tiny-random-qwen2"}]})
    served = make_config(parse_tenants(tenants_yaml(ide={"ttft_slo_ms": 1})))
    served = dataclasses.replace(served, batch=dataclasses.replace(
        served.batch, data_dir=str(tmp_path_factory.mktemp("data"))))
    with live_server(served, build_engine(config)) as live:
        yield live


def _replicas(live: LiveServer) -> dict[str, list[dict[str, Any]]]:
    """device -> its replicas, from /admin/gmg."""
    gmg = httpx.get(f"{live.url}/admin/gmg", headers=ADMIN, timeout=10).json()
    return {d["device"]: d["replicas"] for d in gmg["devices"]}


def _complete(client: openai.OpenAI, model: str) -> str:
    out = client.completions.create(model=model, prompt=[5, 6, 7, 8] * 16, max_tokens=8,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert out.model == model and out.usage is not None
    assert out.usage.completion_tokens == 8
    return out.choices[0].text


def test_the_busy_models_chain_is_replicated_on_the_idle_device(server: LiveServer) -> None:
    start = _replicas(server)
    assert {r["op"].split("/")[0] for r in start["cpu:0"]} == {"chat", "small"}
    assert start["cpu:1"] == []  # each model's chain starts on its first device only
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    deadline = time.monotonic() + 60
    while not (copied := _replicas(server)["cpu:1"]) or any(
            r["state"] != "ready" for r in copied):
        assert time.monotonic() < deadline, "no replica of small reached cpu:1"
        _complete(client, "small")
    assert {r["op"].split("/")[0] for r in copied} == {"small"}  # small's, not chat's
    assert [r["op"] for r in copied] == [r["op"] for r in start["cpu:0"]
                                         if r["op"].startswith("small/")]  # its whole chain
    before = _complete(client, "small")
    assert _complete(client, "chat")
    assert _complete(client, "small") == before  # greedy: the same on either replica
    health = httpx.get(f"{server.url}/health", timeout=10)
    assert health.status_code == 200
