"""logprobs, top_logprobs and echo through the official client, streamed and not, and in a
Batch API file (over the FakeScheduler, whose log-probs are plausible constants)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.gateway.batches.helpers import COMPLETIONS, results, submit, wait_for
from tests.gateway.batches.helpers import line as batch_line
from tests.gateway.harness import Harness, auth_config, running

pytestmark = pytest.mark.asyncio(loop_scope="session")

CHAT = [{"role": "user", "content": "Where does the river run?"}]
PROMPT = "the river runs to the ocean"


async def test_chat_logprobs_streamed_and_not(client: openai.AsyncOpenAI) -> None:
    kw: dict[str, Any] = dict(model="tiny", messages=CHAT, max_tokens=6, seed=3,
                              logprobs=True, top_logprobs=2)
    whole = await client.chat.completions.create(**kw)
    choice = whole.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert whole.usage is not None and len(content) == whole.usage.completion_tokens == 6
    assert "".join(t.token for t in content) == choice.message.content
    for t in content:
        assert t.logprob == -0.1 and t.bytes == list(t.token.encode())
        assert [a.logprob for a in t.top_logprobs] == [-0.1, -1.1]
        assert t.top_logprobs[0].token == t.token
    stream = await client.chat.completions.create(**kw, stream=True)
    chunks = [c async for c in stream]
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content or []]
    assert streamed == content


async def test_chat_without_logprobs_has_none(client: openai.AsyncOpenAI) -> None:
    whole = await client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2)
    assert whole.choices[0].logprobs is None


async def test_completion_logprobs_streamed_and_not(client: openai.AsyncOpenAI) -> None:
    whole = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, seed=4,
                                            logprobs=3)
    lp = whole.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.top_logprobs is not None
    assert "".join(lp.tokens) == whole.choices[0].text and len(lp.tokens) == 5
    assert lp.token_logprobs == [-0.1] * 5
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    assert all(tok in top and 1 <= len(top) <= 4
               for tok, top in zip(lp.tokens, lp.top_logprobs, strict=True))
    stream = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, seed=4,
                                             logprobs=3, stream=True)
    parts = [c.choices[0].logprobs async for c in stream if c.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens or []] == lp.tokens
    assert [o for p in parts for o in p.text_offset or []] == lp.text_offset


async def test_echo_prepends_the_prompt_and_its_logprobs(client: openai.AsyncOpenAI,
                                                          gateway: Harness) -> None:
    ids = gateway.engine.tokenizer.encode(PROMPT, add_special_tokens=False)
    plain = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, seed=5)
    echo = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, seed=5,
                                           echo=True)
    assert echo.choices[0].text == PROMPT + plain.choices[0].text
    assert echo.choices[0].logprobs is None
    both = await client.completions.create(model="tiny", prompt=ids, max_tokens=3, seed=5,
                                           echo=True, logprobs=1)
    lp = both.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert both.choices[0].text == PROMPT + plain.choices[0].text
    assert len(lp.tokens) == len(ids) + 3 and "".join(lp.tokens) == both.choices[0].text
    assert lp.token_logprobs[0] is None and lp.top_logprobs is not None
    assert lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:len(ids)] == [-1.0] * (len(ids) - 1)
    stream = await client.completions.create(model="tiny", prompt=ids, max_tokens=3, seed=5,
                                             echo=True, logprobs=1, stream=True)
    chunks = [c.choices[0] async for c in stream]
    assert "".join(c.text for c in chunks) == both.choices[0].text
    assert [t for c in chunks if c.logprobs for t in c.logprobs.tokens or []] == lp.tokens


@pytest.mark.parametrize(("url", "body", "param"), [
    ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": 2}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "echo": "yes"}, "echo"),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": 1}, "prompt_logprobs"),
])
async def test_out_of_range_is_a_400(gateway: Harness, url: str, body: dict[str, Any],
                                     param: str) -> None:
    response = await gateway.client.post(url, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


async def test_a_batch_line_with_logprobs_gets_them_in_its_output(make_engine: Any) -> None:
    lines = [batch_line(0, logprobs=True, top_logprobs=1),
             batch_line(1, COMPLETIONS, logprobs=2, echo=True)]
    lines[1]["url"] = COMPLETIONS
    async with running(auth_config(), make_engine()) as h:
        chat = await submit(h.client, "sk-nightly-1", lines[:1])
        done = await wait_for(h.client, "sk-nightly-1", chat["id"])
        body = (await results(h.client, "sk-nightly-1", done["output_file_id"]))[0]
        content = body["response"]["body"]["choices"][0]["logprobs"]["content"]
        assert len(content) == 4 and len(content[0]["top_logprobs"]) == 1
        comp = await submit(h.client, "sk-nightly-1", lines[1:], COMPLETIONS)
        done = await wait_for(h.client, "sk-nightly-1", comp["id"])
        choice = (await results(h.client, "sk-nightly-1",
                                done["output_file_id"]))[0]["response"]["body"]["choices"][0]
        assert choice["text"].startswith("line 1 says")
        assert choice["logprobs"]["token_logprobs"][0] is None
        assert len(choice["logprobs"]["tokens"]) > 4
