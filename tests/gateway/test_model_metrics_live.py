"""The scheduler's figures per model on /metrics, through a real server of two tiny models
and the official client: `chat` (the tiny Llama, bf16) and `small` (the tiny Qwen2, fp32),
of different KV layouts, so each has a pool of its own. Only `small` gets requests: its
series move, chat's stay at zero; every model and adapter has its request gauges from
start-up. And /admin/direct on `small`'s LoRA adapter."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.config import load_config
from gateway.engine import build_engine
from tests.gateway.harness import ADMIN, LiveServer, auth_config, live_server
from tests.models.peft_ref import make_adapter

pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")

KEY = "sk-ide-1"  # tenant ide: high priority, a 500 ms TTFT SLO
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def server(tiny_qwen2_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[LiveServer]:
    adapter = make_adapter(tiny_qwen2_dir, tmp_path_factory.mktemp("adapters") / "q",
                           ["q_proj", "v_proj"], 4, 8, seed=1)
    config = load_config(None, {
        "model.dtype": "float32", "scheduler.devices": "cpu:0",
        "model.models": [{"name": "chat", "spec": "tiny-random", "dtype": "bfloat16"},
                         {"name": "small", "spec": "tiny-random-qwen2"}],
        "model.lora_reserve_gib": 0.01, "model.lora": {"q": str(adapter)}})
    served = auth_config()
    served = dataclasses.replace(served, batch=dataclasses.replace(
        served.batch, data_dir=str(tmp_path_factory.mktemp("data"))))
    with live_server(served, build_engine(config)) as live:
        yield live


def _samples(live: LiveServer, name: str) -> dict[str, float]:
    """The samples of family `name` on /metrics: their label text -> value."""
    text = httpx.get(f"{live.url}/metrics", timeout=30).text
    return {m[1]: float(m[2]) for m in re.finditer(
        rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.M)}


def _gauge(model: str, tenant: str = "ide", priority: str = "high") -> str:
    return f'model_name="{model}",priority="{priority}",tenant="{tenant}"'


IDLE = {_gauge(m, t, p): 0.0 for m in ("chat", "small", "q")
        for t, p in (("ide", "high"), ("chat", "normal"), ("nightly", "low"))}


def test_only_the_model_that_ran_moves_its_series(server: LiveServer) -> None:
    kv, drafts = "vllm:kv_cache_usage_perc", "vllm:spec_decode_num_drafts_total"
    running = "vllm:num_requests_running"
    # every model and the adapter show their request gauges from start-up, at 0
    assert _samples(server, running) == IDLE
    assert _samples(server, "vllm:num_requests_waiting") == IDLE
    assert _samples(server, kv) == {'model_name="chat"': 0.0, 'model_name="small"': 0.0}
    assert _samples(server, drafts) == {'model_name="chat"': 0.0, 'model_name="small"': 0.0}
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    stream = client.completions.create(
        model="small", prompt=[5, 6, 7, 8] * 8, max_tokens=300, temperature=0, stream=True,
        extra_body={"ignore_eos": True, "speculative": SPEC})
    chunks = iter(stream)
    next(chunks)  # the first token is out: small's request holds its KV
    during, gauges = _samples(server, kv), _samples(server, running)
    text = "".join(c.choices[0].text for c in [*chunks])
    assert during['model_name="small"'] > 0 and during['model_name="chat"'] == 0.0
    assert gauges == {**IDLE, _gauge("small"): 1.0}
    assert len(text) > 0
    assert _samples(server, running) == IDLE  # back to 0, not gone
    assert _samples(server, kv) == {'model_name="chat"': 0.0, 'model_name="small"': 0.0}
    after = _samples(server, drafts)
    assert after['model_name="small"'] > 0 and after['model_name="chat"'] == 0.0
    slo = _samples(server, "slicegate_slo_attainment")
    assert set(slo) == {'model_name="small",priority="high"'}  # chat judged no request
    tokens = _samples(server, "vllm:generation_tokens_total")
    assert tokens == {'model_name="small",priority="high",tenant="ide"': 300.0}
    preempted = _samples(server, "vllm:num_preemptions_total")
    assert all('model_name="small"' in labels for labels in preempted)
    gmg = httpx.get(f"{server.url}/admin/gmg", headers=ADMIN, timeout=10).json()
    [device] = gmg["devices"]
    assert sorted(p["models"] for p in device["kv_pools"]) == [["chat"], ["small"]]


def test_direct_runs_an_adapter_on_its_base_model(server: LiveServer) -> None:
    def direct(model: str) -> httpx.Response:
        return httpx.post(f"{server.url}/admin/direct", headers=ADMIN, timeout=60,
                          json={"model": model, "prompt": "hello there", "max_tokens": 3})

    base, adapter = direct("small"), direct("q")
    assert base.status_code == adapter.status_code == 200, adapter.text
    assert adapter.json()["prompt_tokens"] == base.json()["prompt_tokens"]  # small's tokens
    assert adapter.json()["total_s"] > 0
    assert server.engine.adapters.in_flight("q") == 0  # the run's lease was released
    missing = direct("nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert direct("chat").status_code == 200
