"""vLLM's run-time LoRA endpoints: `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`.

Admin keys only (`authorize_admin`). Answers as vLLM's: a plain-text
`Success: ...` line, or an OpenAI-style error: 400 for a bad body, a taken name
or a folder that is not an adapter of the base model (with the reason), 404
for unloading an adapter that is not loaded, 409 for loading a name whose
unloaded adapter still has requests in flight. No restart: requests in flight
on an unloaded adapter finish on it (`gateway.adapters`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import PlainTextResponse, Response

from gateway.adapters import ADAPTER_NAME, NAME_RULE
from gateway.errors import clip, invalid
from gateway.protocol import parse_json
from gateway.state import state_of
from gateway.tenants import authorize_admin

router = APIRouter()



def _string(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value.strip():
        raise invalid(key, f"'{key}' is required: a non-empty string, got {clip(value)}.")
    return value.strip()


def _adapter_name(body: dict[str, Any]) -> str:
    name = _string(body, "lora_name")
    if not ADAPTER_NAME.fullmatch(name):
        raise invalid("lora_name", f"Invalid 'lora_name' {clip(name)}: {NAME_RULE}.")
    return name


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request) -> Response:
    """Load the PEFT adapter in folder `lora_path` (on the server) as model `lora_name`, on
    base model `base_model_name` when the body names one (slicegate's; vLLM's key of
    `--lora-modules`), else on the one its folder names or the first it fits."""
    state = state_of(request)
    authorize_admin(state.tenants.current, request.headers.get("authorization"))
    body = parse_json(await request.body())
    name, path = _adapter_name(body), _string(body, "lora_path")
    base = _string(body, "base_model_name") if "base_model_name" in body else None
    await state.engine.adapters.load(name, path, base)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> Response:
    """Stop serving adapter `lora_name`: new requests on it get 404 at once; those in flight
    finish, and the last one frees its memory."""
    state = state_of(request)
    authorize_admin(state.tenants.current, request.headers.get("authorization"))
    body = parse_json(await request.body())
    name = _string(body, "lora_name")
    state.engine.adapters.unload(name)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
