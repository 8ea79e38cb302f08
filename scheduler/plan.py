"""A batch plan (which requests feed which tokens, on which devices) and its op instances.

A plan has one or more chunks. Each chunk runs the operator chain over the
placement; consecutive chunks of a chunked pipeline overlap on a layer
split (chunk k+1's early groups run while chunk k's later groups run
elsewhere). Cross-device edges become a RECV on the destination and a SEND
on the source.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from executors.types import OpInstance, OpRole, Priority
from models.batch import BatchShape, SeqSpec, build_batch, shape_of
from models.template import GraphTemplate, OpKind
from scheduler.gmg import SimOp
from scheduler.simulator import Candidate
from scheduler.state import Placement, RequestState

OpTime = Callable[[str, str, BatchShape], float]  # (device, op name, shape) -> seconds
XferTime = Callable[[str, str, int], float]  # (src, dst, bytes) -> seconds


@dataclass(slots=True)
class Feed:
    """One request's tokens in one chunk, fed after `past` tokens of its KV."""

    state: RequestState
    tokens: list[int]
    past: int


@dataclass(slots=True)
class Plan:
    priority: Priority
    placement: Placement
    chunks: list[list[Feed]]
    ops: list[OpInstance] = field(default_factory=list)
    finals: list[OpInstance] = field(default_factory=list)  # last op of each chunk
    cancelled: bool = False  # its only request was aborted; queued ops were withdrawn

    @property
    def states(self) -> list[RequestState]:
        seen: dict[str, RequestState] = {}
        for chunk in self.chunks:
            for f in chunk:
                seen.setdefault(f.state.rid, f.state)
        return list(seen.values())

    @property
    def devices(self) -> set[str]:
        return set(self.placement)

    def num_tokens(self) -> int:
        return sum(len(f.tokens) for c in self.chunks for f in c)


@dataclass(slots=True)
class Builder:
    """Instantiates the template for a plan: op instances with shapes, estimates and memory."""

    template: GraphTemplate
    block_size: int
    op_time: OpTime
    xfer_time: XferTime
    ids: itertools.count = field(default_factory=itertools.count)

    def _seqs(self, chunk: list[Feed], device: str) -> list[SeqSpec]:
        out = []
        for f in chunk:
            table = f.state.tables.get(device, [])
            sample = f.past + len(f.tokens) >= f.state.num_tokens
            out.append(SeqSpec(f.state.rid, f.tokens, f.past, table, sample=sample,
                               sampling=f.state.req.sampling,
                               num_generated=len(f.state.output_ids)))
        return out

    def _op(self, plan: Plan, role: OpRole, index: int, name: str, device: str,
            shape: BatchShape, rids: tuple[str, ...]) -> OpInstance:
        op = OpInstance(next(self.ids), name, role, index, device, plan.priority, shape, rids)
        plan.ops.append(op)
        return op

    def _transfer(self, plan: Plan, src: OpInstance, dst: str) -> tuple[OpInstance, OpInstance]:
        t = self.template.ops[src.template_index]
        nbytes = t.output_bytes(src.shape)
        recv = self._op(plan, OpRole.RECV, -1, "recv", dst, src.shape, src.request_ids)
        send = self._op(plan, OpRole.SEND, -1, "send", src.device, src.shape, src.request_ids)
        recv.input, recv.transfer_bytes = src, nbytes
        send.input, send.peer, send.deps, send.transfer_bytes = src, recv, (src, recv), nbytes
        send.est_s = self.xfer_time(src.device, dst, nbytes)
        recv.mem_bytes = nbytes
        return recv, send

    def build(self, plan: Plan, tensors: bool) -> Plan:
        """Fill `plan.ops` / `plan.finals`; with `tensors`, build each device's Batch too."""
        plan.ops, plan.finals = [], []
        prev_chunk: dict[int, OpInstance] = {}
        for chunk in plan.chunks:
            prev_chunk = self._chunk(plan, chunk, prev_chunk, tensors)
        return plan

    def _chunk(self, plan: Plan, chunk: list[Feed], prev_chunk: dict[int, OpInstance],
               tensors: bool) -> dict[int, OpInstance]:
        rids = tuple(f.state.rid for f in chunk)
        seqs0 = self._seqs(chunk, plan.placement[0])
        shape = shape_of(seqs0)
        batches = {d: build_batch(self._seqs(chunk, d), self.block_size, _torch_dev(d))
                   for d in set(plan.placement)} if tensors else {}
        mine: dict[int, OpInstance] = {}
        prev: OpInstance | None = None
        for t in self.template.ops:
            if t.kind is OpKind.HEAD and shape.num_sampled == 0:
                break
            dev = plan.placement[t.index]
            op = self._op(plan, OpRole.COMPUTE, t.index, t.name, dev, shape, rids)
            deps: list[OpInstance] = []
            if prev is not None and prev.device != dev:
                recv, send = self._transfer(plan, prev, dev)
                op.input, deps = recv, [send]
            elif prev is not None:
                op.input, deps = prev, [prev]
            if t.kind is OpKind.LAYERS and t.index in prev_chunk:
                deps.append(prev_chunk[t.index])  # this chunk's attention reads that KV
            op.deps, op.batch = tuple(deps), batches.get(dev)
            op.est_s = self.op_time(dev, t.name, shape)
            op.mem_bytes = t.activation_bytes(shape)
            mine[t.index] = prev = op
        assert prev is not None
        plan.finals.append(prev)
        return mine


def _torch_dev(name: str) -> torch.device:
    return torch.device("cpu") if name.startswith("cpu") else torch.device(name)


def to_candidate(plan: Plan, kv_bytes: dict[str, int]) -> Candidate:
    """The plan's ops as simulator records (issued now, nothing done yet)."""
    firsts = first_token_ops(plan)
    ops = tuple(SimOp(op.op_id, op.name, op.device, op.priority,
                      tuple(d.op_id for d in op.deps), op.est_s, 0.0, None, op.mem_bytes,
                      firsts.get(op.op_id, ())) for op in plan.ops)
    return Candidate(ops, kv_bytes)


def first_token_ops(plan: Plan) -> dict[int, tuple[str, ...]]:
    """op id -> requests whose first token that op (a chunk's head) produces."""
    out: dict[int, tuple[str, ...]] = {}
    for chunk, final in zip(plan.chunks, plan.finals, strict=True):
        rids = tuple(f.state.rid for f in chunk
                     if not f.state.output_ids and f.past + len(f.tokens) >= f.state.num_tokens)
        if rids:
            out[final.op_id] = rids
    return out
