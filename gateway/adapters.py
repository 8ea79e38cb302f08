"""The LoRA adapters the gateway serves by name, loaded and unloaded at run time.

`Adapters` keeps, per adapter, its folder and how many requests run on it.
Unloading an adapter hides it at once (new requests on it get 404), but its
weights leave the model only when the last request in flight on it ends: a
request holds an `AdapterLease` from admission to `Job.finish`. NOTE: a job can
end before the scheduler has let go of its requests (an aborted request whose
plan, shared with others, is still running); the removal then waits until the
host is no longer `busy` with it, checked at the registry's next call.

The model side (reading a PEFT folder, the adapters' memory, running their rows
in a batch) is behind `AdapterHost`; `gateway/lora.py` wires it to a loaded
`models.Model`. Loading runs in a worker thread (it reads files and builds the
adapters' stacked weights), so the event loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from dataclasses import dataclass
from typing import Protocol

from gateway.errors import ApiError, clip

logger = logging.getLogger("gateway")

ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")  # fits a `model` as is
NAME_RULE = "1 to 128 letters, digits or . _ : / @ + -, starting with a letter or digit"


class AdapterHost(Protocol):
    """Where adapters run: a model's adapter set and the loader of its PEFT folders."""

    def add(self, name: str, path: str, base: str | None = None) -> str:
        """Read the adapter in folder `path` as `name` and serve it from now on on base model
        `base` (None: the one its folder names, or the first it fits); the base model chosen
        (a `Target.base`: "" for the first). ValueError (the core's AdapterError) saying why
        it cannot."""

    def remove(self, name: str) -> None:
        """Stop serving `name` and free its memory."""

    def busy(self, name: str) -> bool:
        """Whether the scheduler still holds a request on `name` (an aborted one whose plan
        is still in flight, say): its removal waits."""


class NoAdapters:
    """The host of a server that runs no adapters (e.g. a fake scheduler, a Ray cluster)."""

    def __init__(self, reason: str = "this server serves no LoRA adapters") -> None:
        self.reason = reason

    def add(self, name: str, path: str, base: str | None = None) -> str:
        raise ValueError(self.reason)

    def remove(self, name: str) -> None:
        raise ValueError(f"no adapter named {name!r} is loaded")

    def busy(self, name: str) -> bool:
        return False


@dataclass(slots=True)
class _Entry:
    path: str
    base: str = ""  # its base model (a `Target.base`: "" for the first)
    in_flight: int = 0  # requests holding a lease
    unloading: bool = False  # hidden; removed from the host when in_flight reaches 0


class AdapterLease:
    """A request's hold on its adapter (none for the base model); `release` is idempotent."""

    def __init__(self, adapters: Adapters | None, name: str | None) -> None:
        self._adapters, self.name = adapters, name
        self.released = adapters is None or name is None

    def release(self) -> None:
        if not self.released:
            self.released = True
            assert self._adapters is not None and self.name is not None
            self._adapters.release(self.name)


class Adapters:
    """The served adapters by name: load, unload, and the leases of requests in flight.

    Thread-safe (the Batch API and the HTTP routes share it). Names must differ
    from the base model's names (`reserved`), which it checks on `load`.
    """

    def __init__(self, host: AdapterHost | None = None, reserved: tuple[str, ...] = ()) -> None:
        self.host: AdapterHost = host or NoAdapters()
        self.reserved = reserved
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._loading: set[str] = set()
        self._pending: set[str] = set()  # unloaded, released, but the scheduler still busy

    def served(self) -> dict[str, str]:
        """name -> folder of the adapters requests may name now, in load order."""
        self._sweep()
        with self._lock:
            return {n: e.path for n, e in self._entries.items() if not e.unloading}

    def base_of(self, name: str) -> str:
        """The base model adapter `name` runs on ("": the first; also for an unknown name)."""
        with self._lock:
            entry = self._entries.get(name)
            return "" if entry is None else entry.base

    def __contains__(self, name: object) -> bool:
        with self._lock:
            entry = self._entries.get(name) if isinstance(name, str) else None
            return entry is not None and not entry.unloading

    def in_flight(self, name: str) -> int:
        """Requests running on `name` (an adapter being unloaded included); 0 when unknown."""
        with self._lock:
            entry = self._entries.get(name)
            return 0 if entry is None else entry.in_flight

    # ---- requests ------------------------------------------------------------------------

    def acquire(self, name: str | None) -> AdapterLease:
        """A lease on adapter `name` for one request (None: the base, nothing held); 404
        `model_not_found` when it is not served (any more)."""
        if name is None:
            return AdapterLease(None, None)
        self._sweep()
        with self._lock:
            entry = self._entries.get(name)
            if entry is None or entry.unloading:
                raise not_found(name)
            entry.in_flight += 1
        return AdapterLease(self, name)

    def release(self, name: str) -> None:
        """One request on `name` ended; the last one of an unloaded adapter removes it."""
        with self._lock:
            entry = self._entries[name]
            entry.in_flight -= 1
            done = entry.unloading and entry.in_flight == 0
            if done:
                del self._entries[name]
        if done:
            self._remove(name)

    # ---- load and unload -----------------------------------------------------------------

    def load_now(self, name: str, path: str, base: str | None = None) -> None:
        """Load adapter `name` from folder `path` on base model `base` (None: the host picks,
        see `AdapterHost.add`), blocking; ApiError 400 when the name is taken or the folder
        is not an adapter of the base model."""
        self._sweep()
        with self._lock:
            self._check_free(name)
            self._loading.add(name)
        try:
            chosen = self.host.add(name, path, base)
        except ValueError as exc:
            raise ApiError(400, f"Cannot load LoRA adapter {clip(name)}: {exc}",
                           param="lora_path", code="invalid_lora_adapter") from None
        finally:
            with self._lock:
                self._loading.discard(name)
        with self._lock:
            self._entries[name] = _Entry(path, chosen)
        logger.info("LoRA adapter %r loaded from %s%s", name, path,
                    f" on model {chosen!r}" if chosen else "")

    async def load(self, name: str, path: str, base: str | None = None) -> None:
        """`load_now` in a worker thread."""
        await asyncio.to_thread(self.load_now, name, path, base)

    def unload(self, name: str) -> int:
        """Hide adapter `name` from new requests; it is removed now, or when the last of its
        requests in flight ends. Returns how many are still in flight; 404 when unknown."""
        self._sweep()
        with self._lock:
            entry = self._entries.get(name)
            if entry is None or entry.unloading:
                raise ApiError(404, f"The LoRA adapter {clip(name)} cannot be found.",
                               param="lora_name", code="lora_adapter_not_found")
            entry.unloading = True
            pending = entry.in_flight
            if pending == 0:
                del self._entries[name]
        if pending == 0:
            self._remove(name)
        else:
            logger.info("LoRA adapter %r unloaded; it leaves memory when its %d request(s) "
                        "in flight end", name, pending)
        return pending

    def _check_free(self, name: str) -> None:
        if name in self.reserved:
            raise ApiError(400, f"The LoRA adapter name {clip(name)} is the base model's name.",
                           param="lora_name", code="invalid_lora_adapter")
        entry = self._entries.get(name)
        if name in self._pending:
            raise ApiError(409, f"The LoRA adapter {clip(name)} is being unloaded: the "
                                "scheduler has not let go of its last request yet.",
                           param="lora_name", code="lora_adapter_unloading",
                           type="invalid_request_error")
        if name in self._loading or (entry is not None and not entry.unloading):
            raise ApiError(400, f"The LoRA adapter {clip(name)} has already been loaded.",
                           param="lora_name", code="lora_adapter_exists")
        if entry is not None:
            raise ApiError(409, f"The LoRA adapter {clip(name)} is being unloaded: its "
                                f"{entry.in_flight} request(s) in flight have not ended yet.",
                           param="lora_name", code="lora_adapter_unloading",
                           type="invalid_request_error")

    def _sweep(self) -> None:
        """Remove the pending adapters the scheduler has let go of."""
        if not self._pending:
            return
        with self._lock:
            pending, self._pending = self._pending, set()
        for name in pending:
            self._remove(name)

    def _remove(self, name: str) -> None:
        """Remove `name` from the host now, or keep it pending while the host is busy."""
        try:
            if self.host.busy(name):
                with self._lock:
                    self._pending.add(name)
                return
            self.host.remove(name)
        except Exception:  # NOTE: never fail the request whose end triggered it
            logger.exception("removing LoRA adapter %r from the model failed", name)
            return
        logger.info("LoRA adapter %r removed; its memory is free", name)


def not_found(model: str | None) -> ApiError:
    """404 `model_not_found`, OpenAI's answer to a `model` nobody serves."""
    return ApiError(404, f"The model {clip(model)} does not exist.", param="model",
                    code="model_not_found")
