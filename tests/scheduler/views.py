"""Round views built by hand, for policy tests that need no scheduler and no model weights."""

from __future__ import annotations

from collections.abc import Iterable

from executors.types import Priority
from scheduler.config import SchedulerConfig
from scheduler.round.plan import Builder
from scheduler.round.requestview import Placement, RequestView
from scheduler.round.view import RoundView
from scheduler.sim.gmg import DeviceView, SimOp, Snapshot
from tests.scheduler.cluster import weightless
from tests.scheduler.conftest import linear_time, xfer_time

DEVICES = ("cpu:0", "cpu:1")
CFG = SchedulerConfig(max_model_len=1024, max_batch_tokens=512)
NUM_OPS = len(weightless().template.ops)
BLOCK_BYTES = 1 << 16  # bytes of one KV block over every layer


def req(rid: str, priority: Priority = Priority.LOW, prompt: int = 40, max_tokens: int = 8,
        arrival: float = 0.0, slo: float | None = None, placement: Placement | None = None,
        computed: int = 0, output: int = 0, blocks: int = 0) -> RequestView:
    held = tuple((d, blocks) for d in sorted(set(placement))) if placement else ()
    return RequestView(rid, "t", priority, arrival, slo, prompt, max_tokens, output, computed,
                       placement, held)


def make_view(waiting: Iterable[RequestView] = (), runnable: Iterable[RequestView] = (),
              free_blocks: int = 1000, now: float = 0.0, ops: tuple[SimOp, ...] = (),
              deadlines: tuple[tuple[str, float], ...] = (),
              load: dict[str, float] | None = None, cfg: SchedulerConfig = CFG,
              watermark: int = 0, host_free_bytes: int = 0,
              running: Iterable[RequestView] = (),
              prefills: dict[tuple[str, Priority], int] | None = None,
              steps: Iterable[tuple[Placement, Priority]] | None = None) -> RoundView:
    """`steps`: (placement, class) of each decode step in flight; by default each running
    request that is not prefilling is in a step of its own class."""
    running = tuple(running)  # read twice below
    by_class: dict[Priority, list[RequestView]] = {p: [] for p in Priority}
    for r in waiting:
        by_class[r.priority].append(r)
    devs = tuple(DeviceView(d, 1 << 40, 0) for d in DEVICES)
    snap = Snapshot(now, ops, devs, deadlines)
    builder = Builder(weightless().template, cfg.block_size, linear_time, xfer_time)
    return RoundView(now, cfg, DEVICES, NUM_OPS, {p: tuple(v) for p, v in by_class.items()},
                     tuple(runnable), running, dict.fromkeys(DEVICES, free_blocks),
                     dict.fromkeys(DEVICES, watermark), cfg.block_size, BLOCK_BYTES,
                     host_free_bytes, snap, load or dict.fromkeys(DEVICES, 0.0), builder,
                     prefills or {},
                     frozenset(), cfg.default_ttft_slo_s,
                     decode_classes=frozenset(_steps(running) if steps is None else steps))


def _steps(running: Iterable[RequestView]) -> set[tuple[Placement, Priority]]:
    return {(r.placement, r.priority) for r in running
            if r.placement is not None and not r.is_prefilling}


def single(device: str) -> Placement:
    return (device,) * NUM_OPS
