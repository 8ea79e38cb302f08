"""What a request's `model` names: a base model or a LoRA adapter (on its base model), as its
tenant may use them; and `/v1/models`' list of them.

A request without `model` runs on its tenant's `default_model`, else on the
base model (vLLM's behaviour; OpenAI requires the field). A name nobody serves
is 404 `model_not_found`; a served one the tenant's `models` list leaves out is
403 `model_not_allowed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.adapters import not_found
from gateway.engine import Engine
from gateway.errors import ApiError, clip
from gateway.tenants import Tenant


@dataclass(frozen=True, slots=True)
class Target:
    """The model a request runs on."""

    model: str  # the name responses echo: the served model's name, or the adapter's
    adapter: str | None = None  # the LoRA adapter (Request.adapter); None: the base model
    base: str = ""  # the base model of several (Request.model); "": the first or only one


def resolve_model(engine: Engine, tenant: Tenant, model: str | None) -> Target:
    """The target of a request's `model` for `tenant` (ApiError 404 / 403)."""
    name = model if model is not None else tenant.default_model
    if name is not None and name in engine.base_models:
        target, names = Target(name, base=name), {name}
    elif name is None or engine.serves(name):
        target = Target(engine.served_model_name)
        names = {engine.served_model_name, *engine.model_aliases}
    elif name in engine.adapters:
        target, names = Target(name, name, engine.adapters.base_of(name)), {name}
    else:
        raise not_found(name)
    if not tenant.may_use(*names):
        raise ApiError(403, f"Tenant {tenant.name!r} may not use the model {clip(name)}.",
                       param="model", code="model_not_allowed")
    return target


def model_cards(engine: Engine, tenant: Tenant | None) -> list[dict[str, Any]]:
    """`/v1/models`' entries in vLLM's shape: the base models, then every adapter (`root` its
    folder, `parent` its base model); only those `tenant` may use (None: an admin, all)."""
    base = engine.served_model_name
    cards = []
    if tenant is None or tenant.may_use(base, *engine.model_aliases):
        cards.append({"id": base, "object": "model", "created": engine.created,
                      "owned_by": "slicegate", "root": engine.root or base, "parent": None,
                      "max_model_len": engine.max_model_len,
                      "sampling_defaults": engine.sampling_defaults.as_dict()})
    for name in engine.base_models:
        if tenant is None or tenant.may_use(name):
            member = engine.of(name)
            cards.append({"id": name, "object": "model", "created": engine.created,
                          "owned_by": "slicegate", "root": member.root or name,
                          "parent": None, "max_model_len": member.max_model_len,
                          "sampling_defaults": member.sampling_defaults.as_dict()})
    for name, path in engine.adapters.served().items():
        if tenant is None or tenant.may_use(name):
            parent = engine.adapters.base_of(name)
            cards.append({"id": name, "object": "model", "created": engine.created,
                          "owned_by": "slicegate", "root": path, "parent": parent or base,
                          "max_model_len": engine.of(parent).max_model_len})
    return cards
