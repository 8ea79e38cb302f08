"""One scheduler over several models (models/modelset.py): `chat` runs on cpu:0 only,
`batch` on both devices. Hand-built views for the policy; fake executors on a virtual clock
(1 ms per op + 0.1 ms per token, see conftest) for the whole scheduler."""

from __future__ import annotations

import dataclasses

import pytest

from executors.interference import OP_CLASSES, Interference
from executors.types import Device, OpRole, Priority
from models.batch import BatchShape
from models.modelset import ModelSet, model_set
from scheduler.config import SchedulerConfig
from scheduler.cost.estimators import Estimators
from scheduler.factory import build_scheduler
from scheduler.policies import make_policy
from scheduler.round.plan import Builder
from scheduler.round.requestview import RequestView
from scheduler.round.view import RoundView
from scheduler.scheduler import Scheduler
from scheduler.sim.gmg import SimOp
from tests.scheduler.cluster import ClusterRun, weightless
from tests.scheduler.conftest import linear_time, xfer_time
from tests.scheduler.views import make_view, req

DEVICES = ["cpu:0", "cpu:1"]


def two_models() -> ModelSet:
    return model_set([("chat", weightless(), ("cpu:0",)), ("batch", weightless(), None)])


def view_of(s: ModelSet, **kw: object) -> RoundView:
    """`make_view` over the set's chain, its requests placed as their models allow."""
    view = make_view(**kw)  # type: ignore[arg-type]
    builder = Builder(s.template, view.cfg.block_size, linear_time, xfer_time)
    return dataclasses.replace(view, builder=builder, num_ops=len(s.template.ops),
                               model_devices=s.devices_of(DEVICES))


def of(model: str, r: RequestView) -> RequestView:
    return dataclasses.replace(r, model=model)


def _chat_prefill(deadline_s: float) -> tuple[tuple[SimOp, ...], tuple[tuple[str, float], ...]]:
    """chat's request "a" in flight on cpu:0: 100 ms of layers, then its head (first token at
    105 ms when nothing slows it)."""
    a = SimOp(1, "chat/layers[0:1]", "cpu:0", Priority.HIGH, (), 0.1, 0.0, 0.0, 0, (), 0.0)
    head = SimOp(2, "chat/head", "cpu:0", Priority.HIGH, (1,), 0.005, 0.0, None, 0, ("a",), 0.0)
    return (a, head), (("a", deadline_s),)


def test_a_low_models_prefill_fills_the_idle_device_of_the_high_model() -> None:
    s = two_models()
    low = of("batch", req("low", Priority.LOW, prompt=40))
    d = make_policy("slice").schedule(view_of(s, waiting=[low],
                                              load={"cpu:0": 0.0, "cpu:1": 0.5}))
    (plan,) = d.plans
    assert plan.placement == ("cpu:0",) * 12 and d.admissions[0].rid == "low"
    assert {op.name for op in plan.ops} == {
        "batch/embed", "batch/layers[0:1]", "batch/layers[1:2]", "batch/layers[2:3]",
        "batch/layers[3:4]", "batch/head"}


def test_a_low_models_prefill_that_would_break_a_deadline_is_vetoed() -> None:
    # on cpu:1 the batch prefill would overlap chat's layers on their shared host (1.5x
    # slower: past 110 ms); on cpu:0 it queues behind them and harms nobody
    s = two_models()
    shared = Interference(dict.fromkeys(DEVICES, "host"),
                          {(x, y): 1.5 for x in OP_CLASSES for y in OP_CLASSES})

    def placed(deadline_s: float) -> list[str]:
        ops, deadlines = _chat_prefill(deadline_s)
        view = view_of(s, waiting=[of("batch", req("low", Priority.LOW, prompt=40))], ops=ops,
                       deadlines=deadlines, load={"cpu:0": 0.105, "cpu:1": 0.0})
        assert view.snapshot is not None
        view = dataclasses.replace(view, snapshot=dataclasses.replace(
            view.snapshot, interference=shared))
        return [p.placement[0] for p in make_policy("slice").schedule(view).plans]

    assert placed(0.11) == ["cpu:0"]  # vetoed where it overlaps: behind chat's ops instead
    assert placed(1.0) == ["cpu:1"]  # slowed, but chat keeps its deadline


def test_a_model_runs_only_on_its_devices_and_never_shares_a_batch() -> None:
    s = two_models()
    view = view_of(s, waiting=[of("chat", req("hp", Priority.HIGH, prompt=40, slo=1.0))],
                   load={"cpu:0": 0.5, "cpu:1": 0.0})
    (plan,) = make_policy("slice").schedule(view).plans
    assert set(plan.placement) == {"cpu:0"}  # cpu:1 is idle but chat does not run there
    on0 = ("cpu:0",) * 12
    a = of("chat", req("a", Priority.HIGH, prompt=20, computed=20, output=1, placement=on0,
                       blocks=2))
    b = of("batch", req("b", Priority.HIGH, prompt=20, computed=20, output=1, placement=on0,
                        blocks=2))
    (step,) = make_policy("slice").schedule(view_of(s, runnable=[a, b])).plans
    assert [[f.rid for f in c] for c in step.chunks] == [["a"], ["b"]]
    for chunk, ops in zip(step.chunks, step.chunk_ops, strict=True):
        model = chunk[0].req.model
        assert all(op.name.startswith(f"{model}/") for op in ops)


def test_nothing_is_preempted_on_a_device_the_waiting_model_does_not_run_on() -> None:
    s = two_models()
    hp = of("chat", req("hp", Priority.HIGH, prompt=40, slo=1.0))
    on1 = ("cpu:1",) * 12
    low = of("batch", req("low", Priority.LOW, prompt=40, computed=40, output=1, placement=on1,
                          blocks=10))
    d = make_policy("slice").schedule(view_of(s, waiting=[hp], runnable=[low], free_blocks=0))
    assert not d.preemptions and not d.admissions  # chat waits for cpu:0; low keeps cpu:1
    near = of("batch", req("near", Priority.LOW, prompt=40, computed=40, output=1,
                           placement=("cpu:0",) * 12, blocks=10))
    d = make_policy("slice").schedule(view_of(s, waiting=[hp], runnable=[low, near],
                                              free_blocks=0))
    assert [p.rid for p in d.preemptions] == ["near"] and d.admissions[0].rid == "hp"


def test_a_prompt_of_a_model_that_does_not_run_there_is_not_packed_into_a_batch() -> None:
    s = model_set([("chat", weightless(), ("cpu:0",)), ("batch", weightless(), ("cpu:1",))])
    busy1 = SimOp(9, "batch/layers[0:1]", "cpu:1", Priority.HIGH, (), 0.5, 0.0, 0.0, 0, (), 0.0)
    waiting = [of("chat", req("a", Priority.HIGH, prompt=40, slo=1.0)),
               of("batch", req("b", Priority.HIGH, prompt=40, arrival=0.01, slo=1.0)),
               of("chat", req("c", Priority.HIGH, prompt=40, arrival=0.02, slo=1.0))]
    d = make_policy("slice").schedule(view_of(s, waiting=waiting, ops=(busy1,),
                                              prefills={("cpu:1", Priority.HIGH): 1}))
    assert not d.failures
    assert [a.rid for a in d.admissions] == ["a"]  # "b" waits for cpu:1; "c" behind it


async def test_both_models_run_to_the_end_on_one_scheduler() -> None:
    cfg = SchedulerConfig(policy="slice", max_model_len=1024, max_batch_tokens=512,
                          default_ttft_slo_s=1.0)
    async with ClusterRun("slice", model=two_models(), cfg=cfg) as run:
        outs = [run.submit(f"c{i}", Priority.HIGH, 30, 4, slo_s=0.5, model="chat")
                for i in range(3)]
        outs += [run.submit(f"b{i}", Priority.LOW, 200, 4, model="batch") for i in range(6)]
        await run.run_out()
    assert all(len(o.tokens) == 4 and o.error is None for o in outs)
    model_of = {**{f"c{i}": "chat" for i in range(3)}, **{f"b{i}": "batch" for i in range(6)}}
    compute = [op for op in run.ops if op.role is OpRole.COMPUTE]
    for op in compute:
        (model,) = {model_of[r] for r in op.request_ids}  # one model per batch
        assert op.name.startswith(f"{model}/")
        assert model == "batch" or op.device == "cpu:0"
    assert {op.device for op in compute if op.name.startswith("batch/")} == set(DEVICES)


@pytest.mark.parametrize("policy", ["fcfs", "priority", "static"])
async def test_every_policy_keeps_each_model_on_its_devices(policy: str) -> None:
    async with ClusterRun(policy, model=two_models()) as run:
        outs = [run.submit(f"c{i}", Priority.HIGH, 30, 3, slo_s=0.5, model="chat")
                for i in range(2)]
        outs += [run.submit(f"b{i}", Priority.LOW, 100, 3, model="batch") for i in range(3)]
        await run.run_out()
    assert all(len(o.tokens) == 3 and o.error is None for o in outs)
    chat = {op.device for op in run.ops if op.role is OpRole.COMPUTE
            and op.name.startswith("chat/")}
    assert chat == {"cpu:0"}


async def test_the_stats_count_requests_per_model() -> None:
    async with ClusterRun("slice", model=two_models()) as run:
        run.submit("c", Priority.HIGH, 30, 2, slo_s=0.5, model="chat")
        run.submit("b", Priority.LOW, 30, 2, model="batch")
        run.submit("d", Priority.LOW, 30, 2)  # no model: the first
        stats = run.sched.stats()
        await run.run_out()
    assert stats.num_waiting_by_model == {("chat", "t", "high"): 1, ("batch", "t", "low"): 1,
                                          ("chat", "t", "low"): 1}
    assert run.sched.stats().num_running_by_model == {}


async def test_the_prefix_cache_keeps_each_models_blocks_to_itself() -> None:
    prompt = [5 + i % 40 for i in range(64)]
    async with ClusterRun("slice", model=two_models()) as run:
        run.submit("first", Priority.NORMAL, 0, 2, prompt=prompt, model="chat")
        await run.run_out()
        other = run.submit("other", Priority.NORMAL, 0, 2, prompt=prompt, model="batch")
        same = run.submit("same", Priority.NORMAL, 0, 2, prompt=prompt, model="chat")
        await run.run_out()
    assert other.num_cached_tokens == 0 and same.num_cached_tokens > 0


def test_an_unknown_model_is_refused_at_submit() -> None:
    sched = Scheduler(two_models(), [Device(d, 64 << 20) for d in DEVICES], "slice",
                      linear_time, xfer_time)
    assert sched.model_of("") == "chat" and sched.model_of("batch") == "batch"
    with pytest.raises(ValueError, match="not served"):
        sched.model_of("other")


def test_weights_that_do_not_fit_their_devices_fail_at_start_up_with_the_numbers() -> None:
    one = weightless().template.weight_bytes
    devs = [Device("cpu:0", int(1.5 * one)), Device("cpu:1", 64 << 20)]
    with pytest.raises(ValueError, match=r"cpu:0: .* GiB cannot hold .* \(chat .*, batch .*\)"):
        Scheduler(two_models(), devs, "slice", linear_time, xfer_time)
    alone = model_set([("chat", weightless(), ("cpu:1",)), ("batch", weightless(), ("cpu:1",))])
    sched = Scheduler(alone, [Device(d, 64 << 20) for d in DEVICES], "slice", linear_time,
                      xfer_time)
    assert sched.ledgers["cpu:0"].used("weights") == 0  # it runs neither model
    assert sched.ledgers["cpu:1"].used("weights") == 2 * one
    with pytest.raises(ValueError, match="not among the devices"):
        Scheduler(model_set([("chat", weightless(), ("cpu:7",))]),
                  [Device(d, 64 << 20) for d in DEVICES], "slice", linear_time, xfer_time)


def test_the_factory_refuses_a_bad_set_before_profiling() -> None:
    devs = [Device(d, 64 << 20) for d in DEVICES]
    cfg = SchedulerConfig(policy="slice")
    with pytest.raises(ValueError, match="not among the devices"):  # weightless: no profile
        build_scheduler(model_set([("chat", weightless(), ("cpu:7",))]), devs, cfg)
    with pytest.raises(ValueError, match="cannot hold"):
        build_scheduler(two_models(), [Device("cpu:0", 1 << 10), *devs[1:]], cfg)
    with pytest.raises(ValueError, match="provisioning model is not supported"):
        build_scheduler(two_models(), devs, SchedulerConfig(policy="slice",
                                                            provisioning="model"))


def test_the_estimators_are_keyed_by_model() -> None:
    shape = BatchShape(10, 1, 1, 100, 10)
    chat, batch = Estimators(), Estimators()
    chat.fit_op("cpu", "head", [shape, BatchShape(20, 1, 1, 400, 20)], [0.001, 0.002])
    batch.fit_op("cpu", "head", [shape, BatchShape(20, 1, 1, 400, 20)], [0.004, 0.008])
    chat.take_models([("chat", chat), ("batch", batch)])
    assert {name for _, name in chat.ops} == {"chat/head", "batch/head"}
    assert chat.op_time("cpu:0", "chat/head", shape) == pytest.approx(0.001, rel=0.05)
    assert chat.op_time("cpu:1", "batch/head", shape) == pytest.approx(0.004, rel=0.05)
