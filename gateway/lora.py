"""The gateway's LoRA adapters over a loaded model: `ModelAdapters` (the `AdapterHost` of
`gateway.adapters`) and the adapters named at start-up (`--lora NAME=PATH`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gateway.adapters import Adapters, NoAdapters
from gateway.errors import ApiError
from models.lora import load_peft_adapter
from scheduler.api import SchedulerAPI
from scheduler.scheduler import Scheduler

if TYPE_CHECKING:
    from models import Model

logger = logging.getLogger("gateway")


class AdapterStartupError(ValueError):
    """An adapter named at start-up that cannot be served; the message names it and why."""


class ModelAdapters:
    """Adapters read from PEFT folders into `model.adapters` (`models.lora.AdapterSet`),
    which holds them to the scheduler's LoRA memory reserve."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.scheduler: Scheduler | None = None  # set once built (`watch`)

    def watch(self, scheduler: SchedulerAPI) -> None:
        """Ask `scheduler` (when it is the local one) whether it still runs an adapter."""
        self.scheduler = scheduler if isinstance(scheduler, Scheduler) else None

    def busy(self, name: str) -> bool:
        return self.scheduler is not None and self.scheduler.requests_on_adapter(name) > 0

    def add(self, name: str, path: str) -> None:
        try:
            adapter = load_peft_adapter(name, path, self.model)
        except OSError as exc:  # NOTE: an unreadable folder is the caller's problem, a 400
            raise ValueError(f"adapter {name!r}: {path} does not read: {exc}") from None
        self.model.adapters.add(adapter)

    def remove(self, name: str) -> None:
        self.model.adapters.remove(name)


def startup_adapters(host: ModelAdapters | NoAdapters, lora: Mapping[str, str],
                     reserved: tuple[str, ...]) -> Adapters:
    """The registry of a server starting, with `lora` (name -> folder) loaded, in order
    (AdapterStartupError for the first that cannot be)."""
    adapters = Adapters(host, reserved)
    for name, path in lora.items():
        try:
            adapters.load_now(name, path)
        except ApiError as exc:
            raise AdapterStartupError(f"--lora {name}={path}: {exc.message}") from None
    if lora:
        logger.info("LoRA adapters: %s", ", ".join(lora))
    return adapters
