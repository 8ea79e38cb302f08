"""Gateway fixtures: the tiny model's tokenizer, engines over a FakeScheduler, a running app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
from transformers import PreTrainedTokenizerBase

from gateway.engine import load_tokenizer
from tests.gateway.harness import EngineFactory, Harness, make_config, running


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="session")
def word_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """Ordinary (non-special) token ids the fake draws from, so outputs decode to text."""
    text = ("the capital of France is Paris and the river runs to the ocean while the "
            "server reads a request from the queue then writes the answer")
    ids = tokenizer.encode(text, add_special_tokens=False)
    special = set(tokenizer.all_special_ids)
    return tuple(sorted({i for i in ids if i not in special}))


@pytest.fixture(scope="session")
def make_engine(tokenizer: PreTrainedTokenizerBase, word_ids: tuple[int, ...]) -> EngineFactory:
    return EngineFactory(tokenizer, word_ids)


@pytest.fixture
async def gateway(make_engine: EngineFactory) -> AsyncIterator[Harness]:
    """The default app: auth off, a fake with no per-token delay."""
    async with running(make_config(), make_engine()) as harness:
        yield harness


@pytest.fixture
async def client(gateway: Harness) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official async client, talking to the default app through its ASGI transport."""
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app))
    async with openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="none",
                                  max_retries=0, http_client=http) as c:
        yield c

