"""The executor of a device on a Ray node: a proxy here, an actor there.

The proxy is an `Executor`: the device's queue, `pick_next` and the one op at a
time stay in the gateway process, so the scheduler and its simulator see a
remote device exactly as a local one. Running an op is a call to the device's
actor (executors/ray_actor.py), which holds the operators' weights, the KV
pool and the outputs of its ops; `(start, end)` are stamped here around the
call, so they include the hop. A transfer between two remote devices hands an
object reference from actor to actor: the SEND asks the source actor for its
output (kept in the source node's object store) and the destination actor to
pull it; the tensor never passes through the gateway process.

A lost actor (its node died, or it crashed) is noticed by the op that called
it or by the proxy's heartbeat: the device goes down, its queued ops fail with
`DeviceLost`, and the heartbeat keeps asking for the actor Ray restarts; once
the restarted actor has its weights and KV pool, the device is up again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from executors.executor import Executor, OnDone
from executors.memory import MemoryLedger
from executors.remote_kv import LayerKV, RemoteKVCache
from executors.runner import RecvNotReady
from executors.types import Device, OpInstance, OpRole

logger = logging.getLogger(__name__)

HEARTBEAT_S = 0.5  # how often the proxy asks its actor whether it is up
PING_TIMEOUT_S = 10.0  # an actor that does not answer a ping within this is lost
LOST = (RayActorError, GetTimeoutError)  # the actor (or its node) is gone


class DeviceLost(RuntimeError):
    """The device's actor or node died; its ops fail with this until it is back."""


@dataclass(slots=True)
class Remote:
    """What a proxy needs of its actor: the handle, and what to configure after a restart."""

    actor: Any  # ray ActorHandle of executors.ray_actor.DeviceActor
    num_blocks: int
    block_size: int
    peers: dict[str, RayExecutor] = field(default_factory=dict)  # every proxy, by device


class RayExecutor(Executor):
    """The proxy of one remote device (see the module doc)."""

    recovers = True
    measures_cpu = False  # the op runs in the actor; this thread waits on it

    def __init__(self, device: Device, remote: Remote, ledger: MemoryLedger, last_index: int,
                 pool: RemoteKVCache | None, on_done: OnDone,
                 loop: asyncio.AbstractEventLoop | None) -> None:
        super().__init__(device, self._unused, on_done, loop)
        self.remote, self.ledger, self.last_index = remote, ledger, last_index
        remote.peers[device.name] = self
        if pool is not None:
            pool.backend = self
        self._keys: dict[int, tuple[Any, int]] = {}  # id(BatchSource) -> (source, key)
        self._sent: set[int] = set()  # batch keys whose tensors the actor built
        self._ids = itertools.count()
        self._halt = threading.Event()
        self._watcher: threading.Thread | None = None
        self.state = "up"  # "up", or "down" (lost, waiting for the restarted actor)
        self.lost_total = 0  # times the device was lost
        self.last_error: str | None = None
        self.remote_busy_s = 0.0  # time the actor spent inside operators

    @staticmethod
    def _unused(op: OpInstance) -> None:
        raise AssertionError("RayExecutor runs ops through its actor")

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        super().start()
        self._watcher = threading.Thread(target=self._watch, name=f"ray-{self.device.name}",
                                         daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        self._halt.set()
        super().stop()
        if self._watcher is not None:
            self._watcher.join(timeout=PING_TIMEOUT_S + 1)

    def _thread_init(self) -> None:
        pass  # NOTE: the actor sets its own torch threads

    # -- running ops -----------------------------------------------------------------------
    def _prepare(self, op: OpInstance) -> bool:
        return False  # NOTE: the actor builds the batch tensors on its side

    def _run(self, op: OpInstance) -> Any:
        if not self.alive:
            raise DeviceLost(f"device {self.device.name} is down")
        try:
            if op.role is OpRole.COMPUTE:
                return self._compute(op)
            if op.role is OpRole.RECV:
                return self._recv(op)
            return self._send(op)
        except RayTaskError as e:  # the op raised inside the actor: an op fault
            raise RuntimeError(f"{op.name} failed on {self.device.name}: {e.cause!r}") from None
        except LOST as e:
            self.lose(e)
            raise DeviceLost(f"device {self.device.name} lost: {type(e).__name__}") from None

    def _compute(self, op: OpInstance) -> Any:
        assert op.batch is not None
        key, seqs = self._batch_key(op.batch)
        src = op.input.op_id if op.input is not None else None
        ref = self.remote.actor.compute.remote(op.op_id, op.template_index, key, seqs,
                                               op.batch.block_size, src,
                                               op.template_index != self.last_index)
        took, out = ray.get(ref)
        self.remote_busy_s += took
        return out

    def _batch_key(self, source: Any) -> tuple[int, Any]:
        """The actor's key of a batch, and its sequences the first time it is sent."""
        entry = self._keys.get(id(source))
        if entry is None:
            entry = self._keys[id(source)] = (source, next(self._ids))
        key = entry[1]
        if key in self._sent:
            return key, None
        self._sent.add(key)
        return key, source.seqs

    def _recv(self, op: OpInstance) -> None:
        # NOTE: the bytes count against this device until the plan is released; the
        # tensor itself arrives in the actor with the SEND
        if not self.ledger.try_reserve("activations", op.transfer_bytes):
            raise RecvNotReady(f"{op.device}: no room for {op.transfer_bytes} bytes")
        op.held_bytes = op.transfer_bytes

    def _send(self, op: OpInstance) -> None:
        assert op.input is not None and op.peer is not None
        tensor, nbytes = self.remote.actor.fetch.options(num_returns=2).remote(op.input.op_id)
        ray.get(nbytes)  # NOTE: the source's faults surface here, the tensor stays there
        peer = self.remote.peers[op.peer.device]
        try:
            ray.get(peer.remote.actor.pull.remote(op.peer.op_id, tensor))
        except LOST as e:
            peer.check()
            raise RuntimeError(f"transfer to {op.peer.device} failed: {type(e).__name__}"
                               ) from None

    def release(self, ops: list[OpInstance]) -> None:
        """A plan is over: the actor drops the outputs and batches of its ops."""
        ids, keys = [], []
        for op in ops:
            ids.append(op.op_id)
            entry = self._keys.pop(id(op.batch), None) if op.batch is not None else None
            if entry is not None:
                keys.append(entry[1])
                self._sent.discard(entry[1])
        if self.alive and ids:
            self.remote.actor.release.remote(ids, keys)  # NOTE: fire and forget

    # -- KV copies (swap, migration) -------------------------------------------------------
    def gather_kv(self, layers: list[int], blocks: list[int]) -> LayerKV:
        result: LayerKV = ray.get(self.remote.actor.gather_kv.remote(layers, blocks))
        return result

    def scatter_kv(self, blocks: list[int], kv: LayerKV) -> None:
        ray.get(self.remote.actor.scatter_kv.remote(blocks, kv))

    # -- up and down -----------------------------------------------------------------------
    def lose(self, cause: BaseException) -> None:
        """The actor is gone: the device goes down and its queued ops fail."""
        with self._cond:
            if not self.alive:
                return
            self.alive, self.state = False, "down"
            left, self._pending = self._pending, []
            self._keys.clear()
            self._sent.clear()
        self.lost_total += 1
        self.last_error = f"{type(cause).__name__}: {cause}".splitlines()[0][:300]
        logger.error("device %s lost (%s); waiting for its actor to restart",
                     self.device.name, self.last_error)
        for op in left:
            self._fail(op, DeviceLost(f"device {self.device.name} lost"))

    def check(self) -> bool:
        """Ask the actor now whether it is up (marking the device lost if not)."""
        try:
            ray.get(self.remote.actor.ping.remote(), timeout=PING_TIMEOUT_S)
            return True
        except LOST as e:
            self.lose(e)
            return False

    def _watch(self) -> None:
        """Heartbeat: notice a lost actor while idle; bring the device back once restarted."""
        while not self._halt.wait(HEARTBEAT_S):
            try:
                if self.alive:
                    self.check()
                else:
                    self._try_rejoin()
            except Exception:  # NOTE: the watcher must outlive any one failure
                logger.exception("the heartbeat of %s failed", self.device.name)

    def _try_rejoin(self) -> None:
        try:
            ray.get(self.remote.actor.ping.remote(), timeout=PING_TIMEOUT_S)
            ray.get(self.remote.actor.configure.remote(self.remote.num_blocks,
                                                       self.remote.block_size))
        except LOST:
            return
        with self._cond:
            self.alive, self.state = True, "up"
            self._cond.notify()
        logger.warning("device %s is back", self.device.name)
        self.wake_all()

    def describe(self) -> dict[str, Any]:
        """For /health: the device's state, how often it was lost, and why last."""
        return {"state": self.state, "lost_total": self.lost_total,
                "last_error": self.last_error}
