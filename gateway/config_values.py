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
    `{"name": ..., "path": ...}` is taken too) -> a validated dict, in order."""
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, list | tuple):
        pairs = [_lora_pair(item) for item in value]
    else:
        raise ConfigError("model.lora: a mapping of NAME: PATH, or a list of NAME=PATH")
    out: dict[str, str] = {}
    for name, path in pairs:
        require(isinstance(name, str) and bool(ADAPTER_NAME.fullmatch(name)), "model.lora",
                 f"adapter name {name!r}: {NAME_RULE}")
        require(isinstance(path, str) and bool(path.strip()), "model.lora",
                 f"adapter {name!r}: its path must be a non-empty string")
        require(name not in out, "model.lora", f"adapter {name!r} is named twice")
        out[name] = path.strip()
    return out


def _lora_pair(item: Any) -> tuple[Any, Any]:
    if isinstance(item, str) and item.lstrip().startswith("{"):
        try:
            item = json.loads(item)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"model.lora: {item!r} is not JSON: {exc}") from None
    if isinstance(item, Mapping):
        return item.get("name"), item.get("path")
    if isinstance(item, str) and "=" in item:
        name, _, path = item.partition("=")
        return name.strip(), path
    raise ConfigError(f"model.lora: {item!r}: use NAME=PATH")
