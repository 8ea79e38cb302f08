"""`n` choices per prompt: through the official client streamed and not, ordered
prompt-major over a list of prompts, with log-probs, in a Batch API line, limited, charged
to quotas, aborted whole; on the real scheduler, seeded per choice and prefilled once."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from executors.types import Device
from gateway.engine import Engine, engine_for_model
from gateway.tenants import parse_tenants
from models.loader import load
from scheduler.api import Request
from scheduler.config import SchedulerConfig
from scheduler.scheduler import Scheduler
from tests.gateway.batches.helpers import COMPLETIONS, results, submit, wait_for
from tests.gateway.batches.helpers import line as batch_line
from tests.gateway.harness import (
    EngineFactory,
    Harness,
    auth_config,
    live_server,
    make_config,
    running,
)
from tests.scheduler.conftest import linear_time, xfer_time

pytestmark = pytest.mark.asyncio(loop_scope="session")

CHAT = [{"role": "user", "content": "Where does the river run?"}]
PROMPT = "the river runs to the ocean"


def _submissions(engine: Engine) -> list[tuple[float, Request]]:
    """Every request submitted to the engine's fake, with its monotonic time."""
    seen: list[tuple[float, Request]] = []
    fake: Any = engine.scheduler
    submit_ = fake.submit

    def record(request: Request) -> Any:
        seen.append((time.monotonic(), request))
        return submit_(request)

    fake.submit = record
    return seen


async def test_n_completions_through_the_openai_client(client: openai.AsyncOpenAI,
                                                       gateway: Harness) -> None:
    whole = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, n=4,
                                            seed=7)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason == "length" and c.text for c in whole.choices)
    assert len({c.text for c in whole.choices}) == 4  # the fake draws from seed + j
    assert whole.usage is not None and whole.usage.completion_tokens == 20
    single = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5)
    assert single.usage is not None
    assert whole.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt once
    stream = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, n=4,
                                             seed=7, stream=True,
                                             stream_options={"include_usage": True})
    texts, finishes = [""] * 4, [None] * 4
    usage = None
    async for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            texts[c.index] += c.text
            finishes[c.index] = c.finish_reason or finishes[c.index]
    assert texts == [c.text for c in whole.choices]
    assert finishes == ["length"] * 4
    assert usage is not None and usage.model_dump() == whole.usage.model_dump()
    assert gateway.fake.kv_blocks_in_use == 0


async def test_n_chat_through_the_openai_client(client: openai.AsyncOpenAI) -> None:
    whole = await client.chat.completions.create(model="tiny", messages=CHAT,
                                                 max_tokens=4, n=3, seed=1)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in whole.choices)
    stream = await client.chat.completions.create(model="tiny", messages=CHAT,
                                                  max_tokens=4, n=3, seed=1, stream=True)
    texts, finishes, roles = [""] * 3, [None] * 3, set()
    async for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finishes[c.index] = c.finish_reason or finishes[c.index]
            if c.delta.role:
                roles.add(c.index)
    assert roles == {0, 1, 2}
    assert texts == [c.message.content for c in whole.choices]
    assert finishes == ["length"] * 3


async def test_a_list_of_prompts_is_ordered_prompt_major(client: openai.AsyncOpenAI) -> None:
    prompts = ["the river runs", "the server reads"]
    both = await client.completions.create(model="tiny", prompt=prompts, max_tokens=4, n=3,
                                           seed=11)
    assert [c.index for c in both.choices] == list(range(6))
    for p, prompt in enumerate(prompts):
        for j in range(3):  # choice j of a prompt is seeded seed + j
            alone = await client.completions.create(model="tiny", prompt=prompt, max_tokens=4,
                                                    seed=11 + j)
            assert both.choices[p * 3 + j].text == alone.choices[0].text, (p, j)


async def test_each_choice_has_its_logprobs(client: openai.AsyncOpenAI) -> None:
    whole = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, n=2,
                                            seed=2, logprobs=1)
    for c in whole.choices:
        assert c.logprobs is not None and c.logprobs.tokens is not None
        assert len(c.logprobs.tokens) == 3 and "".join(c.logprobs.tokens) == c.text
    chat = await client.chat.completions.create(model="tiny", messages=CHAT,
                                                max_tokens=3, n=2, logprobs=True)
    assert all(c.logprobs is not None and c.logprobs.content is not None
               and len(c.logprobs.content) == 3 for c in chat.choices)


async def test_later_choices_wait_for_the_first_one_s_prefill(make_engine: EngineFactory
                                                              ) -> None:
    for caching, echo in ((True, False), (False, False), (True, True)):
        engine = dataclasses.replace(make_engine(token_delay_s=0.05), prefix_caching=caching)
        async with running(make_config(), engine) as h:
            seen = _submissions(h.engine)
            r = await h.client.post("/v1/completions", json={
                "prompt": PROMPT, "max_tokens": 2, "n": 3, "echo": echo})
            assert r.status_code == 200, r.text
            times = [t for t, _ in seen]
            assert [req.request_id[-2:] for _, req in seen] == ["-0", "-1", "-2"]
            staged = caching and not echo  # echo's prompt log-probs skip the cache
            assert (times[1] - times[0] >= 0.04) is staged, (caching, echo)
            assert times[2] - times[1] < 0.02  # the followers go together


async def test_out_of_range_n_is_a_400(gateway: Harness) -> None:
    for url, body in (("/v1/completions", {"prompt": "x"}),
                      ("/v1/chat/completions", {"messages": CHAT})):
        for n in (0, 17, "2", 1.5, -1):
            r = await gateway.client.post(url, json={**body, "n": n})
            assert r.status_code == 400, (n, r.text)
            assert r.json()["error"]["param"] == "n"
        r = await gateway.client.post(url, json={**body, "n": 2, "best_of": 3})
        assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"
        r = await gateway.client.post(url, json={**body, "n": 16, "best_of": 16,
                                                 "max_tokens": 1})
        assert r.status_code == 200 and len(r.json()["choices"]) == 16


async def test_quotas_charge_n_times_max_tokens(make_engine: EngineFactory) -> None:
    tenants = parse_tenants("tenants:\n  - {name: b, api_keys: [kb], tokens_per_minute: 100}\n")
    async with running(make_config(tenants), make_engine()) as h:
        body = {"prompt": [5, 6], "max_tokens": 30, "n": 4}
        first = await h.client.post("/v1/completions", json=body,
                                    headers={"authorization": "Bearer kb"})
        assert first.status_code == 200, first.text  # charged 2 + 4 x 30 > 100: in debt
        used = first.json()["usage"]
        assert used["prompt_tokens"] == 2 and used["completion_tokens"] == 120
        again = await h.client.post("/v1/completions", json={**body, "n": 1},
                                    headers={"authorization": "Bearer kb"})
        assert again.status_code == 429 and again.json()["error"]["type"] == "tokens"


async def test_a_batch_line_with_n(make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine()) as h:
        lines = [batch_line(0, COMPLETIONS, n=2, seed=3, temperature=1)]
        done = await wait_for(h.client, "sk-nightly-1",
                              (await submit(h.client, "sk-nightly-1", lines, COMPLETIONS))["id"])
        body = (await results(h.client, "sk-nightly-1", done["output_file_id"]))[0]
        choices = body["response"]["body"]["choices"]
        assert [c["index"] for c in choices] == [0, 1]
        assert choices[0]["text"] != choices[1]["text"]
        assert body["response"]["body"]["usage"]["completion_tokens"] == 8
        assert h.fake.kv_blocks_in_use == 0


@pytest.mark.parametrize("after_first_token", [True, False])
async def test_an_aborted_stream_of_n_frees_everything(make_engine: EngineFactory,
                                                       after_first_token: bool) -> None:
    engine = make_engine(token_delay_s=0.01 if after_first_token else 0.5)
    with live_server(make_config(), engine) as server:
        fake = server.fake
        seen = _submissions(engine)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            body = {"prompt": PROMPT, "max_tokens": 200, "n": 3, "stream": True}
            if after_first_token:
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    indexes: set[int] = set()
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            indexes |= set(map(int, re.findall(r'"index":(\d+)', line)))
                        if indexes == {0, 1, 2}:
                            break
                    assert fake.kv_blocks_in_use > 0
            else:  # gone before the first token: the followers are never submitted
                with pytest.raises(httpx.ReadTimeout):
                    await http.post("/v1/completions", json=body, timeout=0.2)
        deadline = time.monotonic() + 10
        while fake.num_requests and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert fake.num_requests == 0 and fake.kv_blocks_in_use == 0
        assert len(seen) == (3 if after_first_token else 1)
        assert fake.abort_reasons["abort"] == len(seen)


async def test_a_deadline_before_the_first_token_ends_every_choice(make_engine: EngineFactory
                                                                    ) -> None:
    engine = make_engine(token_delay_s=0.5)
    async with running(make_config(request_timeout_s=0.1), engine) as h:
        seen = _submissions(h.engine)
        r = await h.client.post("/v1/completions", json={"prompt": PROMPT, "n": 3})
        assert r.status_code == 200, r.text
        assert [c["finish_reason"] for c in r.json()["choices"]] == ["length"] * 3
        assert len(seen) == 1  # the later choices were never submitted
        assert h.fake.num_requests == 0 and h.fake.kv_blocks_in_use == 0


# ---- the real scheduler on the tiny model ---------------------------------------------------

@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir: Path) -> Engine:
    """One device: with two, the slice policy may place a later choice on the device that
    does not hold the prompt's blocks, which then prefills it again."""
    model = load(tiny_model_dir, dtype="float32")
    cfg = SchedulerConfig(policy="slice", max_model_len=1024, max_batch_tokens=512)
    scheduler = Scheduler(model, [Device("cpu:0", 256 << 20)], "slice", linear_time,
                          xfer_time, cfg)
    return engine_for_model(model, scheduler, make_config())


def _hits(metrics: str) -> float:
    return sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$",
                                            metrics, re.M))


async def test_n_on_the_real_scheduler(tiny_engine: Engine) -> None:
    model = tiny_engine.served_model_name
    prompt = [5 + (i * 37) % 900 for i in range(40)]  # 2 full blocks of 16, and 8 tokens
    with live_server(make_config(), tiny_engine) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)

        def texts(**kw: Any) -> list[str]:
            done = client.completions.create(model=model, prompt=prompt, max_tokens=8, n=4,
                                             extra_body={"ignore_eos": True}, **kw)
            assert [c.index for c in done.choices] == [0, 1, 2, 3]
            assert all(c.finish_reason == "length" for c in done.choices)
            return [c.text for c in done.choices]

        before = _hits(httpx.get(f"{server.url}/metrics").text)
        sampled = texts(temperature=1.0, seed=123)
        # NOTE: the first choice prefilled the prompt; the 3 others found its full blocks
        assert _hits(httpx.get(f"{server.url}/metrics").text) - before == 3 * 32
        assert len(set(sampled)) == 4
        assert texts(temperature=1.0, seed=123) == sampled
        greedy = texts(temperature=0)
        assert len(set(greedy)) == 1
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=8, n=4,
                                           temperature=1.0, seed=123, stream=True,
                                           extra_body={"ignore_eos": True})
        streamed = [""] * 4
        for chunk in stream:
            for c in chunk.choices:
                streamed[c.index] += c.text
        assert streamed == sampled
        client.close()
