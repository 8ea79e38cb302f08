"""A model-free OpenAI-compatible server, for dry runs of loadgen (``python -m loadgen stub``).

It answers ``/v1/completions`` (streaming or not), ``/v1/models``, ``/health``,
``/metrics`` (tenant TTFT SLOs) and ``/admin/timeline`` like slicegate, and
takes ``python -m gateway serve``'s flags (``--tenants`` is read; the model,
policy and device flags are accepted and ignored), so a bench can run against
it with ``--serve-cmd "python -m loadgen stub"``. One simulated device runs
steps: each step takes ``--step-ms`` plus ``--prefill-us-per-token`` for every
prompt token admitted in it, and gives every running request one token.
Prompt tokens are counted as whitespace-separated words.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse


@dataclass(frozen=True, slots=True)
class StubConfig:
    """The stub's knobs and its tenants (API key -> tenant name)."""

    model: str = "stub"
    step_s: float = 0.005
    prefill_s_per_token: float = 0.0
    keys: dict[str, str] = field(default_factory=dict)  # empty: no auth
    admin_keys: frozenset[str] = frozenset()
    slos_s: dict[str, float] = field(default_factory=dict)  # tenant -> TTFT SLO

    @classmethod
    def from_tenants_file(cls, path: Path, **kwargs: Any) -> StubConfig:
        doc = yaml.safe_load(path.read_text()) or {}
        keys = {k: t["name"] for t in doc.get("tenants", []) for k in t.get("api_keys", [])}
        slos = {t["name"]: t["ttft_slo_ms"] / 1000 for t in doc.get("tenants", [])
                if t.get("ttft_slo_ms")}
        return cls(keys=keys, admin_keys=frozenset(doc.get("admin_keys", [])), slos_s=slos,
                   **kwargs)


@dataclass(slots=True, eq=False)
class _Job:
    prompt_tokens: int
    max_tokens: int
    events: asyncio.Queue[float] = field(default_factory=asyncio.Queue)  # token times
    prefilled: bool = False
    generated: int = 0


class _Device:
    """One simulated device: steps while jobs run, records each step on the timeline."""

    def __init__(self, config: StubConfig) -> None:
        self._config = config
        self._jobs: list[_Job] = []
        self._wake = asyncio.Event()
        self.timeline: list[dict[str, Any]] = []

    def submit(self, job: _Job) -> None:
        self._jobs.append(job)
        self._wake.set()

    def cancel(self, job: _Job) -> None:
        if job in self._jobs:
            self._jobs.remove(job)

    async def run(self) -> None:
        while True:
            if not self._jobs:
                self._wake.clear()
                await self._wake.wait()
            start = time.monotonic()
            fresh = [j for j in self._jobs if not j.prefilled]
            await asyncio.sleep(self._config.step_s + self._config.prefill_s_per_token
                                * sum(j.prompt_tokens for j in fresh))
            end = time.monotonic()
            self.timeline.append({"device": "stub:0", "op": "prefill" if fresh else "decode",
                                  "class": "normal", "start": start, "end": end})
            del self.timeline[:-10_000]
            for job in list(self._jobs):
                job.prefilled = True
                job.generated += 1
                job.events.put_nowait(end)
                if job.generated >= job.max_tokens:
                    self._jobs.remove(job)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                   "param": None, "code": None}}, status_code=status)


def create_stub_app(config: StubConfig) -> FastAPI:
    """The stub as an ASGI app (the device loop starts with the app's lifespan)."""
    device = _Device(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(device.run())
        yield
        task.cancel()

    app = FastAPI(lifespan=lifespan)

    def key_of(request: Request) -> str:
        return request.headers.get("authorization", "").removeprefix("Bearer ").strip()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": config.model, "object": "model"}]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse("".join(
            f'slicegate_tenant_ttft_slo_seconds{{tenant="{t}"}} {s}\n'
            for t, s in config.slos_s.items()))

    @app.get("/admin/timeline")
    async def timeline(request: Request, since: float = 0.0) -> Response:
        if key_of(request) not in config.admin_keys:
            return _error(401, "admin key required")
        events = [r for r in device.timeline if r["end"] >= since]
        return JSONResponse({"now": time.monotonic(), "since": since, "events": events})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        if config.keys and key_of(request) not in config.keys:
            return _error(401, "invalid API key")
        body = await request.json()
        job = _Job(max(1, len(str(body.get("prompt", "")).split())),
                   int(body.get("max_tokens") or 16))
        device.submit(job)
        if body.get("stream"):
            return StreamingResponse(_sse(job, config.model, device),
                                     media_type="text/event-stream")
        for _ in range(job.max_tokens):
            await job.events.get()
        return JSONResponse(_completion(config.model, " tok" * job.max_tokens, "length", job))

    return app


def _completion(model: str, text: str, finish: str | None, job: _Job | None) -> dict[str, Any]:
    body: dict[str, Any] = {"id": "cmpl-stub", "object": "text_completion", "model": model,
                            "created": int(time.time()),
                            "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if job is not None:
        body["usage"] = {"prompt_tokens": job.prompt_tokens, "completion_tokens": job.generated,
                         "total_tokens": job.prompt_tokens + job.generated}
    return body


async def _sse(job: _Job, model: str, device: _Device) -> AsyncIterator[str]:
    try:
        for i in range(job.max_tokens):
            await job.events.get()
            finish = "length" if i == job.max_tokens - 1 else None
            yield f"data: {json.dumps(_completion(model, ' tok', finish, None))}\n\n"
    finally:
        device.cancel(job)  # NOTE: a client that went away stops using the device
    usage = _completion(model, "", None, job)
    usage["choices"] = []
    yield f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m loadgen stub [serve flags] [--step-ms MS] [--prefill-us-per-token US]``."""
    import uvicorn

    # NOTE: the docstring's reST literals read as Markdown ones in --help
    p = argparse.ArgumentParser(prog="python -m loadgen stub",
                                description=(__doc__ or "").replace("``", "`"))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tenants", type=Path, default=None)
    p.add_argument("--served-model-name", default="stub")
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--prefill-us-per-token", type=float, default=0.0)
    for ignored in ("--model", "--policy", "--devices", "--dtype", "--max-model-len",
                    "--cpu-threads", "--data-dir"):
        p.add_argument(ignored, default=None, help="accepted and ignored")
    args = p.parse_args(argv)
    knobs: dict[str, Any] = {"model": args.served_model_name, "step_s": args.step_ms / 1000,
                             "prefill_s_per_token": args.prefill_us_per_token / 1e6}
    config = (StubConfig.from_tenants_file(args.tenants, **knobs) if args.tenants
              else StubConfig(**knobs))
    uvicorn.run(create_stub_app(config), host=args.host, port=args.port, log_level="warning")
    return 0
