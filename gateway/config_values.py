"""The values of the gateway's config that need parsing: devices, queue bounds, LoRA
adapters; and the checks (`require`) and the error (`ConfigError`) every section uses.

The frozen sections themselves, and loading them, are in gateway/config.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gateway.adapters import ADAPTER_NAME, NAME_RULE
from scheduler import factory


class ConfigError(ValueError):
    """An invalid configuration value or file; the message names the key."""


def default_devices() -> tuple[str, ...]:
    """Every GPU, or two virtual CPU devices on a machine without one."""
    return tuple(factory.default_devices())


def parse_devices(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """`"cuda:0,cuda:1"` or a list -> a validated tuple of device names."""
    try:
        return tuple(factory.device_names(value))
    except ValueError as e:
        raise ConfigError(f"scheduler.devices: {e}") from None


def require(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {problem}")


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


QUEUE_KEYS = ("high", "normal", "low", "total")


def parse_queue_bounds(value: Any, key: str) -> dict[str, int] | None:
    """None, N (every class and the total) or `high=N,low=N,...` / a mapping -> a dict."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        items: dict[str, Any] = dict.fromkeys(QUEUE_KEYS, value)
    elif isinstance(value, str) and value.strip().isdigit():
        items = dict.fromkeys(QUEUE_KEYS, int(value))
    elif isinstance(value, str):
        pairs = [p.partition("=") for p in value.split(",") if p.strip()]
        items = {k.strip(): v.strip() for k, _, v in pairs}
    elif isinstance(value, dict):
        items = dict(value)
    else:
        raise ConfigError(f"{key}: N or 'high=N,normal=N,low=N,total=N'")
    out: dict[str, int] = {}
    for name, n in items.items():
        require(name in QUEUE_KEYS, key, f"unknown class {name!r} (use {', '.join(QUEUE_KEYS)})")
        try:
            out[name] = int(n)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: {name} must be an integer, got {n!r}") from None
        require(out[name] >= 0 and not isinstance(n, bool), key, f"{name} must be >= 0")
    return out


def parse_lora(value: Any) -> dict[str, str]:
    """`{NAME: PATH}` or `["NAME=PATH", ...]` (vLLM's --lora-modules, whose JSON form
    `{"name": ..., "path": ..., "base_model_name": ...}` is taken too; in a mapping a value may
    be `{path, base_model_name}`) -> a validated dict name -> path, in order."""
    out: dict[str, str] = {}
    for name, path, _ in _lora_triples(value):
        require(isinstance(name, str) and bool(ADAPTER_NAME.fullmatch(name)), "model.lora",
                 f"adapter name {name!r}: {NAME_RULE}")
        require(isinstance(path, str) and bool(path.strip()), "model.lora",
                 f"adapter {name!r}: its path must be a non-empty string")
        require(name not in out, "model.lora", f"adapter {name!r} is named twice")
        out[name] = path.strip()
    return out


def parse_lora_bases(value: Any) -> dict[str, str]:
    """The adapters of `model.lora` (as `parse_lora` reads it) that name their base model
    (`base_model_name`, vLLM's key) -> that name."""
    out: dict[str, str] = {}
    for name, _, base in _lora_triples(value):
        if base is not None:
            require(isinstance(base, str) and bool(base.strip()), "model.lora",
                     f"adapter {name!r}: base_model_name must be a non-empty string")
            out[name] = base.strip()
    return out


def _lora_triples(value: Any) -> list[tuple[Any, Any, Any]]:
    if isinstance(value, Mapping):
        return [_lora_triple({"name": k, **v} if isinstance(v, Mapping) else f"{k}={v}")
                if isinstance(k, str) and isinstance(v, str | Mapping) else (k, v, None)
                for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [_lora_triple(item) for item in value]
    raise ConfigError("model.lora: a mapping of NAME: PATH, or a list of NAME=PATH")


def _lora_triple(item: Any) -> tuple[Any, Any, Any]:
    if isinstance(item, str) and item.lstrip().startswith("{"):
        try:
            item = json.loads(item)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"model.lora: {item!r} is not JSON: {exc}") from None
    if isinstance(item, Mapping):
        unknown = set(item) - {"name", "path", "base_model_name"}
        require(not unknown, "model.lora", f"unknown key(s) {', '.join(sorted(unknown))}")
        return item.get("name"), item.get("path"), item.get("base_model_name")
    if isinstance(item, str) and "=" in item:
        name, _, path = item.partition("=")
        return name.strip(), path, None
    raise ConfigError(f"model.lora: {item!r}: use NAME=PATH")
