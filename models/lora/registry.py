"""`AdapterSet`: the LoRA adapters a loaded model serves, changed at run time."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import torch

from models.lora.adapter import AdapterError, LoraAdapter
from models.lora.stack import LoraRows, LoraStack, Shapes


class AdapterSeq(Protocol):
    """What the set reads of a batch's sequence (`models.batch.SeqSpec`)."""

    @property
    def adapter(self) -> str | None: ...

    @property
    def token_ids(self) -> list[int]: ...  # its rows in the batch, one per token


class AdapterSet:
    """The adapters of one model, by name; thread-safe.

    `add` and `remove` build a new `LoraStack` and swap it in; a batch resolves
    its rows once (`rows`) and holds that stack, so removing an adapter never
    breaks a batch already running. Waiting for requests in flight on an
    adapter before removing it is the caller's job.

    Memory: an adapter costs its own tensors plus its columns in the stack
    (`cost_bytes`); `limit` caps the total (the scheduler reserves that much on
    every device at start-up), and `add` refuses what would not fit, with the
    numbers.
    """

    def __init__(self, shapes: Shapes, num_layers: int, dtype: torch.dtype) -> None:
        self.shapes, self.num_layers, self.dtype = shapes, num_layers, dtype
        self.capacity_bytes: int | None = None  # None: no limit (set by `limit`)
        self.refusal: str | None = None  # why this model takes no adapters (e.g. Ray)
        self._lock = threading.Lock()
        self._adapters: dict[str, LoraAdapter] = {}
        self._stack: LoraStack | None = None
        self._on_device: dict[str, LoraStack] = {}

    def cost_bytes(self, adapter: LoraAdapter) -> int:
        """The memory `adapter` takes once added (pure)."""
        return adapter.nbytes + LoraStack.nbytes_of(adapter, self.shapes, self.num_layers)

    def memory_bytes(self) -> int:
        """Bytes the loaded adapters take (their tensors and the stack)."""
        with self._lock:
            return sum(self.cost_bytes(ad) for ad in self._adapters.values())

    def limit(self, capacity_bytes: int) -> None:
        """Cap the adapters' memory from now on (the scheduler's reserve)."""
        with self._lock:
            self.capacity_bytes = capacity_bytes

    def refuse(self, reason: str) -> None:
        """Take no adapters from now on, saying `reason` (e.g. executors that cannot run
        them); AdapterError if some are loaded already."""
        with self._lock:
            if self._adapters:
                raise AdapterError(f"{reason} (loaded: {', '.join(self._adapters)})")
            self.refusal = reason

    def can_add(self, adapter: LoraAdapter) -> str | None:
        """Why `adapter` cannot be added now, or None (pure)."""
        with self._lock:
            return self._why_not(adapter)

    def _why_not(self, adapter: LoraAdapter) -> str | None:
        if self.refusal is not None:
            return self.refusal
        if adapter.name in self._adapters:
            return f"an adapter named {adapter.name!r} is already loaded"
        if adapter.dtype != self.dtype:
            return f"adapter {adapter.name!r} is {adapter.dtype}, the model {self.dtype}"
        used = sum(self.cost_bytes(ad) for ad in self._adapters.values())
        need = self.cost_bytes(adapter)
        if self.capacity_bytes is not None and used + need > self.capacity_bytes:
            return (f"adapter {adapter.name!r} needs {need / 2**20:.2f} MiB; the adapters' "
                    f"reserve of {self.capacity_bytes / 2**20:.2f} MiB has "
                    f"{(self.capacity_bytes - used) / 2**20:.2f} MiB free (raise the LoRA "
                    f"memory reserve or unload an adapter)")
        return None

    def add(self, adapter: LoraAdapter) -> None:
        """Serve `adapter` from now on (AdapterError when `can_add` says why not)."""
        with self._lock:
            why = self._why_not(adapter)
            if why is not None:
                raise AdapterError(why)
            self._swap({**self._adapters, adapter.name: adapter})

    def remove(self, name: str) -> LoraAdapter:
        """Stop serving `name` (batches already running keep it); returns it."""
        with self._lock:
            if name not in self._adapters:
                raise AdapterError(f"no adapter named {name!r} is loaded")
            adapter = self._adapters[name]
            self._swap({k: v for k, v in self._adapters.items() if k != name})
            return adapter

    def _swap(self, adapters: dict[str, LoraAdapter]) -> None:
        stack = None
        if adapters:
            stack = LoraStack.build(list(adapters.values()), self.shapes, self.num_layers,
                                    self.dtype)
        self._adapters, self._stack, self._on_device = adapters, stack, {}

    def get(self, name: str) -> LoraAdapter | None:
        with self._lock:
            return self._adapters.get(name)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._adapters

    def names(self) -> list[str]:
        """Loaded adapters, in the order they were added."""
        with self._lock:
            return list(self._adapters)

    def _stack_on(self, device: torch.device) -> LoraStack | None:
        with self._lock:
            stack = self._stack
            if stack is None or device.type == "cpu":
                return stack
            key = str(device)
            if key not in self._on_device:
                self._on_device[key] = stack.to(device)
            return self._on_device[key]

    def rows(self, seqs: Sequence[AdapterSeq], device: torch.device) -> LoraRows:
        """The adapter rows of a batch of `seqs` over the current stack on `device`
        (AdapterError when a sequence names an adapter that is not loaded)."""
        stack = self._stack_on(device)
        ids = {n: i for i, n in enumerate(stack.names, start=1)} if stack else {}
        missing = sorted({s.adapter for s in seqs if s.adapter is not None
                          and s.adapter not in ids})
        if missing or stack is None:
            raise AdapterError(f"adapter {', '.join(map(repr, missing))} is not loaded")
        per_seq = torch.tensor([0 if s.adapter is None else ids[s.adapter] for s in seqs])
        lens = torch.tensor([len(s.token_ids) for s in seqs])
        row_ids = per_seq.repeat_interleave(lens).to(device)  # [T]
        return LoraRows.build(stack, row_ids)
