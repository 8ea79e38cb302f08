"""The start-up context cap (gateway/context.py): a budget whose KV cannot hold the model's
context starts with the context capped, says so once, reports it and serves chats without
`max_tokens`; an explicit `--max-model-len` that cannot fit stops the start-up."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator

import httpx
import openai
import pytest

from gateway.config import ConfigError
from gateway.context import context_limit
from gateway.errors import ApiError
from gateway.prompts import resolve_max_tokens
from gateway.protocol import GenerationOptions
from tests.serve import REPO, GatewayProcess

# NOTE: the tiny model's context is 4096 tokens; 0.0065 GiB per device leaves ~45 KV blocks
# of 16 tokens after its weights and activation reserve (here: a cap of 720)
TINY = ["--model", "tiny-random", "--dtype", "float32", "--devices", "cpu:0,cpu:1"]
SMALL = [*TINY, "--device-memory-gib", "0.0065"]
MEMORY = "--device-memory-gib 0.6"


def test_a_context_that_fits_is_served_as_asked(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "gateway"):
        limit = context_limit(8192, False, 60000, MEMORY)
    assert (limit.max_model_len, limit.note) == (8192, "")
    assert not caplog.records


def test_the_models_context_is_capped_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "gateway"):
        limit = context_limit(8192, False, 848, MEMORY)
    assert limit.max_model_len == 848
    assert "--device-memory-gib 0.6" in limit.note and "--max-model-len" in limit.note
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("context capped to 848 tokens (the model's is 8192)")
    assert "--device-memory-gib 0.6" in line and "--max-model-len N (N <= 848)" in line


def test_an_explicit_context_that_cannot_fit_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"--max-model-len \(model.max_model_len\) 4096 does "
                                          r"not fit.* holds 848 tokens .* to 848 or less"):
        context_limit(4096, True, 848, MEMORY)
    assert context_limit(848, True, 848, MEMORY).max_model_len == 848


def test_a_prompt_past_the_cap_gets_a_400_naming_it() -> None:
    note = context_limit(8192, False, 848, MEMORY).note
    with pytest.raises(ApiError) as e:
        resolve_max_tokens(GenerationOptions(), 900, 848, chat=True, note=note)
    assert e.value.status == 400 and e.value.code == "context_length_exceeded"
    assert "maximum context length is 848 tokens (capped at start-up" in e.value.message
    assert "--max-model-len" in e.value.message
    # a chat without max_tokens gets the rest of the capped context
    assert resolve_max_tokens(GenerationOptions(), 40, 848, chat=True, note=note) == 808


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(SMALL, tmp_path_factory.mktemp("small") / "server.log") as server:
        yield server


@pytest.fixture(scope="module")
def fit(small: GatewayProcess) -> int:
    """The tokens one device's KV holds (no watermark below 100 blocks)."""
    gmg = httpx.get(f"{small.url}/admin/gmg", timeout=5).json()
    blocks = max(d["kv_blocks_total"] for d in gmg["devices"])
    assert blocks < 100
    return int(blocks * 16)


def test_a_small_budget_starts_capped_and_says_so_once(small: GatewayProcess, fit: int) -> None:
    assert 16 <= fit < 4096
    [model] = httpx.get(f"{small.url}/v1/models", timeout=5).json()["data"]
    assert model["max_model_len"] == fit
    lines = [s for s in small.log().splitlines() if "context capped to" in s]
    assert len(lines) == 1 and f"WARNING gateway: context capped to {fit} tokens" in lines[0]
    assert "--device-memory-gib 0.0065" in lines[0] and "--max-model-len" in lines[0]


def test_a_chat_without_max_tokens_is_served_on_demand(small: GatewayProcess,
                                                       fit: int) -> None:
    client = openai.OpenAI(base_url=f"{small.url}/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(model="tiny-random", temperature=0,
                                       messages=[{"role": "user", "content": "Hello"}])
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage is not None
    assert 1 <= r.usage.total_tokens <= fit
    gmg = httpx.get(f"{small.url}/admin/gmg", timeout=5).json()
    assert sum(d["kv_blocks_used"] for d in gmg["devices"]) == 0


def test_a_prompt_longer_than_the_cap_is_a_400_naming_it(small: GatewayProcess,
                                                         fit: int) -> None:
    client = openai.OpenAI(base_url=f"{small.url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny-random", prompt=[5] * (fit + 10))
    body = e.value.body
    assert isinstance(body, dict) and body["code"] == "context_length_exceeded"
    assert body["message"].startswith(f"This model's maximum context length is {fit} tokens "
                                      "(capped at start-up to what one device's KV cache holds"
                                      " with --device-memory-gib 0.0065; see --max-model-len)")


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "serve", *args, "--port", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def test_an_explicit_max_model_len_that_cannot_fit_stops_the_start(fit: int) -> None:
    done = _serve(*SMALL, "--max-model-len", str(fit + 1))
    assert done.returncode == 1
    assert (f"error: --max-model-len (model.max_model_len) {fit + 1} does not fit: one "
            f"device's KV cache holds {fit} tokens for one request with --device-memory-gib "
            f"0.0065; lower --max-model-len to {fit} or less") in done.stderr


@pytest.mark.parametrize("value", ["1", "0", "-5"])
def test_max_model_len_below_two_is_a_config_error(value: str) -> None:
    done = _serve(*TINY, "--max-model-len", value)
    assert done.returncode == 2
    assert "model.max_model_len" in done.stderr and "an integer >= 2" in done.stderr
