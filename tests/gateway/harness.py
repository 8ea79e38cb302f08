"""Gateway test helpers: the app over a FakeScheduler and the tiny model's tokenizer.

`Harness` runs `create_app` with its lifespan, behind `httpx.ASGITransport`;
`LiveServer` runs the real uvicorn server on a loopback port in a thread, for
the official-client and disconnect tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
from transformers import PreTrainedTokenizerBase

from gateway.adapters import Adapters
from gateway.app import create_app
from gateway.config import GatewayConfig, SchedulerSettings, ServerSettings
from gateway.engine import Engine, eos_ids
from gateway.server import make_server
from gateway.tenants import TenantsConfig, parse_tenants
from scheduler.api import Request
from scheduler.testing.fake import FakeConfig, FakeScheduler

MAX_MODEL_LEN = 256
MODEL = "tiny"

TENANTS_YAML = """\
admin_keys: [sk-admin-1]
tenants:
  - name: ide
    api_keys: [sk-ide-1]
    priority: high
    ttft_slo_ms: 500
  - name: chat
    api_keys: [sk-chat-1]
    priority: normal
  - name: nightly
    api_keys: [sk-nightly-1]
    priority: low
"""


ADMIN = {"Authorization": "Bearer sk-admin-1"}  # the admin key of `tenants_yaml`


def tenants_yaml(ide: dict[str, Any] | None = None,
                 nightly: dict[str, Any] | None = None) -> str:
    """The live servers' tenants file: admin key sk-admin-1, tenant `ide` (high priority,
    key sk-ide-1) and `nightly` (low, sk-nightly-1), each with the extra fields given."""
    lines = ["admin_keys: [sk-admin-1]", "tenants:"]
    for name, priority, extra in (("ide", "high", ide), ("nightly", "low", nightly)):
        lines += [f"  - name: {name}", f"    api_keys: [sk-{name}-1]",
                  f"    priority: {priority}"]
        lines += [f"    {key}: {json.dumps(value)}" for key, value in (extra or {}).items()]
    return "\n".join(lines) + "\n"


def write_tenants(folder: Path, ide: dict[str, Any] | None = None,
                  nightly: dict[str, Any] | None = None) -> str:
    """`tenants_yaml(ide, nightly)` written to folder/tenants.yaml; its path (`--tenants`)."""
    path = folder / "tenants.yaml"
    path.write_text(tenants_yaml(ide, nightly))
    return str(path)


def tiny_server_args(folder: Path, *flags: str, ide: dict[str, Any] | None = None,
                     nightly: dict[str, Any] | None = None) -> list[str]:
    """`python -m gateway serve` arguments: the tiny random model (float32, 0.25 GiB a
    device), `flags`, and the tenants of `tenants_yaml(ide, nightly)` written to `folder`."""
    return ["--model", "tiny-random", "--dtype", "float32", "--device-memory-gib", "0.25",
            *flags, "--tenants", write_tenants(folder, ide, nightly), "--log-level", "warning"]


async def stream_beside_batch(url: str, **batch: Any) -> list[Any]:
    """Against a `tiny_server_args` server at `url`: four `nightly` completions of `batch`
    (the model, prompt and sampling fields) in flight while `ide` streams a 12-token chat
    answer, checked whole (usage of 12 tokens); the four completions."""
    ide = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-ide-1", max_retries=0)
    nightly = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-nightly-1", max_retries=0)
    tasks = [asyncio.create_task(nightly.completions.create(**batch)) for _ in range(4)]
    try:
        stream = await ide.chat.completions.create(
            model="tiny-random", messages=[{"role": "user", "content": "hi"}], max_tokens=12,
            stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        chunks = [c async for c in stream]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:  # NOTE: after a failed check, none is left pending on the loop
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await ide.close()
        await nightly.close()


def make_config(tenants: TenantsConfig | None = None, **server: Any) -> GatewayConfig:
    return GatewayConfig(scheduler=SchedulerSettings(devices=("cpu:0",)),
                         server=ServerSettings(**server),
                         tenants=tenants or TenantsConfig())


def auth_config(**server: Any) -> GatewayConfig:
    return make_config(parse_tenants(TENANTS_YAML), **server)


@dataclasses.dataclass
class EngineFactory:
    """Builds an Engine over a fresh FakeScheduler (keyword arguments go to FakeConfig)."""

    tokenizer: PreTrainedTokenizerBase
    word_ids: tuple[int, ...]

    def __call__(self, **fake: Any) -> Engine:
        fake.setdefault("token_ids", self.word_ids)
        fake.setdefault("max_model_len", MAX_MODEL_LEN)
        scheduler = FakeScheduler(FakeConfig(vocab_size=len(self.tokenizer), **fake))
        return Engine(self.tokenizer, scheduler, MODEL, MAX_MODEL_LEN, len(self.tokenizer),
                      eos_ids(self.tokenizer))


@dataclasses.dataclass
class Harness:
    """A running app: its HTTP client, its fake scheduler and the app itself."""

    client: httpx.AsyncClient
    engine: Engine
    app: Any

    @property
    def fake(self) -> FakeScheduler:
        assert isinstance(self.engine.scheduler, FakeScheduler)
        return self.engine.scheduler


@asynccontextmanager
async def running(config: GatewayConfig, engine: Engine,
                  raise_app_exceptions: bool = True) -> AsyncIterator[Harness]:
    app = create_app(config, engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    async with (app.router.lifespan_context(app),
                httpx.AsyncClient(transport=transport, base_url="http://gateway") as client):
        yield Harness(client, engine, app)



def sse_events(body: str) -> list[Any]:
    """The `data:` payloads of an SSE body; `[DONE]` stays a string."""
    out: list[Any] = []
    for block in body.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else orjson.loads(data))
    return out


class LiveServer:
    """The real uvicorn server for an app, on a free loopback port, in a thread."""

    def __init__(self, config: GatewayConfig, engine: Engine) -> None:
        config = dataclasses.replace(config, server=dataclasses.replace(
            config.server, port=0, log_level="warning"))
        self.engine = engine
        self.server = make_server(config, engine)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def fake(self) -> FakeScheduler:
        assert isinstance(self.engine.scheduler, FakeScheduler)
        return self.engine.scheduler

    @property
    def url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"{'https' if self.server.config.is_ssl else 'http'}://127.0.0.1:{port}"

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@contextmanager
def live_server(config: GatewayConfig, engine: Engine) -> Iterator[LiveServer]:
    with LiveServer(config, engine) as server:
        yield server


class FakeAdapterHost:
    """An `AdapterHost` without a model: a folder is an adapter when it holds
    adapter_config.json; records what was added and removed."""

    def __init__(self) -> None:
        self.loaded: dict[str, str] = {}
        self.removed: list[str] = []
        self.bases: dict[str, str | None] = {}  # the base each load named (None: none)
        self.busy_names: set[str] = set()  # adapters the "scheduler" still runs

    def add(self, name: str, path: str, base: str | None = None) -> str:
        if not (Path(path) / "adapter_config.json").is_file():
            raise ValueError(f"adapter {name!r}: {path} has no adapter_config.json")
        self.loaded[name] = path
        self.bases[name] = base
        return base or ""

    def remove(self, name: str) -> None:
        del self.loaded[name]
        self.removed.append(name)

    def busy(self, name: str) -> bool:
        return name in self.busy_names


def with_adapters(engine: Engine, host: FakeAdapterHost,
                  **adapters: Path) -> Engine:
    """`engine` serving LoRA adapters through `host`, `adapters` (name -> folder) loaded."""
    registry = Adapters(host, reserved=(engine.served_model_name, *engine.model_aliases))
    for name, path in adapters.items():
        registry.load_now(name, str(path))
    return dataclasses.replace(engine, adapters=registry)


def adapter_folder(path: Path) -> Path:
    """A folder the fake host takes as an adapter."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text('{"r": 8}')
    return path


def record_requests(engine: Engine) -> list[Request]:
    """Every submitted scheduler request, in order."""
    seen: list[Request] = []
    fake = engine.scheduler
    assert isinstance(fake, FakeScheduler)
    submit = fake.submit

    def record(request: Request):  # type: ignore[no-untyped-def]
        seen.append(request)
        return submit(request)

    fake.submit = record  # type: ignore[method-assign]
    return seen
