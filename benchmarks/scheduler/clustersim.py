"""A cluster of virtual devices on a virtual clock, for provisioning at 8-64 devices over an hour.

Each device runs one operator at a time from a priority queue (weight copies,
then prefill chunks, then decode work; ties by ready time), as the executors
do; op times come from the fitted estimators of a real model. A request's
prompt flows through the chain in chunks of at most `chunk_tokens` (a chunk's
operator waits for the previous operator of its chunk and for the previous
chunk on its operator); each operator of the first chunk goes to the replica
holding it with the least queued work (counting the transfer from the previous
operator's device), and the request keeps that placement for its later
chunks and its decode (its KV lives there). Every mode dispatches this way; only
the replicas differ (every device holds every operator under `off`, whole
models come and go under `model`, single operators under `opscale`). Its
decode is one op per operator after its first token: its output tokens at the
cost per token of a batched decode step (`OpSpec.decode_token_s`).

NOTE: this is not the scheduler's rounds (an hour at 64 devices through them
would take hours on two cores); it is the queueing the provisioner has to
size, driven by the same planning functions (`scheduler.provisioning.planning`) the
scheduler calls, with the same replica rules: a replica takes work once its
weight copy (an op on its device, at the top class) is done, and a removed one
is freed once no queued op and no request's KV needs it.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.memory.replicas import Change
from scheduler.provisioning.planning import Cluster, OpLoad, plan_model, plan_opscale

COPY, PREFILL, DECODE = 0, 1, 2  # op classes, highest first


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One operator of the chain: its weights and its cost."""

    name: str
    weight_bytes: int
    prefill_s: Callable[[int, int], float]  # (chunk tokens, tokens before it) -> seconds
    decode_token_s: float  # seconds per generated token (a batched step's share)
    out_bytes_per_token: int  # activation sent to the next operator


@dataclass(frozen=True, slots=True)
class Chain:
    ops: tuple[OpSpec, ...]
    xfer_s: Callable[[int], float]  # seconds to move n bytes between two devices

    @property
    def total_weight_bytes(self) -> int:
        return sum(o.weight_bytes for o in self.ops)


@dataclass(frozen=True, slots=True)
class Job:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class SimConfig:
    mode: str  # off | opscale | model
    num_devices: int
    memory_bytes: int  # per device, for weights (KV is not what limits replicas here)
    slo_s: float
    chunk_tokens: int = 2048
    interval_s: float = 1.0  # opscale
    model_interval_s: float = 20.0
    model_util: float = 0.9  # `model`: the prefill throughput a replica is sized to
    window_s: float = 5.0  # demand measured over this window (opscale additions)
    keep_window_s: float = 10.0  # and over this one (opscale removals)


@dataclass(slots=True)
class _Task:
    job: int
    index: int
    cls: int
    dur: float
    chunk: int = 0
    change: tuple[Change, ...] = ()  # a weight copy: the replicas it loads


@dataclass(slots=True)
class Result:
    device_seconds: float
    slo_attainment: float
    ttft_p99_s: float
    num_requests: int
    plan_ms: list[float] = field(default_factory=list)
    scale_up_s: list[float] = field(default_factory=list)  # plan -> new replica serving
    max_devices_on: int = 0
    plan_inputs: list[tuple[list[OpLoad], Cluster, list[OpLoad]]] = field(default_factory=list)


def p_quantile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


class ClusterSim:
    """One run (see the module docstring). `run()` returns the `Result`."""

    def __init__(self, chain: Chain, jobs: list[Job], cfg: SimConfig,
                 static: dict[str, frozenset[int]] | None = None) -> None:
        self.chain, self.jobs, self.cfg = chain, jobs, cfg
        self.devs = tuple(f"v{i}" for i in range(cfg.num_devices))
        n = len(chain.ops)
        every = frozenset(range(n))
        if static is not None:
            held = static
        elif cfg.mode == "off":
            held = dict.fromkeys(self.devs, every)
        else:
            held = {d: every if k == 0 else frozenset() for k, d in enumerate(self.devs)}
        self.ready: dict[tuple[int, str], bool] = {(i, d): True for d, ops in held.items()
                                                   for i in ops}
        self.draining: set[tuple[int, str]] = set()
        self.kv_refs: dict[tuple[int, str], int] = {}
        self.queued_on: dict[tuple[int, str], int] = {}  # (op, device) -> ops queued/running
        self.queued_work = [0.0] * n  # op -> seconds of its ops queued/running
        self.backlog = dict.fromkeys(self.devs, 0.0)
        self.queue: dict[str, list[tuple[int, float, int, _Task]]] = {d: [] for d in self.devs}
        self.busy: dict[str, bool] = dict.fromkeys(self.devs, False)
        self.running: dict[str, _Task | None] = dict.fromkeys(self.devs)
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.place: list[list[str | None]] = [[None] * n for _ in jobs]
        self.done_upto: list[list[int]] = [[-1] * n for _ in jobs]  # op -> last chunk done
        self.chunks = [max(1, -(-j.prompt_tokens // cfg.chunk_tokens)) for j in jobs]
        self.ttft: list[float | None] = [None] * len(jobs)
        self.decode_left = [0] * len(jobs)
        self.issued: deque[tuple[float, int, float]] = deque()
        self.prompt_log: deque[tuple[float, int]] = deque()
        self.prefilling: set[int] = set()
        self.on_since: dict[str, float | None] = {d: 0.0 if self._holds(d) else None
                                                  for d in self.devs}
        self.device_seconds = 0.0
        self.res = Result(0.0, 0.0, 0.0, len(jobs))
        self.added_at: dict[tuple[int, str], float] = {}
        self.static = static is not None
        self._plan_time: dict[tuple[int, str], float] = {}  # replica -> when a plan added it

    # -- events ------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self.events, (t, kind, next(self.seq), payload))

    def run(self) -> Result:
        for k, j in enumerate(self.jobs):
            self._push(j.arrival_s, 1, k)
        end = max((j.arrival_s for j in self.jobs), default=0.0)
        if self.cfg.mode != "off" and not self.static:
            step = self.cfg.interval_s if self.cfg.mode == "opscale" else self.cfg.model_interval_s
            t = step
            while t <= end + step:
                self._push(t, 0, None)
                t += step
        while self.events:
            t, kind, _, payload = heapq.heappop(self.events)
            self.now = t
            if kind == 0:
                self._tick()
            elif kind == 1:
                self._arrive(payload)  # type: ignore[arg-type]
            elif kind == 2:
                self._enqueue(*payload)  # type: ignore[misc]
            else:
                self._finish(*payload)  # type: ignore[misc]
        return self._result()

    def _result(self) -> Result:
        for d in self.devs:
            self._set_on(d, False)
        r = self.res
        r.device_seconds = self.device_seconds
        ttfts = [t for t in self.ttft if t is not None]
        r.slo_attainment = sum(t <= self.cfg.slo_s for t in ttfts) / max(1, len(self.jobs))
        r.ttft_p99_s = p_quantile(ttfts, 0.99)
        return r

    # -- devices -----------------------------------------------------------------------------
    def _enqueue(self, device: str, task: _Task) -> None:
        heapq.heappush(self.queue[device], (task.cls, self.now, next(self.seq), task))
        self._start(device)

    def _send(self, device: str, task: _Task, delay: float) -> None:
        """Queue `task` on `device` after `delay` (a transfer); counted there at once."""
        self.backlog[device] += task.dur
        if task.cls != COPY:
            key = (task.index, device)
            self.queued_on[key] = self.queued_on.get(key, 0) + 1
            self.queued_work[task.index] += task.dur
        if delay > 0:
            self._push(self.now + delay, 2, (device, task))
        else:
            self._enqueue(device, task)

    def _start(self, device: str) -> None:
        if self.busy[device] or not self.queue[device]:
            return
        task = heapq.heappop(self.queue[device])[3]
        self.busy[device] = True
        self.running[device] = task
        self._push(self.now + task.dur, 3, (device, task))

    def _finish(self, device: str, task: _Task) -> None:
        self.busy[device] = False
        self.running[device] = None
        self.backlog[device] -= task.dur
        if task.cls == COPY:
            for c in task.change:
                self.ready[(c.index, c.device)] = True
                self.added_at[(c.index, c.device)] = self.now
        else:
            key = (task.index, device)
            self.queued_on[key] -= 1
            self.queued_work[task.index] -= task.dur
            if self.added_at.pop(key, None) is not None and key in self._plan_time:
                self.res.scale_up_s.append(self.now - self._plan_time.pop(key))
            if task.cls == PREFILL:
                self._prefill_done(task)
            else:
                self._decode_done(task)
        self._settle()
        self._start(device)

    # -- requests ----------------------------------------------------------------------------
    def _arrive(self, k: int) -> None:
        self.prefilling.add(k)
        self.prompt_log.append((self.now, self.jobs[k].prompt_tokens))
        self._record(k)
        self._prefill_op(k, 0, 0, None)

    def _record(self, k: int) -> None:
        """The op work a request brings, per operator, as it arrives (the demand the
        provisioner sizes: ops issued later are held back by the queues in front of them)."""
        out = max(0, self.jobs[k].output_tokens - 1)
        for i, op in enumerate(self.chain.ops):
            for c in range(self.chunks[k]):
                self.issued.append((self.now, i, op.prefill_s(*self._chunk_tokens(k, c))))
            if out:
                self.issued.append((self.now, i, op.decode_token_s * out))

    def _chunk_tokens(self, k: int, chunk: int) -> tuple[int, int]:
        size = self.cfg.chunk_tokens
        total = self.jobs[k].prompt_tokens
        return min(size, total - chunk * size), chunk * size

    def _prefill_op(self, k: int, index: int, chunk: int, prev: str | None) -> None:
        tokens, past = self._chunk_tokens(k, chunk)
        dur = self.chain.ops[index].prefill_s(tokens, past)
        device = self.place[k][index]
        if device is None:
            device = self._choose(index, prev, tokens)
            self.place[k][index] = device
            self.kv_refs[(index, device)] = self.kv_refs.get((index, device), 0) + 1
        delay = 0.0 if prev in (None, device) else self._xfer(index - 1, tokens)
        self._send(device, _Task(k, index, PREFILL, dur, chunk), delay)

    def _xfer(self, index: int, tokens: int) -> float:
        return self.chain.xfer_s(self.chain.ops[index].out_bytes_per_token * tokens)

    def _choose(self, index: int, prev: str | None, tokens: int) -> str:
        holders = [d for d in self.devs if self._takes(index, d)]
        move = self._xfer(max(0, index - 1), tokens) if index else 0.0
        return min(holders, key=lambda d: (self.backlog[d] + (move if d != prev else 0.0), d))

    def _prefill_done(self, t: _Task) -> None:
        k, i, c = t.job, t.index, t.chunk
        self.done_upto[k][i] = c
        here = self.place[k][i]
        last_op = len(self.chain.ops) - 1
        if i < last_op and self.done_upto[k][i + 1] == c - 1:
            self._prefill_op(k, i + 1, c, here)  # this chunk goes on
        if c + 1 < self.chunks[k] and (i == 0 or self.done_upto[k][i - 1] >= c + 1):
            if i == 0:
                self._prefill_op(k, 0, c + 1, None)  # the next chunk starts
            else:
                self._prefill_op(k, i, c + 1, self.place[k][i - 1])
        if i == last_op and c == self.chunks[k] - 1:
            self.ttft[k] = self.now - self.jobs[k].arrival_s
            self.prefilling.discard(k)
            self._decode(k)

    def _decode(self, k: int) -> None:
        out = self.jobs[k].output_tokens - 1
        if out <= 0:
            self._release(k)
            return
        self.decode_left[k] = len(self.chain.ops)
        for i, op in enumerate(self.chain.ops):
            device = self.place[k][i]
            assert device is not None
            self._send(device, _Task(k, i, DECODE, op.decode_token_s * out), 0.0)

    def _decode_done(self, t: _Task) -> None:
        self.decode_left[t.job] -= 1
        if self.decode_left[t.job] == 0:
            self._release(t.job)

    def _release(self, k: int) -> None:
        for i, d in enumerate(self.place[k]):
            if d is not None:
                self.kv_refs[(i, d)] -= 1

    # -- replicas ----------------------------------------------------------------------------
    def _takes(self, index: int, device: str) -> bool:
        return self.ready.get((index, device), False) and (index, device) not in self.draining

    def _holds(self, device: str) -> bool:
        return any(d == device for _, d in self.ready)

    def _set_on(self, device: str, on: bool) -> None:
        since = self.on_since[device]
        if on and since is None:
            self.on_since[device] = self.now
        elif not on and since is not None:
            self.device_seconds += self.now - since
            self.on_since[device] = None

    def _settle(self) -> None:
        for key in [k for k in self.draining if not self.queued_on.get(k)
                    and not self.kv_refs.get(k)]:
            self.draining.discard(key)
            del self.ready[key]
            if not self._holds(key[1]):
                self._set_on(key[1], False)

    def _tick(self) -> None:
        self._settle()
        cluster = self._cluster()
        t0 = time.perf_counter()
        if self.cfg.mode == "opscale":
            loads, keep = self._loads(self.cfg.window_s), self._loads(self.cfg.keep_window_s)
            t0 = time.perf_counter()
            plan = plan_opscale(loads, cluster, self.cfg.slo_s, keep)
            self.res.plan_inputs.append((loads, cluster, keep))
        else:
            plan = plan_model(self._pending_tokens_per_s(), self._tokens_per_replica_s(),
                              cluster, len(self.chain.ops), self.cfg.model_util)
        self.res.plan_ms.append((time.perf_counter() - t0) * 1e3)
        for c in plan.removes:
            if (c.index, c.device) in self.ready and self.ready[(c.index, c.device)]:
                self.draining.add((c.index, c.device))
        by_dev: dict[str, list[Change]] = {}
        for c in plan.adds:
            if (c.index, c.device) in self.draining:
                self.draining.discard((c.index, c.device))  # kept: no copy
                continue
            by_dev.setdefault(c.device, []).append(c)
        for d, changes in by_dev.items():
            for c in changes:
                self.ready[(c.index, c.device)] = False
                self._plan_time[(c.index, c.device)] = self.now
            self._set_on(d, True)
            nbytes = sum(self.chain.ops[c.index].weight_bytes for c in changes)
            self._send(d, _Task(-1, -1, COPY, self.chain.xfer_s(nbytes), 0, tuple(changes)), 0)
        self._settle()
        self.res.max_devices_on = max(self.res.max_devices_on,
                                      sum(s is not None for s in self.on_since.values()))

    def _cluster(self) -> Cluster:
        weights = tuple(o.weight_bytes for o in self.chain.ops)
        held: dict[str, set[int]] = {d: set() for d in self.devs}
        room = dict.fromkeys(self.devs, self.cfg.memory_bytes)
        takers = [0] * len(weights)
        for (i, d), ready in self.ready.items():
            room[d] -= weights[i]
            if (i, d) not in self.draining:
                held[d].add(i)
                takers[i] += ready
        removable = frozenset((i, d) for (i, d), ready in self.ready.items()
                              if ready and (i, d) not in self.draining and takers[i] > 1)
        return Cluster(self.devs, {d: frozenset(v) for d, v in held.items()}, removable, room,
                       weights, frozenset(self.draining))

    def _loads(self, window: float) -> list[OpLoad]:
        """Per operator over the last `window` seconds: the op work requests brought, plus
        the ops queued and not started as arrivals of one more instance each within the
        window, at the same mean seconds (as the scheduler's provisioner counts them)."""
        keep = max(self.cfg.window_s, self.cfg.keep_window_s)
        while self.issued and self.issued[0][0] < self.now - keep:
            self.issued.popleft()
        n = len(self.chain.ops)
        count, work, queued = [0] * n, [0.0] * n, [0] * n
        for t, i, dur in self.issued:
            if t >= self.now - window:
                count[i] += 1
                work[i] += dur
        for (i, _), q in self.queued_on.items():
            queued[i] += q
        for task in self.running.values():  # NOTE: queued and not started, as the GMG counts
            if task is not None and task.cls != COPY:
                queued[task.index] -= 1
        return [OpLoad((c + q) / window, s / c if c else self.queued_work[i] / max(1, q))
                for i, (c, s, q) in enumerate(zip(count, work, queued, strict=True))]

    def _pending_tokens_per_s(self) -> float:
        w = self.cfg.model_interval_s
        while self.prompt_log and self.prompt_log[0][0] < self.now - w:
            self.prompt_log.popleft()
        arrived = sum(n for _, n in self.prompt_log) / w
        pending = sum(self.jobs[k].prompt_tokens for k in self.prefilling)
        return arrived + pending / w

    def _tokens_per_replica_s(self) -> float:
        n = self.cfg.chunk_tokens
        return n / sum(o.prefill_s(n, 0) for o in self.chain.ops)


def simulate_cluster(chain: Chain, jobs: list[Job], cfg: SimConfig,
                     static: dict[str, frozenset[int]] | None = None) -> Result:
    return ClusterSim(chain, jobs, cfg, static).run()
