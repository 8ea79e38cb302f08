"""The HTTP endpoints. Handlers are thin: auth, parse, tokenize, then `completions.generate`."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from gateway.completions import generate
from gateway.engine import check_model
from gateway.errors import clip, invalid
from gateway.fields import is_number
from gateway.openapi import document
from gateway.prompts import resolve_max_tokens, tokenize_chat, tokenize_completion
from gateway.protocol import parse_chat, parse_completion, parse_json
from gateway.responses import json_response
from gateway.served import model_cards, resolve_model
from gateway.state import state_of
from gateway.tenants import authenticate, authorize_admin, bearer_key
from gateway.tools.types import offered_tools
from gateway.version import package_version
from scheduler.api import DirectUnavailable

router = APIRouter()


@router.post("/v1/completions")
async def create_completion(request: Request) -> Response:
    state = state_of(request)
    tenant = authenticate(state.tenants.current, request.headers.get("authorization"))
    body = parse_completion(parse_json(await request.body()),
                            state.config.server.max_prompts_per_request)
    engine = state.engine.of(resolve_model(state.engine, tenant, body.options.model).base)
    prompts = tokenize_completion(engine, body.prompts, body.suffix)  # the model's tokenizer
    return await generate(request, tenant, body.options, prompts, chat=False)


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request) -> Response:
    state = state_of(request)
    tenant = authenticate(state.tenants.current, request.headers.get("authorization"))
    body = parse_chat(parse_json(await request.body()))
    engine = state.engine.of(resolve_model(state.engine, tenant, body.options.model).base)
    prompt = tokenize_chat(engine, body.messages, tools=offered_tools(body.tools))
    return await generate(request, tenant, body.options, [prompt], chat=True,
                          tools=body.tools)


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    state = state_of(request)
    tenants = state.tenants.current
    authorization = request.headers.get("authorization")
    key = bearer_key(authorization)
    tenant = None  # admins may list models too: all of them
    if key is None or not tenants.is_admin(key):
        tenant = authenticate(tenants, authorization)
    return json_response({"object": "list", "data": model_cards(state.engine, tenant)})


@router.get("/health")
async def health(request: Request) -> Response:
    state = state_of(request)
    if state.lifecycle.draining:
        return json_response({"status": "draining"}, status_code=503)
    stats = state.engine.scheduler.stats()
    if not stats.healthy:
        body: dict[str, Any] = {"status": "unhealthy", "detail": stats.health_detail}
        if stats.device_detail:
            body["devices"] = stats.device_detail
        return json_response(body, status_code=503)
    problem = state.batches.problem
    if problem is not None:
        return json_response({"status": "unhealthy", "detail": problem}, status_code=503)
    if stats.device_detail:  # remote devices: each one's state (a lost one may come back)
        status = "ok" if all(stats.device_up.values()) else "degraded"
        return json_response({"status": status, "devices": stats.device_detail})
    return json_response({"status": "ok"})


@router.get("/openapi.json")
async def openapi(request: Request) -> Response:
    engine = state_of(request).engine
    models = (engine.served_model_name, *engine.model_aliases, *engine.base_models,
              *engine.adapters.served())
    return json_response(document(package_version(), models))


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = state_of(request)
    engine = state.engine
    body = state.metrics.render(engine.scheduler.stats(), (
        engine.served_model_name, *engine.base_models, *engine.adapters.served()))
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/admin/gmg")
async def admin_gmg(request: Request) -> Response:
    state = state_of(request)
    authorize_admin(state.tenants.current, request.headers.get("authorization"))
    snapshot = state.engine.scheduler.snapshot()
    served = state.engine.served_model_name
    for device in snapshot.get("devices", ()):  # NOTE: the scheduler's only model is ""
        for pool in device.get("kv_pools", ()):
            pool["models"] = [m or served for m in pool["models"]]
    return json_response({"now": time.monotonic(), **snapshot})


@router.get("/admin/timeline")
async def admin_timeline(request: Request) -> Response:
    """Op executions since monotonic time `since` (default: all kept), each with the tenants
    of its requests, and the requests finished since then with their TTFT and SLO; `now` is
    the `since` of the next poll."""
    state = state_of(request)
    authorize_admin(state.tenants.current, request.headers.get("authorization"))
    raw = request.query_params.get("since", "0")
    try:
        since = float(raw)
    except ValueError:
        since = float("nan")
    if not is_number(since):
        raise invalid("since", f"'since' must be a number of seconds, got {clip(raw)}.")
    recent = state.metrics.recent
    # NOTE: request ids become tenant names here; the ids themselves stay out of the answer,
    # which the admin page polls twice a second.
    events = [{**{k: v for k, v in e.items() if k != "requests"},
               "tenants": sorted({recent.owner(r) or "?" for r in e.get("requests", ())})}
              for e in state.engine.scheduler.timeline(since)]
    return json_response({"now": time.monotonic(), "since": since, "events": events,
                          "requests": recent.finished_since(since)})


@router.post("/admin/direct")
async def admin_direct(request: Request) -> Response:
    """A /v1/completions body's operator chain (its `model`'s; a LoRA adapter's: its base
    model's with the adapter) timed directly on a device's executor thread (`?device=`,
    default the first that model runs on), with no serving path around it: the baseline
    that `loadgen probe --overhead` pairs with each request. The device runs nothing else
    meanwhile."""
    state = state_of(request)
    authorize_admin(state.tenants.current, request.headers.get("authorization"))
    body = parse_completion(parse_json(await request.body()), 1)
    check_model(state.engine, body.options.model)
    model, adapters = body.options.model, state.engine.adapters
    adapter = model if not state.engine.serves(model) else None  # NOTE: check_model: loaded
    base = adapters.base_of(adapter) if adapter is not None else \
        model if model in state.engine.base_models else ""
    engine = state.engine.of(base)  # NOTE: the named model's chain and tokenizer
    [prompt] = tokenize_completion(engine, body.prompts, body.suffix)
    max_tokens = resolve_max_tokens(body.options, len(prompt), engine.max_model_len,
                                    chat=False)
    lease = adapters.acquire(adapter)  # NOTE: an unload waits for the run, as for a request
    try:
        t = await state.engine.scheduler.time_direct(prompt, max_tokens,
                                                     request.query_params.get("device"), base,
                                                     adapter)
    except DirectUnavailable as e:
        raise invalid(e.param, str(e)) from None
    finally:
        lease.release()
    return json_response({"device": t.device, "prompt_tokens": len(prompt),
                          "max_tokens": max_tokens, "first_token_s": t.first_token_s,
                          "total_s": t.total_s})
