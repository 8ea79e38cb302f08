from executors.types import OpInstance, OpRole, OpState, Priority
from models.choices import GemmChoice, KernelChoice, LayerChoice
from models.template import OpKind
from scheduler.config import SchedulerConfig
from scheduler.cost.firstrows import MIN_SAMPLES, SEEN_CAPACITY, FirstRows
from scheduler.round.plan import Builder, Feed, Plan
from tests.scheduler.cluster import weightless
from tests.scheduler.conftest import linear_time, xfer_time
from tests.scheduler.views import req

TEMPLATE = weightless().template


def plan(first: FirstRows, tokens: int, chunks: int = 1, device: str = "cpu:0") -> Plan:
    """One request's prompt of `tokens` per chunk, built with `first`."""
    b = Builder(TEMPLATE, SchedulerConfig().block_size, linear_time, xfer_time, first)
    r = req("r", prompt=tokens * chunks)
    feeds = [[Feed(r, k * tokens, tokens)] for k in range(chunks)]
    return b.build(Plan(Priority.LOW, (device,) * len(TEMPLATE.ops), feeds))


def layer_ops(p: Plan) -> list[OpInstance]:
    return [op for op in p.ops if op.role is OpRole.COMPUTE
            and TEMPLATE.ops[op.template_index].kind is OpKind.LAYERS]


def run(first: FirstRows, p: Plan, slowdown: float) -> None:
    """Issue `p` and observe its ops, the first-run ones `slowdown` times their estimate."""
    first.issued(p.ops, TEMPLATE, linear_time)
    for op in p.ops:
        base = linear_time(op.device, op.name, op.shape)
        op.state, op.start = OpState.DONE, 0.0
        op.end = base * (slowdown if op.op_id in first.pending else 1.0)
        first.observed(op)


def test_nothing_is_charged_until_the_ratio_is_learnt() -> None:
    first = FirstRows()
    for k in range(MIN_SAMPLES):
        p = plan(first, 100 + 16 * k)
        assert all(op.est_s == linear_time(op.device, op.name, op.shape) for op in p.ops)
        run(first, p, slowdown=2.5)
    assert first.ratio() == 2.5


def test_the_first_layer_group_at_a_new_row_count_is_charged_once_per_plan() -> None:
    first = FirstRows()
    first.ratios.extend([2.0] * MIN_SAMPLES)
    layers = layer_ops(plan(first, 123, chunks=2))
    base = [linear_time(op.device, op.name, op.shape) for op in layers]
    assert layers[0].est_s == 2 * base[0]  # the first run at 123 rows
    assert [op.est_s for op in layers[1:]] == base[1:]  # later groups and chunks reuse it
    run(first, plan(first, 123), slowdown=2.0)
    assert all(op.est_s == linear_time(op.device, op.name, op.shape)
               for op in plan(first, 123).ops)  # 123 rows ran: no charge any more


def test_first_runs_are_learnt_here_not_by_the_estimators() -> None:
    first = FirstRows()
    p = plan(first, 77)
    first.issued(p.ops, TEMPLATE, linear_time)
    charged = [op for op in layer_ops(p) if op.op_id in first.pending]
    assert len(charged) == 1  # the first layer group only
    for op in p.ops:
        op.state, op.start, op.end = OpState.DONE, 0.0, 0.01
        assert first.observed(op) == (op is charged[0])
    assert not first.pending


def test_other_devices_and_old_row_counts_are_not_charged() -> None:
    first = FirstRows()
    first.ratios.extend([3.0] * MIN_SAMPLES)
    gpu = plan(first, 50, device="cuda:0")
    assert all(op.est_s == linear_time(op.device, op.name, op.shape) for op in gpu.ops)
    for k in range(SEEN_CAPACITY + 1):
        first.issued(plan(first, 1000 + k).ops, TEMPLATE, linear_time)
    assert 1000 not in first.seen and len(first.seen) == SEEN_CAPACITY  # the oldest forgotten
    op = layer_ops(plan(first, 1000))[0]
    assert op.est_s == 3.0 * linear_time(op.device, op.name, op.shape)  # charged again


def test_ops_that_never_ran_are_forgotten() -> None:
    first = FirstRows()
    for k in range(SEEN_CAPACITY + 10):  # issued, withdrawn, never observed
        ops = plan(first, 2000 + k).ops
        for i, op in enumerate(ops):
            op.op_id = 100 * k + i  # NOTE: unique, as one scheduler's builder numbers them
        first.issued(ops, TEMPLATE, linear_time)
    assert len(first.pending) == SEEN_CAPACITY


def test_with_padded_rows_a_count_in_a_bucket_already_run_is_not_charged() -> None:
    first = FirstRows()
    first.configure(KernelChoice(GemmChoice("aten", native_rows=2), LayerChoice(pad_rows=16)))
    first.ratios.extend([2.0] * MIN_SAMPLES)
    run(first, plan(first, 100), slowdown=2.0)  # runs on 112 rows
    for tokens in (97, 105, 112):
        assert all(op.est_s == linear_time(op.device, op.name, op.shape)
                   for op in plan(first, tokens).ops)
    op = layer_ops(plan(first, 113))[0]  # 128 rows: a new bucket
    assert op.est_s == 2.0 * linear_time(op.device, op.name, op.shape)


def test_row_counts_a_warm_up_ran_are_not_charged() -> None:
    first = FirstRows()
    first.ratios.extend([2.0] * MIN_SAMPLES)
    first.ran([128, 144])
    assert all(op.est_s == linear_time(op.device, op.name, op.shape)
               for op in plan(first, 128).ops)
    op = layer_ops(plan(first, 160))[0]
    assert op.est_s == 2.0 * linear_time(op.device, op.name, op.shape)
