"""Devices on a Ray cluster: connect, name them, start their actors, profile node pairs.

`--devices` names remote devices `NODE/cpu:N` or `NODE/cuda:N`, NODE being
an IP address, a Ray node id (or a unique prefix of one, 8+ characters), or
a custom resource a node was started with (`ray start --resources
'{"box-2": 1}'`); `ray:all` takes one device per GPU of every node, or one CPU
device per node without a GPU. An actor is pinned by a resource (`node:IP`,
or the custom one), so Ray restarts it when a node holding that resource
comes back; pinned by node id, a lost device stays down (a node that rejoins
gets a new id).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from executors.executor import OnDone, RunOp
from executors.memory import MemoryLedger
from executors.ray_actor import ActorSpec, DeviceActor
from executors.ray_executor import LOST, RayExecutor, Remote
from executors.remote_kv import RemoteKVCache
from executors.runner import ModelRunner
from executors.types import Device

logger = logging.getLogger(__name__)

ALL = "ray:all"
PIN = 0.001  # of the pinning resource an actor takes (many actors may share a node)
READY_TIMEOUT_S = 600.0  # an actor loads its model within this
_ROOT = str(Path(__file__).resolve().parents[1])  # the checkout's root, for the workers


def connect(address: str | None, **local: Any) -> None:
    """Join the Ray cluster at `address` (`auto`: the local one) unless already joined;
    `address=None` starts a one-node cluster in this process (`local`: its `num_cpus`,
    `resources`)."""
    if ray.is_initialized():
        return
    # NOTE: workers import slicegate from this checkout where the path exists on their node
    ray.init(address=address, namespace="slicegate", logging_level=logging.WARNING,
             runtime_env={"env_vars": {"PYTHONPATH": _ROOT}}, **local)


def alive_nodes() -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def expand(names: Sequence[str]) -> list[str]:
    """`ray:all` -> one device per GPU of every node, else one CPU device per node."""
    if list(names) != [ALL]:
        if ALL in names:
            raise ValueError(f"{ALL} stands alone")
        return list(names)
    nodes = alive_nodes()
    ips = [n["NodeManagerAddress"] for n in nodes]
    out = []
    for n in nodes:
        res = n.get("Resources", {})
        label = n["NodeManagerAddress"] if ips.count(n["NodeManagerAddress"]) == 1 \
            else n["NodeID"]
        gpus = int(res.get("GPU", 0))
        if gpus:
            out += [f"{label}/cuda:{i}" for i in range(gpus)]
        elif res.get("CPU", 0) >= 1:
            out.append(f"{label}/cpu:0")
    if not out:
        raise ValueError("the Ray cluster has no node with a CPU or GPU")
    return out


def placement(node: str) -> dict[str, Any]:
    """Ray options pinning an actor to `node` (see the module doc)."""
    nodes = alive_nodes()
    if any(node in n.get("Resources", {}) for n in nodes):
        return {"resources": {node: PIN}}
    if any(n["NodeManagerAddress"] == node for n in nodes):
        return {"resources": {f"node:{node}": PIN}}
    ids = [n["NodeID"] for n in nodes if len(node) >= 8 and n["NodeID"].startswith(node)]
    if len(ids) == 1:
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ids[0], soft=False)}
    raise ValueError(f"{node!r} names no live Ray node: give an IP address, a node id or a "
                     f"custom resource of one (`ray status`, `ray list nodes`)")


def node_cpus(node: str) -> int:
    """CPUs of the node `node` pins to (the first match)."""
    for n in alive_nodes():
        res = n.get("Resources", {})
        if node in res or n["NodeManagerAddress"] == node or n["NodeID"].startswith(node):
            return max(1, int(res.get("CPU", 1)))
    return 1


class RayDevices:
    """The remote devices of one deployment: their actors, and the executor factory."""

    def __init__(self, devices: list[Device], actors: dict[str, Any]) -> None:
        self.devices = devices
        self.actors = actors
        self.peers: dict[str, RayExecutor] = {}

    @classmethod
    def start(cls, names: Sequence[str], memory_bytes: int, spec: ActorSpec) -> RayDevices:
        """Start one actor per device (loading the model there) and wait until all are up."""
        devices = [Device(n, memory_bytes) for n in expand(names)]
        local = [d for d in devices if d.node is None]
        if local:
            raise ValueError(f"with a Ray cluster every device is NODE/cpu:N or NODE/cuda:N; "
                             f"{local[0].name} names no node")
        per_node: dict[str, int] = {}
        for d in devices:
            assert d.node is not None
            per_node[d.node] = per_node.get(d.node, 0) + (d.kind == "cpu")
        actor_cls: Any = ray.remote(DeviceActor)
        actors: dict[str, Any] = {}
        for d in devices:
            assert d.node is not None
            threads = max(1, node_cpus(d.node) // max(1, per_node[d.node]))
            opts: dict[str, Any] = dict(placement(d.node), max_restarts=-1, max_task_retries=0,
                                        max_concurrency=4, name=None)
            opts.update(num_gpus=1, num_cpus=0) if d.kind == "cuda" else opts.update(num_cpus=1)
            local_name = "cuda:0" if d.kind == "cuda" else d.local_name  # NOTE: Ray's GPU
            actors[d.name] = actor_cls.options(**opts).remote(
                ActorSpec(spec.model, spec.dtype, spec.layers_per_group, local_name, threads,
                          spec.kernels))
        t0 = time.monotonic()
        ray.get([a.ping.remote() for a in actors.values()], timeout=READY_TIMEOUT_S)
        logger.info("started %d Ray device actors in %.1f s: %s", len(actors),
                    time.monotonic() - t0, ", ".join(actors))
        return cls(devices, actors)

    def factory(self, device: Device, run_op: RunOp, on_done: OnDone, loop: Any) -> RayExecutor:
        """The `ExecutorFactory` of these devices: configure the actor's KV pool as the
        scheduler's allocator sized it, and wrap the actor in its proxy."""
        assert isinstance(run_op, ModelRunner), "RayDevices needs the scheduler's runner"
        pool = run_op.kv[device.name]
        ledger: MemoryLedger = run_op.ledgers[device.name]
        actor = self.actors[device.name]
        num_blocks, block_size = pool.allocator.num_blocks, pool.block_size
        remote = Remote(actor, num_blocks, block_size, self.peers)
        last = len(run_op.model.template.ops) - 1
        proxy = RayExecutor(device, remote, ledger, last,
                            pool if isinstance(pool, RemoteKVCache) else None, on_done, loop)
        try:
            ray.get(actor.configure.remote(num_blocks, block_size))
        except LOST as e:  # NOTE: its node went away since start: down until it is back
            proxy.lose(e)
        return proxy

    def profile_pairs(self, tokens: Sequence[int] = (1, 64, 512), repeats: int = 5
                      ) -> dict[tuple[str, str], tuple[list[int], list[float]]]:
        """Time transfers (the SEND's fetch + pull, actor to actor) between devices of every
        ordered pair of nodes: (src, dst) device -> (bytes, median seconds) per size. Pairs
        of one node pair share the timing of their first pair."""
        by_nodes: dict[tuple[str | None, str | None], tuple[list[int], list[float]]] = {}
        out = {}
        for s in self.devices:
            for d in self.devices:
                if s.name == d.name:
                    continue
                key = (s.node, d.node)
                if key not in by_nodes:
                    by_nodes[key] = self._time_pair(s.name, d.name, tokens, repeats)
                out[(s.name, d.name)] = by_nodes[key]
        return out

    def _time_pair(self, src: str, dst: str, tokens: Sequence[int], repeats: int
                   ) -> tuple[list[int], list[float]]:
        a, b = self.actors[src], self.actors[dst]
        sizes, medians = [], []
        for i, n in enumerate(tokens):
            op_id = -1 - i  # NOTE: negative ids never collide with the scheduler's
            sizes.append(ray.get(a.stage.remote(op_id, n)))
            runs = []
            for r in range(repeats + 1):  # the first run warms up
                t0 = time.perf_counter()
                tensor, nbytes = a.fetch.options(num_returns=2).remote(op_id)
                ray.get(nbytes)
                ray.get(b.pull.remote(op_id, tensor))
                if r:
                    runs.append(time.perf_counter() - t0)
            medians.append(statistics.median(runs))
            ray.get([a.release.remote([op_id], []), b.release.remote([op_id], [])])
        return sizes, medians

    def close(self) -> None:
        for a in self.actors.values():
            ray.kill(a)
