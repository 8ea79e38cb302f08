"""Speculative decoding end to end: the real server, the default model, the openai client;
greedy answers equal with and without drafts, streamed and not, and /metrics counts them."""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Iterator

import httpx
import openai
import pytest

from gateway.config import load_config
from gateway.engine import Engine, build_engine
from tests.gateway.harness import LiveServer, auth_config, live_server

SPEC = '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, ' \
       '"prompt_lookup_min": 2}'
CODE = inspect.getsource(textwrap.dedent)[:700]
EDIT = f"Return this code with `text` renamed to `source`.\n\n```python\n{CODE}```"


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    config = load_config(None, {"model.spec": "default", "scheduler.devices": "cpu:0",
                                "model.dtype": "float32",
                                "model.speculative_config": SPEC})
    engine: Engine = build_engine(config)
    with live_server(auth_config(), engine) as server:
        yield server


def _accepted(live: LiveServer) -> float:
    text = httpx.get(f"{live.url}/metrics", timeout=30).text
    m = re.search(r'^vllm:spec_decode_num_accepted_tokens_total\{[^}]*\} (\S+)$', text, re.M)
    assert m is not None, text[-2000:]
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in text
    return float(m.group(1))


def test_greedy_answers_are_equal_with_and_without_drafts(live: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-ide-1", max_retries=0)
    ask = {"model": "default", "messages": [{"role": "user", "content": EDIT}],
           "max_tokens": 64, "temperature": 0}
    before = _accepted(live)
    plain = client.chat.completions.create(**ask, extra_body={"speculative": False})
    assert _accepted(live) == before  # off for this request
    drafted = client.chat.completions.create(**ask)
    assert _accepted(live) > before  # the server's config drafted, and drafts were kept
    assert drafted.choices[0].message.content == plain.choices[0].message.content
    assert drafted.usage is not None and plain.usage is not None
    assert drafted.usage.completion_tokens == plain.usage.completion_tokens
    stream = client.chat.completions.create(**ask, stream=True,
                                            extra_body={"speculative": {
                                                "num_speculative_tokens": 3,
                                                "prompt_lookup_max": 3}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == plain.choices[0].message.content


def test_a_bad_speculative_field_is_a_400_through_the_client(live: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-ide-1", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="default", prompt="x", max_tokens=2,
                                  extra_body={"speculative": {"num_speculative_tokens": -1}})
    assert e.value.body["param"] == "speculative"  # type: ignore[index]
