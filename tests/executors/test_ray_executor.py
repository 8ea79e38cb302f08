"""Executors as Ray actors on a local multi-node cluster (`ray.cluster_utils.Cluster`): the
tiny model's greedy tokens through devices on other nodes equal the one-process run, for
one device per request and for a prefill split over two nodes; activations move actor to
actor; a node removed mid-stream costs a delay, not an error, and its device comes back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")

import torch  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import executors.ray_cluster as ray_cluster  # noqa: E402
import executors.ray_executor as ray_executor  # noqa: E402
from executors.ray_actor import ActorSpec  # noqa: E402
from executors.ray_cluster import RayDevices, connect  # noqa: E402
from executors.types import Priority  # noqa: E402
from models.generate import generate  # noqa: E402
from models.loader import Model  # noqa: E402
from models.sampling_params import SamplingParams  # noqa: E402
from scheduler.api import FinishReason, Overloaded, Request  # noqa: E402
from scheduler.config import SchedulerConfig  # noqa: E402
from scheduler.scheduler import Scheduler  # noqa: E402
from tests.scheduler.conftest import linear_time, xfer_time  # noqa: E402

pytestmark = pytest.mark.ray

NODES = ("sg-a", "sg-b")  # custom resources naming the two device nodes
MEM = 256 << 20


class Nodes:
    """The local cluster and its device nodes by resource name (a head without CPUs)."""

    def __init__(self) -> None:
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        self.nodes = {name: self.add(name) for name in NODES}

    def add(self, name: str) -> Any:
        return self.cluster.add_node(num_cpus=1, resources={name: 1})

    def remove(self, name: str) -> None:
        self.cluster.remove_node(self.nodes.pop(name))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Nodes]:
    # NOTE: Ray's memory monitor kills workers when the machine's memory is nearly full;
    # on a shared test machine that is someone else's memory, so it is off for these nodes
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_memory_monitor_refresh_ms", "0")
        nodes = Nodes()
        connect(nodes.cluster.address)
        try:
            yield nodes
        finally:
            ray.shutdown()
            nodes.cluster.shutdown()


@pytest.fixture(scope="module")
def remote(cluster: Nodes, tiny_model: Model) -> Iterator[RayDevices]:
    spec = ActorSpec(tiny_model.name, "float32", tiny_model.template.layers_per_group, "cpu:0",
                     1, tiny_model.kernels.to_dict())
    devs = RayDevices.start([f"{n}/cpu:0" for n in NODES], MEM, spec)
    try:
        yield devs
    finally:
        devs.close()


def _scheduler(model: Model, remote: RayDevices, policy: str) -> Scheduler:
    cfg = SchedulerConfig(policy=policy, max_model_len=1024, max_batch_tokens=512,
                          swap_space_bytes=0)
    return Scheduler(model, remote.devices, policy, linear_time, xfer_time, cfg,
                     executor_factory=remote.factory)


async def _collect(sched: Scheduler, req: Request) -> tuple[list[int], FinishReason | None,
                                                            str | None]:
    tokens, last, error = [], None, None
    async for ev in sched.submit(req):
        if ev.token_id is not None:
            tokens.append(ev.token_id)
        last, error = ev.finish_reason, ev.error
    return tokens, last, error


def _prompts(n: int) -> list[list[int]]:
    return [[(7 * i + j) % 1000 + 3 for j in range(3 + 41 * i)] for i in range(n)]


async def test_one_device_per_request_on_two_nodes_equals_one_process(
        tiny_model: Model, remote: RayDevices) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=8)
    sched = _scheduler(tiny_model, remote, "fcfs")
    await sched.start()
    try:
        got = await asyncio.gather(*[_collect(sched, Request(f"r{i}", "t", Priority.HIGH, p,
                                                             greedy))
                                     for i, p in enumerate(_prompts(6))])
    finally:
        await sched.stop()
    for (tokens, reason, _), p in zip(got, _prompts(6), strict=True):
        assert tokens == generate(tiny_model, p, greedy).token_ids and reason is FinishReason.LENGTH
    ran = {e["device"] for e in sched.timeline(0.0)}
    assert ran == {f"{n}/cpu:0" for n in NODES}
    assert sched.kv.used_blocks() == 0


async def test_penalized_requests_on_remote_actors_equal_one_process(
        tiny_model: Model, remote: RayDevices) -> None:
    # NOTE: each sampled sequence carries its request's token history to the actor
    params = [SamplingParams(temperature=0, max_tokens=8, repetition_penalty=1.3),
              SamplingParams(temperature=0, max_tokens=8, presence_penalty=1.5,
                             frequency_penalty=0.5, logit_bias=((8, -100.0),))] * 2
    prompts = _prompts(4)
    sched = _scheduler(tiny_model, remote, "fcfs")
    await sched.start()
    try:
        got = await asyncio.gather(*[_collect(sched, Request(f"q{i}", "t", Priority.HIGH, p, s))
                                     for i, (p, s) in enumerate(zip(prompts, params,
                                                                    strict=True))])
    finally:
        await sched.stop()
    for (tokens, _, error), p, s in zip(got, prompts, params, strict=True):
        assert error is None and tokens == generate(tiny_model, p, s).token_ids


async def test_split_prefill_moves_activations_actor_to_actor(
        tiny_model: Model, remote: RayDevices, monkeypatch: pytest.MonkeyPatch) -> None:
    fetched: list[Any] = []
    real_get = ray.get

    def spy(refs: Any, **kw: Any) -> Any:
        out = real_get(refs, **kw)
        fetched.extend(out if isinstance(refs, list) else [out])
        return out
    monkeypatch.setattr(ray_executor.ray, "get", spy)
    greedy = SamplingParams(temperature=0, max_tokens=6)
    prompt = [(5 * j) % 1000 + 3 for j in range(480)]
    sched = _scheduler(tiny_model, remote, "slice")
    await sched.start()
    try:
        tokens, reason, _ = await _collect(sched, Request("p", "t", Priority.HIGH, prompt,
                                                          greedy))
    finally:
        await sched.stop()
    assert tokens == generate(tiny_model, prompt, greedy).token_ids
    timeline = sched.timeline(0.0)
    assert {e["device"] for e in timeline if e["num_tokens"] > 1} == {f"{n}/cpu:0"
                                                                      for n in NODES}
    assert any(e["op"] == "send" for e in timeline)
    # NOTE: only sampled token ids come back to this process, never an activation
    tensors = [x for x in _flatten(fetched) if isinstance(x, torch.Tensor)]
    assert tensors and all(not t.is_floating_point() for t in tensors)


def _flatten(xs: list[Any]) -> Iterator[Any]:
    for x in xs:
        if isinstance(x, tuple | list):
            yield from _flatten(list(x))
        else:
            yield x


def test_nodes_are_named_by_resource_address_or_id(cluster: Nodes) -> None:
    nodes = [n for n in ray_cluster.alive_nodes() if n["Resources"].get("CPU", 0) >= 1]
    assert len(nodes) == 2
    # NOTE: the local nodes share one IP address, so ray:all names them by node id
    assert sorted(ray_cluster.expand(["ray:all"])) == sorted(f"{n['NodeID']}/cpu:0"
                                                            for n in nodes)
    assert ray_cluster.placement(NODES[0]) == {"resources": {NODES[0]: ray_cluster.PIN}}
    ip = nodes[0]["NodeManagerAddress"]
    assert ray_cluster.placement(ip) == {"resources": {f"node:{ip}": ray_cluster.PIN}}
    by_id = ray_cluster.placement(nodes[0]["NodeID"][:12])["scheduling_strategy"]
    assert by_id.node_id == nodes[0]["NodeID"] and not by_id.soft
    with pytest.raises(ValueError, match="names no live Ray node"):
        ray_cluster.placement("no-such-node")
    with pytest.raises(ValueError, match="stands alone"):
        ray_cluster.expand(["ray:all", f"{NODES[0]}/cpu:0"])


def test_node_pairs_are_profiled(remote: RayDevices) -> None:
    pairs = remote.profile_pairs(tokens=(1, 256), repeats=2)
    a, b = (f"{n}/cpu:0" for n in NODES)
    assert set(pairs) == {(a, b), (b, a)}
    sizes, seconds = pairs[(a, b)]
    assert sizes[1] > sizes[0] and all(s > 0 for s in seconds)


async def _wait(cond: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_lost_node_mid_stream_recomputes_then_rejoins(
        tiny_model: Model, remote: RayDevices, cluster: Nodes) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=48)
    sched = _scheduler(tiny_model, remote, "fcfs")
    await sched.start()
    a, b = (f"{n}/cpu:0" for n in NODES)
    try:
        prompts = _prompts(4)
        streams = [asyncio.ensure_future(_collect(sched, Request(f"r{i}", "t", Priority.HIGH,
                                                                 p, greedy)))
                   for i, p in enumerate(prompts)]
        await _wait(lambda: sum(len(s.output_ids) for s in sched.states.values()) >= 8, 60)
        assert not any(s.done() for s in streams)
        on_b = {s.rid for s in sched.states.values() if b in (s.placement or ())}
        cluster.remove(NODES[1])
        got = await asyncio.gather(*streams)
        assert on_b and sched.requests.dropped_tokens > 0  # recomputed, not failed
        for (tokens, reason, error), p in zip(got, prompts, strict=True):
            assert error is None and reason is FinishReason.LENGTH
            assert tokens == generate(tiny_model, p, greedy).token_ids
        assert sched.exec.down() == {b}
        assert sched.kv.pools[a].allocator.num_used == 0  # nothing leaked on the survivor
        assert sched.stats().device_up == {a: True, b: False}
        assert sched.stats().healthy
        cluster.nodes[NODES[1]] = cluster.add(NODES[1])
        await _wait(lambda: not sched.exec.down(), 120)
        tokens, reason, _ = await _collect(sched, Request("again", "t", Priority.HIGH,
                                                          prompts[0], greedy))
        assert tokens == generate(tiny_model, prompts[0], greedy).token_ids
        assert sched.stats().device_detail[b]["lost_total"] == 1
    finally:
        await sched.stop()


async def test_no_device_left_refuses_with_overloaded(
        tiny_model: Model, remote: RayDevices, cluster: Nodes) -> None:
    sched = _scheduler(tiny_model, remote, "fcfs")
    await sched.start()
    try:
        for name in list(cluster.nodes):
            cluster.remove(name)
        await _wait(lambda: len(sched.exec.down()) == 2, 60)
        with pytest.raises(Overloaded, match="no device is available"):
            sched.submit(Request("late", "t", Priority.HIGH, [5, 6, 7],
                                 SamplingParams(temperature=0, max_tokens=2)))
        assert not sched.stats().healthy
    finally:
        await sched.stop()
