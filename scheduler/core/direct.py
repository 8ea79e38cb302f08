"""A request's operator chain timed directly on a device's executor thread.

The baseline that `python -m loadgen probe --overhead` pairs with each request
through the serving path: the same prompt run as one greedy request straight
through the operators (`models.generate.timed_request`: batch building, the
operators, sampling; KV in a small cache of its own, not the pool), with no
HTTP, scheduling or streaming around it. It runs on the thread that runs the
device's ops, before its next op, so both sides of the difference meet the same
process, thread and moment of the machine. The device does nothing else meanwhile.
A LoRA adapter's request runs its base model's chain with the adapter's rows applied,
as in a served batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import torch

from models.generate import timed_request
from models.loader import Model
from models.lora.adapter import AdapterError
from models.modelset import ModelSet
from scheduler.api import DirectTiming, DirectUnavailable
from scheduler.core.execution import Execution


async def time_direct(execution: Execution, model: Model, devices: Sequence[str],
                      prompt_ids: list[int], max_tokens: int, block_size: int,
                      device: str | None = None, member: str = "",
                      adapter: str | None = None) -> DirectTiming:
    """See `SchedulerAPI.time_direct`; `model` the scheduler's (a set: `member`'s chain)."""
    chain, label = model, ""
    if isinstance(model, ModelSet):
        try:
            m = model.member(member)
        except KeyError:
            raise DirectUnavailable(f"This server serves no model {member!r}.", "model") from None
        chain, label = m.model, f"Model {m.name!r} "
        devices = [d for d in devices if m.runs_on(d)]
    elif member:
        raise DirectUnavailable(f"This server serves one unnamed model, not {member!r}.",
                                "model")
    if adapter is not None and adapter not in chain.adapters:
        raise DirectUnavailable(f"{label or 'The model '}has no LoRA adapter {adapter!r} "
                                "loaded.", "model")
    name = device or devices[0]
    if name not in devices:
        raise DirectUnavailable(f"{label or 'This server '}has no device {name!r}; it "
                                f"{'runs on' if label else 'has'} {', '.join(devices)}.")
    if not execution.alive(name):
        raise DirectUnavailable(f"Device {name} is down.")

    def timed(on: torch.device) -> tuple[float, float]:
        return timed_request(chain, prompt_ids, max_tokens, block_size, on, adapter)

    future = execution.call_on(name, timed)
    if future is None:
        raise DirectUnavailable(f"Device {name} runs no executor thread in this process.")
    try:
        first, total = await asyncio.wrap_future(future)
    except AdapterError as e:  # NOTE: unloaded meanwhile (the gateway holds a lease on it)
        raise DirectUnavailable(f"LoRA adapter {adapter!r}: {e}.", "model") from None
    return DirectTiming(name, first, total)
