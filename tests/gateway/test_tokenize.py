"""vLLM's /tokenize, /detokenize and /version, through ASGITransport."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gateway import version
from tests.gateway.harness import MAX_MODEL_LEN, EngineFactory, Harness, auth_config, running

pytestmark = pytest.mark.asyncio(loop_scope="session")

CHAT = [{"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "text", "text": "there"}]}]
RENDERED = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi\nthere"}]
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


async def _post(h: Harness, path: str, body: Any, status: int = 200) -> dict[str, Any]:
    response = await h.client.post(path, json=body)
    assert response.status_code == status, response.text
    out: dict[str, Any] = response.json()
    return out


async def test_tokenize_a_prompt(gateway: Harness) -> None:
    tok = gateway.engine.tokenizer
    body = await _post(gateway, "/tokenize", {"model": "tiny", "prompt": "Hello world"})
    ids = tok.encode("Hello world", add_special_tokens=True)
    assert body == {"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids,
                    "token_strs": None}
    body = await _post(gateway, "/tokenize", {"prompt": "Hello world", "return_token_strs": True,
                                              "add_special_tokens": False})
    ids = tok.encode("Hello world", add_special_tokens=False)
    assert body["tokens"] == ids and body["token_strs"] == tok.convert_ids_to_tokens(ids)
    assert (await _post(gateway, "/tokenize", {"prompt": ""}))["count"] == 0


async def test_tokenize_messages_as_chat_completions_do(gateway: Harness) -> None:
    tok = gateway.engine.tokenizer
    body = await _post(gateway, "/tokenize", {"messages": CHAT, "return_token_strs": True})
    rendered = tok.apply_chat_template(RENDERED, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(rendered, add_special_tokens=False)
    assert body["tokens"] == ids and body["count"] == len(ids)
    assert body["token_strs"] == tok.convert_ids_to_tokens(ids)
    chat = await _post(gateway, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1})
    assert chat["usage"]["prompt_tokens"] == body["count"]  # the same rendering
    bare = await _post(gateway, "/tokenize", {"messages": CHAT, "add_generation_prompt": False})
    assert bare["tokens"] == ids[:bare["count"]] and bare["count"] < body["count"]


async def test_continue_final_message(gateway: Harness) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once"}]
    body = await _post(gateway, "/tokenize", {"messages": messages, "add_special_tokens": True,
                                              "add_generation_prompt": False,
                                              "continue_final_message": True})
    text = (await _post(gateway, "/detokenize", {"tokens": body["tokens"]}))["prompt"]
    assert text.endswith("assistant\nOnce")


@pytest.mark.parametrize("text", ["Hello world", "  two  spaces, tabs\tand\nnewlines ",
                                  "héllo wörld — 東京 🚀", "<|im_start|>user"])
async def test_round_trip(gateway: Harness, text: str) -> None:
    tokens = (await _post(gateway, "/tokenize", {"prompt": text}))["tokens"]
    assert await _post(gateway, "/detokenize", {"model": "tiny", "tokens": tokens}) == {
        "prompt": text}


async def test_detokenize_keeps_special_tokens_and_empty(gateway: Harness) -> None:
    tok = gateway.engine.tokenizer
    body = await _post(gateway, "/detokenize", {"tokens": [tok.eos_token_id]})
    assert body == {"prompt": tok.eos_token}
    assert await _post(gateway, "/detokenize", {"tokens": []}) == {"prompt": ""}


INVALID = [  # (path, body, the error's param, its code)
    ("/tokenize", {}, "prompt", "missing_required_parameter"),
    ("/tokenize", {"prompt": None, "messages": None}, "prompt", "missing_required_parameter"),
    ("/tokenize", {"prompt": 5}, "prompt", "invalid_type"),
    ("/tokenize", {"prompt": ["a"]}, "prompt", "invalid_type"),
    ("/tokenize", {"prompt": [1, 2]}, "prompt", "invalid_type"),
    ("/tokenize", {"prompt": "x", "messages": CHAT}, "messages", None),
    ("/tokenize", {"messages": "hi"}, "messages", "invalid_type"),
    ("/tokenize", {"messages": []}, "messages", "empty_array"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role",
     "invalid_value"),
    ("/tokenize", {"messages": [{"role": "user"}]}, "messages[0].content", "invalid_type"),
    ("/tokenize", {"messages": [{"role": "tool", "content": "x"}]},
     "messages[0].tool_call_id", "missing_required_parameter"),
    ("/tokenize", {"messages": CHAT, "tools": [{"type": "function"}]}, "tools",
     "unsupported_parameter"),
    ("/tokenize", {"messages": CHAT, "continue_final_message": True}, "continue_final_message",
     None),
    ("/tokenize", {"messages": CHAT, "add_generation_prompt": "no"}, "add_generation_prompt",
     "invalid_type"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": 1}, "add_special_tokens",
     "invalid_type"),
    ("/tokenize", {"prompt": "x", "return_token_strs": "yes"}, "return_token_strs",
     "invalid_type"),
    ("/tokenize", {"prompt": "x", "model": 3}, "model", "invalid_type"),
    ("/tokenize", [], None, "invalid_json"),
    ("/detokenize", {}, "tokens", "missing_required_parameter"),
    ("/detokenize", {"tokens": "1 2"}, "tokens", "invalid_type"),
    ("/detokenize", {"tokens": [1, 2.5]}, "tokens", "invalid_type"),
    ("/detokenize", {"tokens": [1, True]}, "tokens", "invalid_type"),
    ("/detokenize", {"tokens": [1, -1]}, "tokens", "invalid_value"),
    ("/detokenize", {"tokens": [1, 2**64 - 1]}, "tokens", None),  # past the vocabulary
    ("/detokenize", {"tokens": [1, 10**30]}, "tokens", "invalid_type"),  # JSON reads a float
    ("/detokenize", {"tokens": [1], "model": ["tiny"]}, "model", "invalid_type"),
    ("/detokenize", "tokens", None, "invalid_json"),
]


async def test_invalid_bodies(gateway: Harness) -> None:
    for path, body, param, code in INVALID:
        error = (await _post(gateway, path, body, status=400))["error"]
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error", param, code), (path, body, error)


async def test_token_ids_past_the_vocabulary(gateway: Harness) -> None:
    vocab = gateway.engine.vocab_size
    error = (await _post(gateway, "/detokenize", {"tokens": [1, vocab]}, status=400))["error"]
    assert error["param"] == "tokens" and str(vocab) in error["message"]
    assert await _post(gateway, "/detokenize", {"tokens": [vocab - 1]})


async def test_unknown_model(gateway: Harness) -> None:
    for path, body in (("/tokenize", {"prompt": "x"}), ("/tokenize", {"messages": CHAT}),
                       ("/detokenize", {"tokens": [1]})):
        error = (await _post(gateway, path, {**body, "model": "gpt-4"}, status=404))["error"]
        assert (error["param"], error["code"]) == ("model", "model_not_found")


VALUES = [None, True, 0, -1, 1.5, "", "x", [], [1], ["x"], {}, {"a": 1}, [{"role": "user"}]]
KEYS = {"/tokenize": ("prompt", "messages", "add_special_tokens", "add_generation_prompt",
                      "continue_final_message", "return_token_strs", "model", "tools"),
        "/detokenize": ("tokens", "model")}


async def test_any_value_is_answered_never_crashes(gateway: Harness) -> None:
    bases: dict[str, dict[str, Any]] = {"/tokenize": {"messages": CHAT},
                                        "/detokenize": {"tokens": [1]}}
    for path, keys in KEYS.items():
        for key in keys:
            base = {} if key == "prompt" else bases[path]
            for value in VALUES:
                response = await gateway.client.post(path, json={**base, key: value})
                assert response.status_code in (200, 400, 404), (path, key, value)
                assert ("error" in response.json()) == (response.status_code != 200)


async def test_huge_bodies_within_the_limit(gateway: Harness) -> None:
    text = "the river runs to the ocean " * 40_000  # 1.1 MB
    body = await _post(gateway, "/tokenize", {"prompt": text})
    assert body["count"] > MAX_MODEL_LEN  # no context check, as vLLM
    back = await _post(gateway, "/detokenize", {"tokens": body["tokens"]})
    assert back["prompt"] == text
    assert (await _post(gateway, "/tokenize", {"prompt": "x" * 500_000}))["count"] > 0


async def test_auth_as_v1(make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine()) as h:
        for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
            assert (await h.client.post(path, json=body)).status_code == 401
            for key, status in (("nope", 401), ("sk-admin-1", 401), ("sk-ide-1", 200)):
                response = await h.client.post(path, json=body,
                                               headers={"authorization": f"Bearer {key}"})
                assert response.status_code == status, (path, key)
            error = (await h.client.post(path, json=body)).json()["error"]
            assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
        assert (await h.client.get("/version")).status_code == 200  # open, as /health


async def test_version(gateway: Harness) -> None:
    response = await gateway.client.get("/version")
    assert response.status_code == 200
    assert response.json() == {"version": importlib.metadata.version("slicegate")}


async def test_version_falls_back_to_pyproject(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    expected = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    assert version.package_version() == expected
    monkeypatch.setattr(version, "_PYPROJECT", tmp_path / "absent.toml")
    assert version.package_version() == "unknown"
