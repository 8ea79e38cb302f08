"""Two base models in one real `python -m gateway serve` process and one scheduler
(`--model chat=default --model batch=default`), driven by the openai client: routing by
`model`, tenants' model lists and default models, /v1/models, the metrics' `model_name`,
a Batch API file naming both, and the start-up refusal of weights that do not fit."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.batches.helpers import (
    COMPLETIONS,
    jsonl,
    line,
    results,
    submit,
    upload,
    wait_for,
)
from tests.gateway.harness import write_tenants
from tests.serve import REPO, GatewayProcess, held_weights_gib

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("models")
    s = GatewayProcess(["--model", "chat=default", "--model", "batch=default",
                        "--devices", "cpu:0,cpu:1", "--tenants",
                        write_tenants(tmp, {"ttft_slo_ms": 2000, "default_model": "chat"},
                                      {"models": ["batch"], "default_model": "batch"}),
                        "--data-dir", str(tmp / "data"), "--log-level", "warning"],
                       tmp / "server.log", ready_timeout_s=600)
    try:
        yield s
    finally:
        s.close()


def _client(server: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def test_a_requests_model_picks_one_of_the_two(server: GatewayProcess) -> None:
    ide = _client(server, "sk-ide-1")
    assert [m.id for m in ide.models.list()] == ["chat", "batch"]
    out = {m: ide.completions.create(model=m, prompt=PROMPT, max_tokens=8, temperature=0)
           for m in ("chat", "batch")}
    assert out["chat"].model == "chat" and out["batch"].model == "batch"
    # the same weights twice: greedy text is the same on either model
    assert out["chat"].choices[0].text == out["batch"].choices[0].text != ""
    streamed = ide.chat.completions.create(
        model="batch", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True)
    assert {c.model for c in streamed} == {"batch"}
    with pytest.raises(openai.NotFoundError) as missing:
        ide.completions.create(model="other", prompt=PROMPT, max_tokens=2)
    assert missing.value.code == "model_not_found"
    ide.close()


async def test_concurrent_requests_of_both_models_get_the_text_each_gets_alone(
        server: GatewayProcess) -> None:
    # decode steps then batch both models' rows in one plan (a chunk per model) over one KV
    # pool per device: each request's text must be what it gets alone. NOTE: 4 tokens: in
    # bfloat16 a batch's rows may round differently from one row, and later greedy tokens of
    # some prompts then differ with one model alone too
    prompts = [f"Question {i}: name a colour." for i in range(4)]
    ide = _client(server, "sk-ide-1")
    alone = [ide.completions.create(model="chat", prompt=p, max_tokens=4, temperature=0)
             .choices[0].text for p in prompts]
    ide.close()
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="sk-ide-1", max_retries=0)
    jobs = [client.completions.create(model=m, prompt=p, max_tokens=4, temperature=0)
            for p in prompts for m in ("chat", "batch")]
    done = await asyncio.gather(*jobs)
    await client.close()
    assert [d.choices[0].text for d in done] == [t for t in alone for _ in range(2)]
    assert [d.model for d in done] == ["chat", "batch"] * len(prompts)


def test_tenants_use_their_models_and_default_model(server: GatewayProcess) -> None:
    nightly = _client(server, "sk-nightly-1")
    assert [m.id for m in nightly.models.list()] == ["batch"]
    with pytest.raises(openai.PermissionDeniedError) as denied:
        nightly.completions.create(model="chat", prompt=PROMPT, max_tokens=2)
    assert denied.value.code == "model_not_allowed"
    nightly.close()
    for key, model in (("sk-nightly-1", "batch"), ("sk-ide-1", "chat")):
        r = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
            "prompt": PROMPT, "max_tokens": 2}, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200 and r.json()["model"] == model  # no `model`: the default
    direct = httpx.post(f"{server.url}/admin/direct", timeout=60, json={
        "prompt": PROMPT, "max_tokens": 2}, headers={"Authorization": "Bearer sk-admin-1"})
    assert direct.status_code == 200 and direct.json()["total_s"] > 0  # the first model's chain
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'model_name="batch",priority="low",tenant="nightly"' in metrics
    assert 'model_name="chat",priority="high",tenant="ide"' in metrics


async def test_a_batch_file_naming_both_models(server: GatewayProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        lines = [line(0, COMPLETIONS, model="chat"), line(1, COMPLETIONS, model="batch")]
        batch = await submit(client, "sk-ide-1", lines, COMPLETIONS)
        done = await wait_for(client, "sk-ide-1", batch["id"], timeout_s=120)
        assert done["status"] == "completed", done
        out = {r["custom_id"]: r["response"]
               for r in await results(client, "sk-ide-1", done["output_file_id"])}
        refused = await upload(client, "sk-ide-1", jsonl([*lines, line(2, COMPLETIONS,
                                                                         model="other")]))
    assert out["req-0"]["body"]["model"] == "chat" and out["req-1"]["body"]["model"] == "batch"
    assert out["req-0"]["status_code"] == out["req-1"]["status_code"] == 200
    assert refused.status_code == 400 and "line 3: body.model" in refused.text


def test_weights_that_do_not_fit_their_devices_stop_the_start(tmp_path: Path) -> None:
    # two copies of the default model on one device that holds one and a half (as its CPU
    # operators hold it: 0.55 GiB on an AVX-512 CPU, 1.31 GiB where the kernels keep a
    # float32 copy of the bf16 weights)
    one = held_weights_gib(["--model", "default", "--devices", "cpu:0"], tmp_path / "probe")
    budget = f"{1.5 * one:.2f}"
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--model", "chat=default", "--model",
         "batch=default", "--devices", "cpu:0", "--device-memory-gib", budget, "--data-dir",
         str(tmp_path / "data"), "--port", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    found = re.search(rf"error: cpu:0: {re.escape(budget)} GiB cannot hold (\d+\.\d\d) GiB "
                      r"of weights \(chat (\d+\.\d\d) GiB, batch (\d+\.\d\d) GiB\)",
                      proc.stderr)
    assert found, proc.stderr
    total, chat, batch = (float(g) for g in found.groups())
    assert chat == batch == one and total == pytest.approx(chat + batch, abs=0.011)
