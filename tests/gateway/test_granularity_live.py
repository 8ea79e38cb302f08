"""`--layer-groups` through the real server: variant chains profiled at start-up, an
interactive stream beside batch work, the same greedy answer whichever chain ran it.

The real `python -m gateway serve` on the tiny random model (4 layers): `--layer-groups 1,2`
runs the chain as 2 ops of 2 layers and offers low plans a variant of 4 ops of 1 layer;
`--max-num-batched-tokens 64` cuts the 120-token prompts into chunks, so one prompt's
chunks may run at different granularities.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.harness import ADMIN, stream_beside_batch, tiny_server_args
from tests.serve import GatewayProcess

PROMPT = "lorem ipsum " * 60
OPS = {"embed", "head", "recv", "send", "layers[0:2]", "layers[2:4]",
       *(f"layers[{i}:{i + 1}]" for i in range(4))}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[GatewayProcess]:
    s = GatewayProcess(tiny_server_args(tmp_path, "--layer-groups", "1,2",
                                        "--max-num-batched-tokens", "64",
                                        ide={"ttft_slo_ms": 5000, "tpot_slo_ms": 50}),
                       tmp_path / "server.log")
    try:
        yield s
    finally:
        s.close()


@pytest.mark.asyncio(loop_scope="session")
async def test_both_classes_served_and_the_answer_does_not_depend_on_the_chain(
        server: GatewayProcess) -> None:
    kw = {"model": "tiny-random", "max_tokens": 16, "temperature": 0,
          "extra_body": {"ignore_eos": True}}
    done = await stream_beside_batch(server.url, prompt=PROMPT, **kw)
    ide = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="sk-ide-1", max_retries=0)
    alone = await ide.completions.create(prompt=PROMPT, **kw)  # type: ignore[call-overload]
    await ide.close()
    assert {d.choices[0].text for d in done} == {alone.choices[0].text}
    assert alone.usage is not None and alone.usage.prompt_tokens > 64  # chunked
    timeline = httpx.get(f"{server.url}/admin/timeline", headers=ADMIN, timeout=10).json()
    names = {e["op"] for e in timeline["events"] if "op" in e}
    assert names and names <= OPS, names
    assert {"layers[0:2]", "layers[2:4]"} <= names  # the chain runs the interactive steps
    gmg = httpx.get(f"{server.url}/admin/gmg", headers=ADMIN, timeout=5).json()
    assert sum(d["kv_blocks_used"] for d in gmg["devices"]) == 0


def test_a_bad_layer_groups_flag_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="model.layer_groups"):
        GatewayProcess(["--model", "tiny-random", "--layer-groups", "2,x"],
                       tmp_path / "server.log")
