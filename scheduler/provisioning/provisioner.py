"""The provisioning loop of one scheduler: measure, plan, check by what-if simulation, actuate.

Every `provision_interval_s` (`opscale`) or `model_interval_s` (`model`) it
reads the demand per operator (`actuation.Demand`, plus the requests still
waiting), asks `provisioning` for a plan and accepts it only if a simulation
of the current GMG with the plan's weight copies added keeps every pending
TTFT deadline the GMG keeps without them, and runs out of no device's memory.
With a model set, each member's replicas are planned apart, on its own devices
and from its own demand (scheduler/provisioning/members.py).

NOTE: a weight copy is simulated as an op occupying its destination device for
its transfer time (at high priority, issued now): on a CPU device it takes the
memory bandwidth and cores that device's operators use; a GPU's copy engine
would overlap it, which makes the check conservative there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Sequence

from executors.types import OpRole, OpState, Priority
from models.batch import BatchShape
from models.modelset import ModelSet
from scheduler.core.components import Components
from scheduler.memory.replicas import LimitedAllocator, ReplicaState
from scheduler.provisioning.members import MemberLoad, plan_members
from scheduler.provisioning.planning import Cluster, OpLoad, ProvisionPlan, plan_model, plan_opscale
from scheduler.round.requestview import RequestView
from scheduler.sim.gmg import SimOp, Snapshot
from scheduler.sim.simulator import simulate
from scheduler.sim.types import Candidate

logger = logging.getLogger(__name__)


class Provisioner:
    """See the module docstring. `tick(now)` is one step; `run()` is the supervised loop. It
    reads the scheduler's parts (`Components`), never its request lifecycle."""

    def __init__(self, sched: Components) -> None:
        self.s = sched
        self.mode = sched.cfg.provisioning
        self.interval_s = (sched.cfg.provision_interval_s if self.mode == "opscale"
                           else sched.cfg.model_interval_s)
        self.plan_ms: list[float] = []  # planning time of every tick (wall ms)
        self.rejected = 0  # plans the what-if simulation turned down
        self.errors = 0
        self.last: ProvisionPlan | None = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.tick(self.s.clock())
            except Exception as e:  # NOTE: a failed tick is logged and counted; the next runs
                logger.exception("a provisioning step failed")
                self.errors += 1
                self.s.health.request_error(f"provisioning: {type(e).__name__}: {e}")

    # -- one step ----------------------------------------------------------------------------
    def tick(self, now: float) -> ProvisionPlan | None:
        """Plan and, when the simulation accepts it, start the plan. Returns it if started."""
        self.s.actuation.settle()
        t0 = time.perf_counter()
        plan = self.plan(now)
        self.plan_ms.append((time.perf_counter() - t0) * 1e3)
        self.last = plan
        if plan.empty:
            return None
        if not self.accept(plan, now):
            self.rejected += 1
            logger.info("provisioning plan rejected by the what-if simulation: %s", plan)
            return None
        for c in plan.removes:
            if self.s.replicas.can_remove(c.index, c.device):
                self.s.actuation.remove(c.index, c.device)
        for c in plan.adds:
            if self.s.replicas.state(c.index, c.device) is ReplicaState.DRAINING:
                self.s.replicas.keep(c.index, c.device)
            elif self.s.replicas.can_add(c.index, c.device):
                self.s.actuation.start_add(c.index, c.device)
        return plan

    def plan(self, now: float) -> ProvisionPlan:
        cluster = self.cluster()
        if self.mode == "model":
            return plan_model(self.pending_tokens_per_s(now), self.tokens_per_replica_s(),
                              cluster, len(self.s.model.template.ops))
        # NOTE: the tightest SLO of any model's requests, for every model's operators
        slo = self.s.tightest_slo_s or self.s.cfg.default_ttft_slo_s
        loads, keep = self.loads(now), self.loads(now, self.s.demand.keep_window_s)
        if not isinstance(self.s.model, ModelSet):
            return plan_opscale(loads, cluster, slo, keep)
        return plan_members([MemberLoad(chain, self.cluster(chain, devices),
                                        loads[chain.start:chain.stop],
                                        keep[chain.start:chain.stop])
                             for chain, devices in self.s.chains], slo, tuple(self.s.devices))

    # -- what it measures --------------------------------------------------------------------
    def cluster(self, chain: range | None = None, devices: Sequence[str] | None = None
                ) -> Cluster:
        """The replicas of `chain`'s operators (default: every one) on `devices` (default:
        every one), indexed from the chain's first operator."""
        reg = self.s.replicas
        chain = chain or range(len(self.s.model.template.ops))
        names, first = tuple(devices or self.s.devices), chain.start
        held = {d: frozenset(i - first for i in reg.held(d) if i in chain) for d in names}
        removable = frozenset((i, d) for d in names for i in held[d]
                              if reg.can_remove(first + i, d))
        room = {d: self._room(d, first) for d in names}
        weights = tuple(self.s.model.template.ops[i].weight_bytes for i in chain)
        draining = frozenset((c.index - first, c.device) for c in reg.draining()
                             if c.index in chain and c.device in names)
        return Cluster(names, held, removable, room, weights, draining)

    def _room(self, device: str, index: int = 0) -> int:
        """Bytes free on the device plus the KV blocks it could give up (free ones of the
        pool operator `index`'s weights trade against)."""
        reg = self.s.replicas
        pool = reg.pool_of(index, device)
        free = self.s.ledgers[device].free_bytes - reg.activation_bytes
        if not isinstance(pool.allocator, LimitedAllocator):
            return free
        return free + pool.allocator.num_free * reg.block_bytes_of(index)

    def loads(self, now: float, window_s: float | None = None) -> list[OpLoad]:
        """Per operator: op instances issued per second and their mean estimated seconds;
        the ops queued and not started, and the requests still waiting, count as arrivals of
        one more instance each within the window."""
        t = self.s.model.template
        window = window_s or self.s.demand.window_s
        rates, service = self.s.demand.rates(now, len(t.ops), window)
        waiting: dict[str, list[RequestView]] = defaultdict(list)  # model -> its waiting
        for views in self.s.requests.views()[2].values():
            for r in views:
                waiting[r.model].append(r)
        queued = [0] * len(t.ops)
        for inst in self.s.gmg.scheduled.values():
            if inst.state is OpState.ISSUED and inst.role is OpRole.COMPUTE:
                queued[inst.template_index] += 1
        out = []
        for chain, devices, model in self._models():
            mine = waiting[model]  # NOTE: a model's waiting requests load its own chain only
            for i in chain:
                s = service[i]
                if s <= 0 and mine:
                    tokens = max(1, sum(r.num_tokens for r in mine) // len(mine))
                    shape = BatchShape(tokens, 1, 1, tokens * tokens, tokens)
                    s = self.s.builder.op_time(devices[0], t.ops[i].name, shape)
                out.append(OpLoad(rates[i] + (len(mine) + queued[i]) / window, s))
        return out

    def _models(self) -> list[tuple[range, Sequence[str], str]]:
        """Each model's chain, devices and `Request.model` ("" for one model)."""
        return [(chain, devices, name) for (chain, devices), name
                in zip(self.s.chains, self.s.model_names, strict=True)]

    def pending_tokens_per_s(self, now: float) -> float:
        """Prompt tokens issued over the window per second, plus those waiting over one
        interval (the model-level autoscaler's signal)."""
        waiting = sum(r.num_tokens for views in self.s.requests.views()[2].values()
                      for r in views)
        return self.s.demand.tokens_per_s(now) + waiting / self.interval_s

    def tokens_per_replica_s(self) -> float:
        """Prefill tokens per second of one whole replica at the full token budget."""
        n = self.s.cfg.max_batch_tokens
        shape = BatchShape(n, 1, 1, n * n, n)
        device = next(iter(self.s.devices))
        total = sum(self.s.builder.op_time(device, t.name, shape)
                    for t in self.s.model.template.ops)
        return n / max(total, 1e-9)

    # -- the what-if check -------------------------------------------------------------------
    def accept(self, plan: ProvisionPlan, now: float) -> bool:
        """True if the GMG with the plan's weight copies keeps every deadline it keeps now."""
        return keeps_deadlines(self.s.gmg.snapshot(now), self.copy_ops(plan, now))

    def copy_ops(self, plan: ProvisionPlan, now: float) -> list[SimOp]:
        """The plan's weight copies as simulator ops, each from a holder of its operator."""
        ops = []
        for k, c in enumerate(plan.adds):
            src = min(self.s.replicas.holders_of(c.index) or {c.device})
            nbytes = self.s.model.template.ops[c.index].weight_bytes
            est = self.s.builder.xfer_time(src, c.device, nbytes)
            grow = self.s.replicas.net_bytes(c.index, c.device)
            ops.append(SimOp(-1 - k, f"load {c.index}", c.device, Priority.HIGH, (), est, now,
                             None, grow, (), now))
        return ops


def keeps_deadlines(snap: Snapshot, copies: list[SimOp]) -> bool:
    """Whether `snap` with `copies` added runs out of no memory and makes no request miss a
    TTFT deadline that it keeps without them."""
    pred = simulate(snap, Candidate(tuple(copies)))
    if pred.oom:
        return False
    if not snap.deadlines:
        return True
    base = simulate(snap)
    for rid, deadline in snap.deadlines:
        t, before = pred.first_token.get(rid), base.first_token.get(rid)
        if t is not None and t > deadline and (before is None or before <= deadline):
            return False
    return True
