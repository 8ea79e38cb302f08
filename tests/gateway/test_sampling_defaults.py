"""Sampling defaults from generation_config.json: read, filling what requests omit, off."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import httpx
import pytest

from gateway.__main__ import build_parser, config_from_args
from gateway.engine import engine_for_model
from gateway.sampling_defaults import (
    GenerationConfigError,
    SamplingDefaults,
    load_sampling_defaults,
    parse_generation_config,
)
from models.loader import load
from scheduler.testing.fake import FakeScheduler
from tests.gateway.harness import EngineFactory, make_config, record_requests, running
from tests.serve import GatewayProcess

pytestmark = pytest.mark.asyncio(loop_scope="session")

RECOMMENDED = SamplingDefaults(temperature=0.2, top_p=0.9, top_k=40, max_tokens=7,
                               repetition_penalty=1.2, source="test")


async def test_reads_vllms_keys_and_leaves_out_what_it_cannot_do(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        defaults = parse_generation_config(
            {"do_sample": True, "temperature": 1, "top_p": 0.95, "top_k": -1,
             "max_new_tokens": 64, "repetition_penalty": 1.1, "min_p": 0.0, "bos_token_id": 1},
            "g.json")
    assert defaults.as_dict() == {"temperature": 1.0, "top_p": 0.95, "top_k": 0,
                                  "max_tokens": 64, "repetition_penalty": 1.1}
    assert not caplog.text  # a neutral min_p needs no warning
    with caplog.at_level(logging.WARNING):
        assert parse_generation_config({"min_p": 0.05}, "g.json").as_dict() == {}
    assert "min_p=0.05, which this server does not implement" in caplog.text
    assert parse_generation_config({"eos_token_id": 2}, "g.json").as_dict() == {}


@pytest.mark.parametrize(("data", "message"), [
    ({"temperature": -0.5}, "temperature must be >= 0"),
    ({"top_p": 0}, r"top_p must be in \(0, 1\]"),
    ({"top_k": 2.5}, "top_k must be an integer"),
    ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
    ({"temperature": "hot"}, "temperature must be"),
    ({"repetition_penalty": 0}, "repetition_penalty must be > 0"),
    ({"repetition_penalty": "1.1"}, "repetition_penalty must be > 0"),
])
async def test_invalid_values_name_the_file_and_key(data: dict, message: str) -> None:
    with pytest.raises(GenerationConfigError, match=f"g.json: {message}"):
        parse_generation_config(data, "g.json")


async def test_auto_none_and_a_folder(tmp_path: Path) -> None:
    model, other, empty = tmp_path / "model", tmp_path / "other", tmp_path / "empty"
    for folder, temperature in ((model, 0.3), (other, 0.7)):
        folder.mkdir()
        (folder / "generation_config.json").write_text(json.dumps({"temperature": temperature}))
    empty.mkdir()
    assert load_sampling_defaults("auto", model).temperature == 0.3
    assert load_sampling_defaults(str(other), model).temperature == 0.7
    assert load_sampling_defaults("none", model) == SamplingDefaults()
    assert load_sampling_defaults("auto", empty) == SamplingDefaults()  # a folder without one
    with pytest.raises(GenerationConfigError, match="no .*empty/generation_config.json"):
        load_sampling_defaults(str(empty), model)
    (model / "generation_config.json").write_text("{not json")
    with pytest.raises(GenerationConfigError, match="cannot read it"):
        load_sampling_defaults("auto", model)


async def test_defaults_fill_what_a_request_omits(make_engine: EngineFactory) -> None:
    engine = dataclasses.replace(make_engine(), sampling_defaults=RECOMMENDED)
    seen = record_requests(engine)
    async with running(make_config(), engine) as h:
        models = (await h.client.get("/v1/models")).json()["data"][0]
        assert models["sampling_defaults"] == RECOMMENDED.as_dict()
        omitted = await h.client.post("/v1/completions", json={"prompt": "Hi",
                                                               "ignore_eos": True})
        assert omitted.json()["usage"]["completion_tokens"] == 7  # max_new_tokens
        given = await h.client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.7, "top_p": 1,
            "top_k": -1, "max_tokens": 3, "ignore_eos": True})
        assert given.json()["usage"]["completion_tokens"] == 3
        greedy = await h.client.post("/v1/completions", json={"prompt": "Hi", "temperature": 0,
                                                              "top_p": None,
                                                              "repetition_penalty": 1})
        assert greedy.status_code == 200
    assert [(p.temperature, p.top_p, p.top_k, p.max_tokens, p.repetition_penalty)
            for p in [r.sampling for r in seen]] == [(0.2, 0.9, 40, 7, 1.2), (0.7, 1.0, 0, 3, 1.2),
                               (0.0, 0.9, 40, 7, 1.0)]


async def test_without_defaults_the_openai_ones_apply(make_engine: EngineFactory) -> None:
    engine = make_engine()
    seen = record_requests(engine)
    async with running(make_config(), engine) as h:
        assert (await h.client.get("/v1/models")).json()["data"][0]["sampling_defaults"] == {}
        await h.client.post("/v1/completions", json={"prompt": "Hi", "ignore_eos": True})
    [p] = [r.sampling for r in seen]
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (1.0, 1.0, 0, 16)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0, 0, 1)
    assert p.logit_bias == () and not p.adjusts_logits


def _tiny_with_defaults(tiny_model_dir: Path, folder: Path) -> Path:
    shutil.copytree(tiny_model_dir, folder)
    path = folder / "generation_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "temperature": 0.3, "top_k": 5, "max_new_tokens": 4,
                                "repetition_penalty": 1.2}))
    return folder


async def test_generation_config_none_leaves_them_off(tiny_model_dir: Path,
                                                      tmp_path: Path) -> None:
    folder = _tiny_with_defaults(tiny_model_dir, tmp_path / "tiny")
    model = load(folder, dtype="float32")
    for flags, expected in (([], {"temperature": 0.3, "top_k": 5, "max_tokens": 4,
                                  "repetition_penalty": 1.2}),
                            (["--generation-config", "none"], {})):
        args = build_parser().parse_args(["serve", "--model", str(folder), *flags])
        engine = engine_for_model(model, FakeScheduler(), config_from_args(args))
        assert engine.sampling_defaults.as_dict() == expected


async def test_the_served_model_folder_sets_the_defaults(tiny_model_dir: Path,
                                                         tmp_path: Path) -> None:
    folder = _tiny_with_defaults(tiny_model_dir, tmp_path / "tiny")
    args = ["--model", str(folder), "--dtype", "float32", "--devices", "cpu:0",
            "--device-memory-gib", "0.25"]
    # NOTE: estimators of this one-off folder are cached under tmp_path, not the user's cache
    with GatewayProcess(args, tmp_path / "server.log",
                        env={"SLICEGATE_CACHE": str(tmp_path / "cache")}) as server:
        [model] = httpx.get(f"{server.url}/v1/models").json()["data"]
        assert model["sampling_defaults"] == {"temperature": 0.3, "top_k": 5, "max_tokens": 4,
                                              "repetition_penalty": 1.2}
        done = httpx.post(f"{server.url}/v1/completions", timeout=30,
                          json={"prompt": "Hello there", "ignore_eos": True}).json()
        assert done["usage"]["completion_tokens"] == 4
        log = server.log()
    assert "sampling defaults for what requests omit: temperature=0.3, top_k=5" in log
    assert "max_tokens=4, repetition_penalty=1.2 (from" in log
    assert "does not implement" not in log
