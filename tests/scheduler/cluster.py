"""The scheduler on fake executors over a virtual clock, with a weightless model (no compute).

Ops take exactly their estimated time (`linear_time`); heads "sample" token 0
for every sampled sequence, or a token chosen by `token_of`. `ClusterRun`
drives the cluster and the asyncio loop together so that tests read like a
timeline: submit at t, run until t', collect.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from executors.fake import FakeExecutor, VirtualCluster
from executors.interference import Interference
from executors.types import Device, OpInstance, OpRole, Priority
from models.batch import BatchShape
from models.config import ModelConfig
from models.loader import Model
from models.sampling_params import SamplingParams
from models.skeleton import skeleton
from scheduler.api import FinishReason, Overloaded, Request
from scheduler.config import SchedulerConfig
from scheduler.scheduler import Scheduler
from tests.scheduler.conftest import linear_time, xfer_time
from tests.scheduler.kvcheck import KVCheckModel

CONFIG = ModelConfig("llama", vocab_size=1000, hidden_size=64, intermediate_size=128,
                     num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5,
                     max_position_embeddings=4096, tie_word_embeddings=True, qkv_bias=False,
                     eos_token_ids=(2,))


def weightless(layers_per_group: int = 1) -> Model:
    """A 4-layer Llama-shaped model with no weights: 6 operators."""
    return skeleton(CONFIG, torch.float32, layers_per_group)


@dataclass
class Outcome:
    tokens: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    error: str | None = None
    first_token_at: float | None = None
    num_cached_tokens: int = 0  # as the request's events reported it
    shed: Overloaded | None = None  # evicted from its queue (its stream raised this)
    finished_at: float | None = None  # virtual time its stream ended
    token_at: list[float] = field(default_factory=list)  # virtual time of each token

    def gaps(self) -> list[float]:
        """Seconds between consecutive tokens (its inter-token times)."""
        return [b - a for a, b in zip(self.token_at, self.token_at[1:], strict=False)]


class ClusterRun:
    """A scheduler over fake executors; `ops` records every op as it starts."""

    def __init__(self, policy: str, devices: int = 2, mem: int = 64 << 20,
                 model: Model | None = None, cfg: SchedulerConfig | None = None,
                 fault: Callable[[OpInstance], Exception | None] | None = None,
                 kv_check: bool = False, settle_turns: int = 50,
                 interference: Interference | None = None,
                 op_time: Callable[[str, str, BatchShape], float] = linear_time) -> None:
        self.cluster = VirtualCluster(interference=interference)
        self.ops: list[OpInstance] = []
        self.fault = fault
        self.settle_turns = settle_turns
        cfg = cfg or SchedulerConfig(policy=policy, max_model_len=1024, max_batch_tokens=512)
        devs = [Device(f"cpu:{i}", mem) for i in range(devices)]
        self.sched = Scheduler(model or weightless(), devs, policy, op_time, xfer_time, cfg,
                               clock=self.cluster.clock, executor_factory=self._executor)
        self.enqueued_at: dict[int, float] = {}  # op id -> virtual time of its last enqueue
        self.kv_model = KVCheckModel(self.sched.model.template, self.sched.kv.pools) \
            if kv_check else None
        self.outcomes: dict[str, Outcome] = {}
        self.classes: dict[str, Priority] = {}  # request id -> its class
        self._tasks: list[asyncio.Task[None]] = []

    def _executor(self, device: Device, run: object, done: Callable[[OpInstance], None],
                  loop: object) -> FakeExecutor:
        ex = self.cluster.add(device, done, run_op=self._run)
        enqueue = ex.enqueue

        def recording(op: OpInstance) -> None:
            self.enqueued_at[op.op_id] = self.cluster.now
            enqueue(op)
        ex.enqueue = recording  # type: ignore[method-assign]
        return ex

    def _run(self, op: OpInstance) -> torch.Tensor | None:
        self.ops.append(op)
        if self.fault is not None and (err := self.fault(op)) is not None:
            raise err
        if self.kv_model is not None:
            return self.kv_model(op)
        if op.role is OpRole.COMPUTE and op.name.rpartition("/")[2] == "head":
            return torch.zeros(op.shape.num_sampled, dtype=torch.long)
        return None

    async def __aenter__(self) -> ClusterRun:
        await self.sched.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.sched.stop(drain=False)

    def submit(self, rid: str, priority: Priority, prompt_len: int, max_tokens: int = 4,
               slo_s: float | None = None, tenant: str = "t",
               prompt: list[int] | None = None, tpot_s: float | None = None,
               model: str = "") -> Outcome:
        ids = prompt if prompt is not None else [3 + (i % 50) for i in range(prompt_len)]
        req = Request(rid, tenant, priority, ids,
                      SamplingParams(temperature=0, max_tokens=max_tokens), ttft_slo_s=slo_s,
                      arrival_time=self.cluster.now, tpot_slo_s=tpot_s, model=model)
        if self.kv_model is not None:
            self.kv_model.prompts[rid] = ids
        out = self.outcomes[rid] = Outcome()
        self.classes[rid] = priority
        stream = self.sched.submit(req)

        async def consume() -> None:
            try:
                async for ev in stream:
                    if ev.token_id is not None:
                        out.tokens.append(ev.token_id)
                        out.token_at.append(self.cluster.now)
                        if out.first_token_at is None:
                            out.first_token_at = self.cluster.now
                    out.num_cached_tokens = ev.num_cached_tokens
                    if ev.finish_reason is not None:
                        out.finish, out.error = ev.finish_reason, ev.error
            except Overloaded as e:
                out.shed = e
            out.finished_at = self.cluster.now
        self._tasks.append(asyncio.create_task(consume()))
        return out

    async def settle(self) -> None:
        for _ in range(self.settle_turns):
            await asyncio.sleep(0)

    async def run_until(self, t: float) -> None:
        """Advance virtual time to `t`, letting the scheduler react to every event."""
        await self.settle()
        while True:
            # NOTE: start what the last round issued first: on an idle cluster its ops are
            # no event yet, and jumping to `t` would hide their completions until then
            self.cluster.run_until(self.cluster.now)
            if (nxt := self.cluster.next_time()) is None or nxt > t:
                break
            self.cluster.step()
            await self.settle()
        self.cluster.run_until(t)
        await self.settle()

    async def run_out(self, max_steps: int = 200_000) -> None:
        """Run until nothing is in flight and every stream has ended."""
        for _ in range(max_steps):
            await self.settle()
            if self.cluster.step():
                continue
            if all(t.done() for t in self._tasks):
                return
            await asyncio.sleep(0.001)  # NOTE: a retry round waits on the loop's real clock
        raise AssertionError("the cluster did not go idle")


async def mixed_load(run: ClusterRun, seed: int, max_prompt: int = 400,
                     slo_s: float = 0.5) -> None:
    """30 requests of random classes, prompts of 2..`max_prompt` tokens and 1..12 outputs,
    arriving at 40 per second (high ones with a TTFT SLO of `slo_s`), then run out."""
    rng = random.Random(seed)
    t = 0.0
    for i in range(30):
        prio = rng.choice(list(Priority))
        run.submit(f"r{i}", prio, rng.randint(2, max_prompt), rng.randint(1, 12),
                   slo_s=slo_s if prio is Priority.HIGH else None)
        t += rng.expovariate(40.0)
        await run.run_until(t)
    await run.run_out()
