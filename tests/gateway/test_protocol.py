"""Request bodies parsed into GenerationOptions: penalties and logit_bias, accepted and refused."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.errors import ApiError
from gateway.protocol import GenerationOptions, parse_chat, parse_completion
from tests.gateway.batches.helpers import (
    COMPLETIONS,
    jsonl,
    line,
    results,
    submit,
    upload,
    wait_for,
)
from tests.gateway.harness import EngineFactory, Harness, auth_config, running

pytestmark = pytest.mark.asyncio(loop_scope="session")

CHAT = [{"role": "user", "content": "hi"}]
NIGHTLY = "sk-nightly-1"


def _completion(**fields: Any) -> GenerationOptions:
    return parse_completion({"prompt": "x", **fields}, 1).options


async def test_penalties_and_bias_are_parsed() -> None:
    options = _completion(presence_penalty=-2, frequency_penalty=1.5, repetition_penalty=1.3,
                          logit_bias={"50": 100, "7": -100, "12": 0.5})
    assert (options.presence_penalty, options.frequency_penalty) == (-2.0, 1.5)
    assert options.repetition_penalty == 1.3
    assert options.logit_bias == ((7, -100.0), (12, 0.5), (50, 100.0))  # ids as ints, sorted
    chat = parse_chat({"messages": CHAT, "presence_penalty": 2, "logit_bias": {"0": 1}})
    assert chat.options.presence_penalty == 2.0 and chat.options.logit_bias == ((0, 1.0),)


async def test_absent_null_and_neutral_values_change_nothing() -> None:
    neutral = _completion(presence_penalty=0, frequency_penalty=None, repetition_penalty=1,
                          logit_bias={})
    absent = _completion()
    assert (absent.presence_penalty, absent.frequency_penalty, absent.logit_bias) == (0, 0, ())
    assert absent.repetition_penalty is None  # the model's default, else 1
    assert neutral.repetition_penalty == 1.0 and neutral.logit_bias == ()
    assert _completion(logit_bias=None).logit_bias == ()


def _refused(param: str, response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["type"]) == (param, "invalid_request_error")
    assert error["code"] in ("invalid_value", "invalid_type"), error
    return str(error["message"])


REFUSED: list[tuple[str, Any]] = [
    ("presence_penalty", 2.01), ("presence_penalty", -3), ("presence_penalty", "0.5"),
    ("frequency_penalty", 2.5), ("frequency_penalty", -2.5), ("frequency_penalty", True),
    ("repetition_penalty", 0), ("repetition_penalty", -1.2), ("repetition_penalty", "1.2"),
    ("logit_bias", [1, 2]), ("logit_bias", "1:5"), ("logit_bias", 5),
    ("logit_bias", {"a": 1}), ("logit_bias", {"-1": 1}), ("logit_bias", {"1.5": 1}),
    ("logit_bias", {" 1": 1}), ("logit_bias", {"": 1}),
    ("logit_bias", {"1": 100.5}), ("logit_bias", {"1": -101}), ("logit_bias", {"1": "5"}),
    ("logit_bias", {"1": True}), ("logit_bias", {"1": None}),
]


@pytest.mark.parametrize(("field", "value"), REFUSED)
async def test_out_of_range_and_malformed_values_name_the_field(field: str, value: Any) -> None:
    for parse in (lambda: parse_completion({"prompt": "x", field: value}, 1),
                  lambda: parse_chat({"messages": CHAT, field: value})):
        with pytest.raises(ApiError) as raised:
            parse()
        error = raised.value
        assert (error.status, error.param, error.code) in (
            (400, field, "invalid_value"), (400, field, "invalid_type")), error.message


async def test_the_endpoints_answer_them_with_400s(gateway: Harness) -> None:
    for field, value in REFUSED:
        _refused(field, await gateway.client.post("/v1/completions",
                                                  json={"prompt": "x", field: value}))
        _refused(field, await gateway.client.post("/v1/chat/completions",
                                                  json={"messages": CHAT, field: value}))


async def test_logit_bias_keys_must_lie_in_the_vocabulary(gateway: Harness) -> None:
    vocab = gateway.engine.vocab_size
    last = await gateway.client.post("/v1/completions", json={
        "prompt": "x", "max_tokens": 2, "logit_bias": {str(vocab - 1): 3}})
    assert last.status_code == 200, last.text
    for url, body in (("/v1/completions", {"prompt": "x"}),
                      ("/v1/chat/completions", {"messages": CHAT})):
        response = await gateway.client.post(url, json={**body, "logit_bias": {"3": 1,
                                                                              str(vocab): 1}})
        assert f"{vocab} is out of the model's vocabulary" in _refused("logit_bias", response)
    assert gateway.fake.kv_blocks_in_use == 0


async def test_stop_token_ids_must_lie_in_the_vocabulary(gateway: Harness) -> None:
    """An id past the vocabulary would index past the logits where min_tokens masks it."""
    vocab = gateway.engine.vocab_size
    for url, body in (("/v1/completions", {"prompt": "x"}),
                      ("/v1/chat/completions", {"messages": CHAT})):
        response = await gateway.client.post(url, json={
            **body, "min_tokens": 1, "max_tokens": 2, "stop_token_ids": [3, vocab]})
        assert f"{vocab} is out of the model's vocabulary" in _refused("stop_token_ids",
                                                                        response)
    assert gateway.fake.kv_blocks_in_use == 0


async def test_accepted_values_answer_200(gateway: Harness) -> None:
    response = await gateway.client.post("/v1/chat/completions", json={
        "messages": CHAT, "max_tokens": 3, "presence_penalty": 0.5, "frequency_penalty": -1,
        "repetition_penalty": 1.2, "logit_bias": {"5": -100, "6": 100}})
    assert response.status_code == 200, response.text


async def test_batch_lines_take_the_same_fields(make_engine: EngineFactory) -> None:
    lines = [line(0, COMPLETIONS, presence_penalty=1.0, repetition_penalty=1.1,
                  logit_bias={"5": -100}),
             line(1, COMPLETIONS, logit_bias={"10000000": 5})]  # past the vocabulary
    bad = [line(2, COMPLETIONS, frequency_penalty=9)]
    async with running(auth_config(), make_engine()) as h:
        created = await submit(h.client, NIGHTLY, lines, COMPLETIONS)
        done = await wait_for(h.client, NIGHTLY, created["id"])
        out = await results(h.client, NIGHTLY, done["output_file_id"])
        errors = await results(h.client, NIGHTLY, done["error_file_id"])
        refused = await upload(h.client, NIGHTLY, jsonl(bad))  # at upload, naming the field
    assert [x["custom_id"] for x in out] == ["req-0"]
    [error] = errors
    assert error["custom_id"] == "req-1" and error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["param"] == "logit_bias"
    assert refused.status_code == 400
    assert "body.frequency_penalty" in refused.json()["error"]["message"]
