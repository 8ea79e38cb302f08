"""The gateway's LoRA adapters over the loaded models: `ModelAdapters` (the `AdapterHost` of
`gateway.adapters`, each adapter on its base model) and the adapters named at start-up
(`--lora NAME=PATH`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.adapters import Adapters, NoAdapters
from gateway.errors import ApiError
from models.lora import AdapterError, load_peft_adapter
from models.modelset import ModelSet
from scheduler.api import SchedulerAPI
from scheduler.scheduler import Scheduler

if TYPE_CHECKING:
    from models import Model

logger = logging.getLogger("gateway")


class AdapterStartupError(ValueError):
    """An adapter named at start-up that cannot be served; the message names it and why."""


class ModelAdapters:
    """Adapters read from PEFT folders into the adapter set (`models.lora.AdapterSet`) of their
    base model, which holds them to the scheduler's LoRA memory reserve on its devices.

    `names` gives, per base model (a `Target.base`: "" for the first, else the member's
    name), the names that identify it: its served names, its spec, its folder. NOTE: which
    base an adapter runs on, as vLLM users expect of `base_model_name`: the one named
    explicitly (`--lora-modules '{"name", "path", "base_model_name"}'`, `model.lora`'s
    `base_model_name`, or the load body's); else, with several models, the ones its
    `adapter_config.json` `base_model_name_or_path` names (a hub id or a folder); else
    every model, in order. The first of those whose shapes it fits takes it.
    """

    def __init__(self, model: Model, names: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self.model = model
        self.names = dict(names or {"": ()})
        self.scheduler: Scheduler | None = None  # set once built (`watch`)

    def watch(self, scheduler: SchedulerAPI) -> None:
        """Ask `scheduler` (when it is the local one) whether it still runs an adapter."""
        self.scheduler = scheduler if isinstance(scheduler, Scheduler) else None

    def busy(self, name: str) -> bool:
        return self.scheduler is not None and self.scheduler.requests_on_adapter(name) > 0

    def add(self, name: str, path: str, base: str | None = None) -> str:
        errors: list[str] = []
        for key in self._candidates(path, base):
            model = self._model(key)
            try:
                adapter = load_peft_adapter(name, path, model)
            except OSError as exc:  # NOTE: an unreadable folder is the caller's problem, a 400
                raise ValueError(f"adapter {name!r}: {path} does not read: {exc}") from None
            except AdapterError as exc:
                errors.append(str(exc) if not errors else f"nor model {self._label(key)!r}'s")
                continue
            model.adapters.add(adapter)
            return key
        raise ValueError("; ".join(errors))

    def remove(self, name: str) -> None:
        for key in self.names:
            adapters = self._model(key).adapters
            if name in adapters:
                adapters.remove(name)
                return
        raise ValueError(f"no adapter named {name!r} is loaded")

    def _label(self, key: str) -> str:
        return (self.names.get(key) or (key,))[0]

    def _model(self, key: str) -> Model:
        return self.model.member(key).model if isinstance(self.model, ModelSet) else self.model

    def _candidates(self, path: str, base: str | None) -> list[str]:
        """The base models to try, in order (ValueError for a `base` nobody serves)."""
        if base is not None:
            key = next((k for k, names in self.names.items() if base in names), None)
            if key is None:
                raise ValueError(f"base model {base!r} is not served (served: "
                                 f"{', '.join(n[0] for n in self.names.values() if n)})")
            return [key]
        named = _named_base(path)
        if len(self.names) == 1 or named is None:
            return list(self.names)
        matched = [k for k in self.names if _identifies(named, self.names[k], self._model(k))]
        return matched or list(self.names)


def _named_base(path: str) -> str | None:
    """`base_model_name_or_path` of the adapter in folder `path`; None when unread or unset."""
    try:
        value = json.loads((Path(path).expanduser() / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    named = value.get("base_model_name_or_path") if isinstance(value, dict) else None
    return named if isinstance(named, str) and named else None


def _identifies(named: str, names: tuple[str, ...], model: Model) -> bool:
    """Whether `named` (an adapter's `base_model_name_or_path`) is `model`: one of its
    `names`, its name, or its folder."""
    if named in names or named == model.name:
        return True
    folder = Path(named).expanduser()
    return folder.is_dir() and folder.resolve() == Path(model.path).resolve()


def startup_adapters(host: ModelAdapters | NoAdapters, lora: Mapping[str, str],
                     reserved: tuple[str, ...],
                     bases: Mapping[str, str] | None = None) -> Adapters:
    """The registry of a server starting, with `lora` (name -> folder) loaded, in order, each
    on its base model of `bases` (name -> a base model's name; absent: the host picks);
    AdapterStartupError for the first that cannot be."""
    adapters = Adapters(host, reserved)
    for name, path in lora.items():
        try:
            adapters.load_now(name, path, (bases or {}).get(name))
        except ApiError as exc:
            raise AdapterStartupError(f"--lora {name}={path}: {exc.message}") from None
    if lora:
        logger.info("LoRA adapters: %s", ", ".join(lora))
    return adapters
