"""Admission: a request's sampling fields become its SamplingParams, and reach the sampler."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from gateway.engine import engine_for_model
from models.loader import load
from tests.gateway.harness import EngineFactory, live_server, make_config, record_requests, running
from tests.scheduler.conftest import make_scheduler

pytestmark = pytest.mark.asyncio(loop_scope="session")

PROMPT = [5, 17, 42, 99, 17, 5, 300, 8]


async def test_penalties_and_bias_become_sampling_params(make_engine: EngineFactory) -> None:
    engine = make_engine()
    seen = record_requests(engine)
    async with running(make_config(), engine) as h:
        for url, body in (("/v1/completions", {"prompt": "Hi"}),
                          ("/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "Hi"}]})):
            response = await h.client.post(url, json={
                **body, "max_tokens": 2, "presence_penalty": 0.5, "frequency_penalty": -1,
                "repetition_penalty": 1.2, "logit_bias": {"12": 5, "3": -100}})
            assert response.status_code == 200, response.text
        await h.client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    *given, plain = [r.sampling for r in seen]
    for p in given:
        assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -1, 1.2)
        assert p.logit_bias == ((3, -100.0), (12, 5.0)) and p.adjusts_logits
    assert not plain.adjusts_logits


def _transformers_greedy(path: Path, penalty: float, n: int) -> list[int]:
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    mask = torch.ones(1, len(PROMPT), dtype=torch.long)
    with torch.no_grad():
        out = hf.generate(torch.tensor([PROMPT]), attention_mask=mask, max_new_tokens=n,
                          do_sample=False, repetition_penalty=penalty)
    return list(out[0, len(PROMPT):].tolist())


async def test_repetition_penalty_through_the_openai_client_matches_transformers(
        tiny_model_dir: Path) -> None:
    model = load(tiny_model_dir, dtype="float32")
    engine = engine_for_model(model, make_scheduler(model, "slice"), make_config())
    want = {p: engine.tokenizer.decode(_transformers_greedy(tiny_model_dir, p, 16))
            for p in (1.0, 1.3)}
    assert want[1.0] != want[1.3]
    with live_server(make_config(), engine) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        for penalty, text in want.items():
            done = client.completions.create(model=engine.served_model_name, prompt=PROMPT,
                                             max_tokens=16, temperature=0,
                                             extra_body={"repetition_penalty": penalty,
                                                         "ignore_eos": True})
            assert done.choices[0].text == text, penalty
            assert done.usage is not None and done.usage.completion_tokens == 16
        client.close()
