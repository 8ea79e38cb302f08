"""`model.models`: several base models served by one server and one scheduler (docs/models.md).

In a config file::

    model:
      models:
        - {name: chat, spec: default, devices: [cpu:0]}
        - {name: batch, spec: default, dtype: float32}
        - {name: small, spec: tiny-random-qwen2, kv_share: 0.5}

or on the command line `--model chat=default@cpu:0 --model batch=default,dtype=float32`
(repeated; `@DEVICE,...` names its devices, then `,dtype=D` and `,kv_share=S` may follow). A
request's `model` picks one by name; the first is what requests without `model`
(and tenants without `default_model`) run on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.adapters import ADAPTER_NAME, NAME_RULE

MODEL_DTYPES = ("bfloat16", "float32")


class ModelEntryError(ValueError):
    """A `model.models` entry that is not valid (the config turns it into a ConfigError)."""


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One base model of a server of several."""

    name: str  # what requests' `model` says
    spec: str  # models.load spec: "default", a folder or a hub id
    dtype: str | None = None  # None: `model.dtype`
    devices: tuple[str, ...] | None = None  # the devices it runs on; None: every device
    kv_share: float = 1.0  # its weight in the split of a device's KV room (docs/models.md)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not ADAPTER_NAME.fullmatch(self.name):
            raise ModelEntryError(f"model name {self.name!r}: {NAME_RULE}")
        if not isinstance(self.spec, str) or not self.spec.strip():
            raise ModelEntryError(f"model {self.name!r}: its spec must be a non-empty string")
        if self.dtype is not None and self.dtype not in MODEL_DTYPES:
            raise ModelEntryError(f"model {self.name!r}: dtype must be one of "
                                  f"{', '.join(MODEL_DTYPES)}")
        if self.devices is not None and (not self.devices or not all(
                isinstance(d, str) and d for d in self.devices)):
            raise ModelEntryError(f"model {self.name!r}: devices must be a non-empty list")
        if isinstance(self.kv_share, bool) or not isinstance(self.kv_share, int | float) or \
                not 0 < self.kv_share < math.inf:
            raise ModelEntryError(f"model {self.name!r}: kv_share must be a positive number")


def parse_models(value: Any) -> tuple[ModelEntry, ...]:
    """`[{name, spec, dtype, devices, kv_share}, ...]` or `["NAME=SPEC[@DEVICE,...][,K=V]", ...]`
    -> validated entries; () for none. ModelEntryError for a bad entry or a name given twice."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ModelEntryError("a list of {name, spec, dtype, devices} or of NAME=SPEC")
    entries = tuple(_entry(item) for item in value)
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ModelEntryError(f"a model is named twice: {', '.join(names)}")
    return entries


def _flag(item: str) -> ModelEntry:
    """`NAME=SPEC[@DEVICE,...][,dtype=D][,kv_share=S]`: a `--model` flag's entry. NOTE: the
    options come after the devices, each `KEY=VALUE`; a part without `=` is one more device
    (so a device list keeps its commas)."""
    name, _, rest = item.partition("=")
    head, *parts = rest.split(",")
    spec, at, first = head.partition("@")
    devices = [first] if at else []
    options: dict[str, str] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if eq:
            options[key.strip()] = value.strip()
        elif at and not options:
            devices.append(part)
        else:
            raise ModelEntryError(f"{item!r}: {part!r} is neither a device after '@' nor "
                                  "KEY=VALUE; use NAME=SPEC[@DEVICE,...][,dtype=D][,kv_share=S]")
    unknown = set(options) - {"dtype", "kv_share"}
    if unknown:
        raise ModelEntryError(f"{item!r}: unknown option(s) {', '.join(sorted(unknown))} "
                              "(dtype, kv_share)")
    try:
        share = float(options.get("kv_share", 1.0))
    except ValueError:
        raise ModelEntryError(f"model {name.strip()!r}: kv_share must be a positive "
                              "number") from None
    return ModelEntry(name.strip(), spec.strip(), options.get("dtype"),
                      tuple(d.strip() for d in devices) if at else None, share)


def _entry(item: Any) -> ModelEntry:
    if isinstance(item, ModelEntry):
        return item
    if isinstance(item, str) and "=" in item:
        return _flag(item)
    if isinstance(item, Mapping):
        unknown = set(item) - {"name", "spec", "dtype", "devices", "kv_share"}
        if unknown:
            raise ModelEntryError(f"unknown key(s) {', '.join(sorted(unknown))}")
        devices = item.get("devices")
        if isinstance(devices, str):
            devices = [d.strip() for d in devices.split(",")]
        return ModelEntry(item.get("name"), item.get("spec", "default"),  # type: ignore[arg-type]
                          item.get("dtype"), None if devices is None else tuple(devices),
                          item.get("kv_share", 1.0))
    raise ModelEntryError(f"{item!r}: use NAME=SPEC or {{name, spec, dtype, devices}}")
