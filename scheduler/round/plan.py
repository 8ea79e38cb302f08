"""A batch plan (which requests feed which tokens, on which devices) and its op instances.

A plan has one or more chunks. Each chunk runs the operator chain over the
placement; consecutive chunks of a chunked pipeline overlap on a layer
split (chunk k+1's early groups run while chunk k's later groups run
elsewhere). Cross-device edges become a RECV on the destination and a SEND
on the source.

A policy builds a plan's op instances once, with shapes and estimates but no
tensors; the scheduler issues those same ops, and each device's batch
tensors are built from `BatchSource`s by the executor that runs them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from executors.types import OpInstance, OpRole, Priority
from models.batch import BatchShape
from models.template import GraphTemplate, OpKind
from scheduler.cost.firstrows import FirstRows
from scheduler.round.requestview import Placement, RequestView
from scheduler.sim.gmg import SimOp
from scheduler.sim.types import Candidate

OpTime = Callable[[str, str, BatchShape], float]  # (device, op name, shape) -> seconds
XferTime = Callable[[str, str, int], float]  # (src, dst, bytes) -> seconds


@dataclass(frozen=True, slots=True)
class Feed:
    """One request's tokens in one chunk: `num_tokens` tokens after `past` tokens of its KV."""

    req: RequestView
    past: int
    num_tokens: int

    @property
    def rid(self) -> str:
        return self.req.rid

    @property
    def samples(self) -> bool:
        """The chunk reaches the request's last known token, so the head samples its next."""
        return self.past + self.num_tokens >= self.req.num_tokens

    @property
    def num_draft(self) -> int:
        """Drafted tokens it feeds past the known ones (a verify step, `scheduler.spec`)."""
        return max(0, self.past + self.num_tokens - self.req.num_tokens)

    @property
    def scores_prompt(self) -> bool:
        """The head scores the prompt tokens this chunk feeds (`SamplingParams.prompt_logprobs`)."""
        return self.req.scores_prompt and self.past < self.req.prompt_len

    @property
    def first_token(self) -> bool:
        return self.samples and self.req.num_output == 0


@dataclass(slots=True)
class Plan:
    priority: Priority
    placement: Placement
    chunks: list[list[Feed]]
    ops: list[OpInstance] = field(default_factory=list)  # every op, in build order
    chunk_ops: list[list[OpInstance]] = field(default_factory=list)  # compute ops per chunk
    finals: list[OpInstance] = field(default_factory=list)  # last op of each chunk
    first_tokens: dict[int, tuple[str, ...]] = field(default_factory=dict)  # op id -> requests
    # whose first token that op (a chunk's head) samples
    predicted_first_token_s: float | None = None  # the policy's prediction, when it simulated
    # layers per operator of the chain it runs (models/variants.py); None: the model's own
    group_size: int | None = None
    candidate: Candidate | None = field(default=None, repr=False)  # its simulator records
    cancelled: bool = False  # its only request was aborted; queued ops were withdrawn
    # a wide plan (`executors.wide`): the device whose core its one-device chain borrows
    wide: str | None = None

    @property
    def rids(self) -> tuple[str, ...]:
        """Its requests, each once, in feed order."""
        return tuple(dict.fromkeys(f.rid for chunk in self.chunks for f in chunk))

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices it occupies: its placement's, and a wide plan's partner."""
        return tuple(dict.fromkeys((*self.placement, *([self.wide] if self.wide else []))))

    @property
    def is_prefill(self) -> bool:
        return any(f.num_tokens - f.num_draft > 1 for c in self.chunks for f in c)

    def num_tokens(self) -> int:
        return sum(f.num_tokens for c in self.chunks for f in c)


def shape_of_chunk(chunk: list[Feed]) -> BatchShape:
    return BatchShape(
        num_tokens=sum(f.num_tokens for f in chunk),
        num_seqs=len(chunk),
        num_sampled=sum(f.samples + f.num_draft for f in chunk),
        attn_work=sum(f.num_tokens * (f.past + f.num_tokens) for f in chunk),
        num_context_tokens=sum(f.past + f.num_tokens for f in chunk),
    )


@dataclass(slots=True)
class Builder:
    """Instantiates the template for a plan: op instances with shapes, estimates and memory."""

    template: GraphTemplate
    block_size: int
    op_time: OpTime
    xfer_time: XferTime
    first_rows: FirstRows | None = None  # charges first runs at new row counts (CPU)
    # a wide op's time over its time on one device's threads (`executors.wide`, profiled);
    # None: wide plans are not offered
    wide_factor: float | None = None
    partners: dict[str, tuple[str, ...]] = field(default_factory=dict)  # device -> lenders
    ids: itertools.count = field(default_factory=itertools.count)
    _bases: dict[int, int] = field(default_factory=dict)  # variant op -> its chain op

    def _base(self, index: int) -> int:
        """The placement index of template op `index` (a variant op's chain op)."""
        if index < len(self.template.ops):
            return index
        if index not in self._bases:
            self._bases[index] = self.template.base_index(index)
        return self._bases[index]

    def _op(self, plan: Plan, role: OpRole, index: int, name: str, device: str,
            shape: BatchShape, rids: tuple[str, ...]) -> OpInstance:
        op = OpInstance(next(self.ids), name, role, index, device, plan.priority, shape, rids)
        plan.ops.append(op)
        return op

    def _transfer(self, plan: Plan, src: OpInstance, dst: str) -> tuple[OpInstance, OpInstance]:
        t = self.template.op(src.template_index)
        nbytes = t.output_bytes(src.shape)
        recv = self._op(plan, OpRole.RECV, -1, "recv", dst, src.shape, src.request_ids)
        send = self._op(plan, OpRole.SEND, -1, "send", src.device, src.shape, src.request_ids)
        recv.input, recv.transfer_bytes = src, nbytes
        send.input, send.peer, send.deps, send.transfer_bytes = src, recv, (src, recv), nbytes
        send.est_s = self.xfer_time(src.device, dst, nbytes)
        recv.mem_bytes = nbytes
        return recv, send

    def build(self, plan: Plan) -> Plan:
        """Fill `plan.ops`, `plan.chunk_ops` and `plan.finals` (new op ids)."""
        plan.ops, plan.chunk_ops, plan.finals, plan.candidate = [], [], [], None
        if self.template.chains:
            plan.chunks = [part for chunk in plan.chunks for part in by_model(chunk)]
        prev_chunk: dict[int, OpInstance] = {}
        charged: set[int] = set()  # row counts whose first run this plan already carries
        for chunk in plan.chunks:
            prev_chunk = self._chunk(plan, chunk, prev_chunk, charged)
        if plan.wide is not None:
            self._widen(plan, plan.wide)
        plan.first_tokens = {}
        for chunk, final in zip(plan.chunks, plan.finals, strict=True):
            rids = tuple(f.rid for f in chunk if f.first_token)
            if rids:
                plan.first_tokens[final.op_id] = rids
        return plan

    def _chunk(self, plan: Plan, chunk: list[Feed], prev_chunk: dict[int, OpInstance],
               charged: set[int]) -> dict[int, OpInstance]:
        rids = tuple(f.rid for f in chunk)
        shape = shape_of_chunk(chunk)
        mine: dict[int, OpInstance] = {}
        prev: OpInstance | None = None
        for t in self.template.chain(chunk[0].req.model, plan.group_size):
            if (t.kind is OpKind.HEAD and shape.num_sampled == 0
                    and not any(f.scores_prompt for f in chunk)):
                break
            dev = plan.placement[self._base(t.index)]
            op = self._op(plan, OpRole.COMPUTE, t.index, t.name, dev, shape, rids)
            deps: list[OpInstance] = []
            if prev is not None and prev.device != dev:
                recv, send = self._transfer(plan, prev, dev)
                op.input, deps = recv, [send]
            elif prev is not None:
                op.input, deps = prev, [prev]
            if t.kind is OpKind.LAYERS and t.index in prev_chunk:
                deps.append(prev_chunk[t.index])  # this chunk's attention reads that KV
            op.deps = tuple(deps)
            op.est_s = self.op_time(dev, t.name, shape)
            if plan.wide is not None:
                op.est_s *= self.wide_factor or 1.0
            if t.kind is OpKind.LAYERS and self.first_rows is not None:
                op.est_s += self.first_rows.charge(dev, shape, op.est_s, charged)
            op.mem_bytes = t.activation_bytes(shape)
            mine[t.index] = prev = op
        assert prev is not None
        plan.chunk_ops.append(list(mine.values()))
        plan.finals.append(prev)
        return mine

    def _widen(self, plan: Plan, partner: str) -> None:
        """A wide plan's claim and hold on `partner` (first in `plan.ops`): the chain starts
        after the claim, and each of its ops runs on both devices' threads until the hold,
        estimated as long as the whole chain, ends (`executors.wide`)."""
        if len(set(plan.placement)) != 1 or partner in plan.placement:
            raise ValueError(f"a wide plan runs on one device and borrows another: "
                             f"{plan.placement[0]} and {partner}")
        compute = [op for ops in plan.chunk_ops for op in ops]
        shape, rids = compute[0].shape, plan.rids
        n = len(plan.ops)
        claim = self._op(plan, OpRole.HOLD, -1, "claim", partner, shape, rids)
        held = self._op(plan, OpRole.HOLD, -1, "hold", partner, shape, rids)
        held.deps, held.input = (claim,), plan.finals[-1]
        held.est_s = sum(op.est_s for op in compute)
        plan.ops[:] = [claim, held, *plan.ops[:n]]
        compute[0].deps = (*compute[0].deps, claim)
        for op in compute:
            op.wide = held


def by_model(chunk: list[Feed]) -> list[list[Feed]]:
    """A chunk cut into one chunk per model, in order of first appearance.

    NOTE: ops of different models never share a batch: a policy may put requests of
    several models in one plan (a decode step per placement), and each model's feeds
    then run as a chunk of their own, through that model's chain."""
    parts: dict[str, list[Feed]] = {}
    for f in chunk:
        parts.setdefault(f.req.model, []).append(f)
    return list(parts.values())


def sim_ops(plan: Plan, issued_at: float) -> tuple[SimOp, ...]:
    """The plan's ops as simulator records, issued at `issued_at`."""
    firsts = plan.first_tokens
    return tuple(SimOp(op.op_id, op.name, op.device, op.priority,
                       tuple(d.op_id for d in op.deps), op.est_s, issued_at, None, op.mem_bytes,
                       firsts.get(op.op_id, ()), issued_at) for op in plan.ops)


def to_candidate(plan: Plan, kv_bytes: dict[str, int], issued_at: float = 0.0) -> Candidate:
    """The plan's ops as a simulator candidate (the simulator issues them at its `now`)."""
    return Candidate(sim_ops(plan, issued_at), kv_bytes)
