"""`slice`'s decisions on hand-built views: placement by simulation, harm checks, OOM."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from executors.interference import OP_CLASSES, Interference
from executors.types import Priority
from models.batch import BatchShape
from scheduler.policies import make_policy
from scheduler.policies import slice as slice_policy
from scheduler.policies.scoring import Scored, score
from scheduler.policies.slice import SlicePolicy
from scheduler.round.calibration import ONE_DEVICE, PIPELINE, SPLIT
from scheduler.round.plan import Builder
from scheduler.sim.gmg import DeviceView, SimOp, Snapshot
from scheduler.sim.simulator import simulate
from scheduler.sim.types import Candidate, Prediction
from tests.scheduler.cluster import weightless
from tests.scheduler.conftest import linear_time, xfer_time
from tests.scheduler.views import make_view, req, single


def _busy(device: str, seconds: float, priority: Priority = Priority.LOW) -> SimOp:
    """A running op that keeps `device` busy for `seconds` from time 0."""
    return SimOp(10_000 + hash(device) % 100, "layers[0:1]", device, priority, (), seconds, 0.0,
                 0.0, 0, (), 0.0)


class Simulations(list[Candidate | None]):
    """The candidates a policy simulated (None: the baseline), through `simulate`."""

    def __call__(self, snap: Snapshot, cand: Candidate | None) -> Prediction:
        self.append(cand)
        return simulate(snap, cand)


def test_a_short_urgent_prefill_goes_to_the_idle_device() -> None:
    hp = req("hp", Priority.HIGH, prompt=40, slo=1.0)
    d = make_policy("slice").schedule(make_view(waiting=[hp], ops=(_busy("cpu:0", 0.5),),
                                                load={"cpu:0": 0.5, "cpu:1": 0.0}))
    (plan,) = d.plans
    assert plan.placement == single("cpu:1") and d.admissions[0].placement == single("cpu:1")
    assert plan.predicted_first_token_s is not None and plan.predicted_first_token_s < 0.5


def test_a_long_urgent_prefill_takes_the_pipeline_when_it_is_predicted_first() -> None:
    hp = req("hp", Priority.HIGH, prompt=480, slo=10.0)  # a deadline that one device meets too
    d = make_policy("slice").schedule(make_view(waiting=[hp]))
    (plan,) = d.plans
    assert len(set(plan.placement)) == 2 and len(plan.chunks) > 1


def test_low_work_that_would_break_a_deadline_is_held_back() -> None:
    # an urgent request's op on cpu:1 (5 ms), then its head on cpu:0 (5 ms): done at 10 ms
    # if cpu:0 is free at 5 ms; a low prefill started on idle cpu:0 now would hold it ~50 ms
    a = SimOp(1, "layers[0:1]", "cpu:1", Priority.HIGH, (), 0.005, 0.0, None, 0, (), 0.0)
    b = SimOp(2, "head", "cpu:0", Priority.HIGH, (1,), 0.005, 0.0, None, 0, ("hp",), 0.0)
    low = req("low", Priority.LOW, prompt=500)
    d = make_policy("slice").schedule(
        make_view(waiting=[low], ops=(a, b), deadlines=(("hp", 0.02),)))
    assert [p.placement for p in d.plans] == [single("cpu:1")] and d.retry_on_progress
    relaxed = make_policy("slice").schedule(
        make_view(waiting=[low], ops=(a, b), deadlines=(("hp", 10.0),)))
    assert [p.placement for p in relaxed.plans] == [single("cpu:0")]
    assert not relaxed.retry_on_progress


def test_an_urgent_prefill_avoids_slowing_an_earlier_one_past_its_deadline() -> None:
    # "a" (issued before) runs on cpu:0: 100 ms, then its head; first token at 105 ms alone.
    # Started now on idle cpu:1, "b" would overlap it on their shared host and slow it past
    # 110 ms.
    a = SimOp(20_001, "layers[0:1]", "cpu:0", Priority.HIGH, (), 0.1, 0.0, 0.0, 0, (), -0.01)
    head = SimOp(20_002, "head", "cpu:0", Priority.HIGH, (20_001,), 0.005, 0.0, None, 0, ("a",),
                  -0.01)
    shared = Interference(dict.fromkeys(("cpu:0", "cpu:1"), "host"),
                          {(x, y): 1.5 for x in OP_CLASSES for y in OP_CLASSES})

    def placed(deadline: float, inter: Interference | None) -> str:
        view = make_view(waiting=[req("b", Priority.HIGH, prompt=40, slo=10.0)], ops=(a, head),
                         deadlines=(("a", deadline),))
        assert view.snapshot is not None
        view = dataclasses.replace(view, snapshot=dataclasses.replace(
            view.snapshot, interference=inter))
        (plan,) = make_policy("slice").schedule(view).plans
        return plan.placement[0]

    assert placed(0.11, None) == "cpu:1"  # no co-location model: nothing to harm
    assert placed(1.0, shared) == "cpu:1"  # slowed, but "a" keeps its deadline
    assert placed(0.11, shared) == "cpu:0"  # waits behind "a" instead


def test_when_every_candidate_is_oom_the_request_waits_without_error() -> None:
    # KV fits, but no device has room for activations: this once recursed without end
    hp = req("hp", Priority.HIGH, prompt=200, slo=1.0)
    view = make_view(waiting=[hp])
    assert view.snapshot is not None
    full = tuple(DeviceView(d.name, 1000, 999) for d in view.snapshot.devices)
    view = dataclasses.replace(view, snapshot=dataclasses.replace(view.snapshot, devices=full))
    d = make_policy("slice").schedule(view)
    assert d.plans == [] and d.admissions == [] and d.failures == [] and d.retry_on_progress


_LONG1 = (_busy("cpu:1", 0.5, Priority.HIGH),)  # cpu:1 runs a long prefill of the class


def _prefilling(*devices: str, priority: Priority = Priority.HIGH) -> dict:
    """Prefill plans in flight: one of `priority` whose first op runs on each device."""
    return {(d, priority): 1 for d in devices}


def test_urgent_requests_wait_while_every_device_runs_a_prefill_of_their_class() -> None:
    hp = req("hp", Priority.HIGH, prompt=40, slo=1.0)
    d = make_policy("slice").schedule(make_view(waiting=[hp],
                                                prefills=_prefilling("cpu:0", "cpu:1")))
    assert not d.plans and not d.admissions
    assert not d.retry_on_progress  # NOTE: the end of a plan brings the next round anyway
    low_busy = _prefilling("cpu:0", "cpu:1", priority=Priority.LOW)
    d = make_policy("slice").schedule(make_view(waiting=[hp], prefills=low_busy))
    assert [a.rid for a in d.admissions] == ["hp"]


def test_waiting_urgent_requests_are_packed_into_one_batch_on_the_free_device() -> None:
    hps = [req(f"hp{i}", Priority.HIGH, prompt=40, arrival=0.01 * i, slo=1.0) for i in range(3)]
    d = make_policy("slice").schedule(make_view(waiting=hps, ops=_LONG1,
                                                prefills=_prefilling("cpu:1")))
    (plan,) = d.plans
    assert plan.placement == single("cpu:0")
    assert [f.rid for f in plan.chunks[0]] == ["hp0", "hp1", "hp2"]
    assert all(f.num_tokens == 40 for f in plan.chunks[0])  # whole prompts
    assert [a.rid for a in d.admissions] == ["hp0", "hp1", "hp2"]
    assert plan.predicted_first_token_s is not None


def test_nothing_is_packed_while_another_device_is_free() -> None:
    hps = [req(f"hp{i}", Priority.HIGH, prompt=40, arrival=0.01 * i, slo=1.0) for i in range(2)]
    d = make_policy("slice").schedule(make_view(waiting=hps))
    assert sorted(p.placement[0] for p in d.plans) == ["cpu:0", "cpu:1"]
    assert all(len(p.chunks[0]) == 1 for p in d.plans)


def test_a_pack_shrinks_until_the_first_request_keeps_its_deadline() -> None:
    # alone: 6 ops of 1 ms + 0.1 ms/token -> 30 ms; two prompts 54 ms; three 78 ms
    a = req("a", Priority.HIGH, prompt=40, slo=0.06)
    b = req("b", Priority.HIGH, prompt=40, slo=0.07)
    c = req("c", Priority.HIGH, prompt=40, slo=0.07, arrival=0.001)
    d = make_policy("slice").schedule(make_view(waiting=[c, b, a], ops=_LONG1,
                                                prefills=_prefilling("cpu:1")))
    (plan,) = d.plans
    assert [f.rid for f in plan.chunks[0]] == ["a", "b"]
    assert [a.rid for a in d.admissions] == ["a", "b"]  # "c" waits for the next plan's end


def test_low_work_fills_the_gaps_while_urgent_requests_wait_only_for_a_prefill() -> None:
    hp = req("hp", Priority.HIGH, prompt=40, slo=10.0)
    low = req("low", Priority.LOW, prompt=40)
    d = make_policy("slice").schedule(make_view(waiting=[hp, low],
                                                prefills=_prefilling("cpu:0", "cpu:1")))
    assert [a.rid for a in d.admissions] == ["low"]
    small = req("small", Priority.LOW, prompt=8)  # 1 block fits where hp's 3 do not
    no_room = make_policy("slice").schedule(make_view(waiting=[hp, small], free_blocks=2))
    assert not no_room.admissions  # hp waits for memory: low work may not take it


def test_requests_decoding_on_the_device_ride_along_in_a_prefill_of_their_class() -> None:
    hp = req("hp", Priority.HIGH, prompt=40, slo=1.0)
    on0 = single("cpu:0")
    dec = req("dec", Priority.HIGH, prompt=20, computed=20, output=1, placement=on0, blocks=2)
    low = req("low", Priority.LOW, prompt=20, computed=20, output=1, placement=on0, blocks=2)
    d = make_policy("slice").schedule(make_view(waiting=[hp], runnable=[dec, low],
                                                ops=(_busy("cpu:1", 0.5, Priority.HIGH),),
                                                prefills=_prefilling("cpu:1")))
    prefill = next(p for p in d.plans if p.is_prefill)
    assert prefill.placement == on0 and prefill.priority == Priority.HIGH
    assert [(f.rid, f.num_tokens) for f in prefill.chunks[0]] == [("hp", 40), ("dec", 1)]
    # the low request decodes in a step of its own, at its own class
    assert [(p.priority, p.rids) for p in d.plans if not p.is_prefill] == [(Priority.LOW,
                                                                            ("low",))]


def test_a_prefill_weighs_the_delay_it_adds_to_requests_decoding_where_it_runs() -> None:
    hp = req("hp", Priority.HIGH, prompt=40, slo=1.0)  # 30 ms on one device
    decs = [req(f"d{i}", Priority.HIGH, prompt=20, computed=20, output=1,
                placement=single("cpu:0"), blocks=2) for i in range(3)]
    short1 = (_busy("cpu:1", 0.01, Priority.HIGH),)

    def device(runnable: list) -> str:
        d = make_policy("slice").schedule(make_view(waiting=[hp], runnable=runnable, ops=short1))
        return next(p for p in d.plans if "hp" in p.rids).placement[0]

    assert device([]) == "cpu:0"  # first token 10 ms earlier
    assert device(decs) == "cpu:1"  # 10 ms later, sparing three requests 30 ms each
    low = [dataclasses.replace(q, priority=Priority.LOW) for q in decs]
    assert device(low) == "cpu:0"  # a lower class's steps wait anyway


def test_a_long_prompt_is_split_only_while_splits_run_as_fast_as_predicted() -> None:
    hp = req("hp", Priority.HIGH, prompt=480, slo=10.0)
    decs = [req(f"d{i}", Priority.HIGH, prompt=20, computed=20, output=1,
                placement=single(dev), blocks=2) for i, dev in enumerate(("cpu:0", "cpu:1"))]
    view = make_view(waiting=[hp], runnable=decs)

    def devices(factors: dict[str, float]) -> int:
        d = make_policy("slice").schedule(dataclasses.replace(view, first_token_factors=factors))
        return len(set(next(p for p in d.plans if "hp" in p.rids).placement))

    assert devices({}) == 2
    # as measured (docs/benchmarks/http.md)
    assert devices({ONE_DEVICE: 1.0, SPLIT: 1.6, PIPELINE: 1.6}) == 1


def test_more_chunks_are_simulated_only_while_each_count_brings_the_first_token_earlier(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scored: list[tuple[tuple[str, ...], int, tuple[int, float]]] = []
    policy = SlicePolicy()

    def spy(draft, r, placement, chunks):  # type: ignore[no-untyped-def]
        out = score(draft, r, placement, chunks)
        scored.append((placement, len(chunks), out.reach if out else (9, 0.0)))
        return out

    monkeypatch.setattr(slice_policy, "score", spy)

    def fixed_heavy(device: str, name: str, shape: BatchShape) -> float:
        return 20e-3 + 1e-5 * shape.num_tokens  # chunks cost their ops' fixed time again

    for prompt, cost in ((480, linear_time), (300, fixed_heavy)):
        view = make_view(waiting=[req(f"p{prompt}", Priority.HIGH, prompt=prompt, slo=10.0)])
        builder = Builder(weightless().template, view.cfg.block_size, cost, xfer_time)
        policy.schedule(dataclasses.replace(view, builder=builder))
    ladders: list[list[tuple[int, tuple[int, float]]]] = []
    for _, n, sc in scored:  # NOTE: a ladder's rungs are scored one after another
        if n == 1:
            ladders.append([])
        ladders[-1].append((n, sc))
    stopped = 0
    for rungs in ladders:
        for i in range(2, len(rungs)):  # a rung is climbed only past one that improved
            assert rungs[i - 1][1] < rungs[i - 2][1]
        stopped += len(rungs) == 2 and rungs[1][1] >= rungs[0][1]  # no 4-chunk simulated
    assert stopped and any(len(rungs) == 3 for rungs in ladders)  # both ways occur here


def test_more_chunks_are_tried_while_the_first_token_comes_earlier_though_decoders_wait_longer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # as measured alone in the saturating recipe's first minute: a split of a 400-token
    # prompt in 2 chunks holds the decoding requests a little longer than the split in one
    # and brings the first token earlier; 4 chunks then keep the deadline
    table = {(1, 1): (1, 3.0, 0.70), (2, 1): (1, 2.85, 0.57), (2, 2): (1, 2.96, 0.52),
             (2, 4): (0, 2.90, 0.46)}  # (devices, chunks) -> (missed, cost, first token)

    def scripted(draft, r, placement, chunks):  # type: ignore[no-untyped-def]
        out = score(draft, r, placement, chunks)
        assert out is not None
        missed, cost, first = table[len(set(placement)), len(chunks)]
        now = draft.view.now
        return Scored(out.plan, (missed, now + cost), now + first)

    monkeypatch.setattr(slice_policy, "score", scripted)
    view = make_view(waiting=[req("hp", Priority.HIGH, prompt=400, slo=0.5)])
    plan = next(p for p in SlicePolicy().schedule(view).plans if "hp" in p.rids)
    assert len(set(plan.placement)) == 2 and len(plan.chunks) == 4


def test_a_placement_is_logged_at_debug_with_its_expected_first_token_and_deadline(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="scheduler.policies.scoring")
    view = make_view(waiting=[req("hp", Priority.HIGH, prompt=480, slo=0.5)])
    plan = next(p for p in SlicePolicy().schedule(view).plans if "hp" in p.rids)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("hp ")]
    assert line.startswith("hp (480 prompt tokens, waited 0 ms): cpu:")
    assert f"in {len(plan.chunks)} chunk(s), first token expected in " in line
    assert "deadline in 500 ms; deadlines missed 0" in line


def test_a_prefill_waits_for_a_decode_step_of_its_class_on_its_device_to_carry_it() -> None:
    hp = req("hp", Priority.HIGH, prompt=40, slo=1.0)
    on0 = single("cpu:0")
    dec = req("dec", Priority.HIGH, prompt=20, computed=20, output=1, placement=on0, blocks=2)
    long1 = (_busy("cpu:1", 0.5, Priority.HIGH),)  # cpu:1 runs a long prefill of the class
    step0 = (_busy("cpu:0", 0.005, Priority.HIGH),)  # dec's decode step, in flight on cpu:0
    view = make_view(waiting=[hp], running=[dec], ops=long1 + step0,
                     prefills=_prefilling("cpu:1"))
    d = make_policy("slice").schedule(view)
    assert not d.plans and not d.admissions and d.retry_on_progress
    # the step ended (a round follows): its request rides along in the prompt's batch
    d = make_policy("slice").schedule(make_view(waiting=[hp], runnable=[dec], ops=long1,
                                                prefills=_prefilling("cpu:1")))
    (prefill,) = d.plans
    assert prefill.placement == on0
    assert [(f.rid, f.num_tokens) for f in prefill.chunks[0]] == [("hp", 40), ("dec", 1)]
    # a step of a lower class holds nothing back (a high op waits for one of its ops at most)
    low = dataclasses.replace(dec, priority=Priority.LOW)
    d = make_policy("slice").schedule(dataclasses.replace(
        view, running=(low,), decode_classes=frozenset({(on0, Priority.LOW)})))
    assert [p.placement for p in d.plans] == [on0] and [a.rid for a in d.admissions] == ["hp"]


def test_a_step_of_its_class_run_at_a_lower_class_holds_no_prefill_back() -> None:
    hp = req("hp", Priority.HIGH, prompt=40, slo=1.0)
    on0 = single("cpu:0")
    dec = req("dec", Priority.HIGH, prompt=20, computed=20, output=1, placement=on0, blocks=2)
    low = req("low", Priority.LOW, prompt=20, computed=20, output=1, placement=on0, blocks=2)
    # dec decodes in one step with a low request: the step runs at low class, and a high
    # prefill issued now runs ahead of its ops (and every other low op on cpu:0)
    ops = _LONG1 + (_busy("cpu:0", 0.005, Priority.LOW),)
    mixed = make_view(waiting=[hp], running=[dec, low], ops=ops,
                      prefills=_prefilling("cpu:1"), steps=[(on0, Priority.LOW)])
    d = make_policy("slice").schedule(mixed)
    assert [p.placement for p in d.plans] == [on0] and [a.rid for a in d.admissions] == ["hp"]
    # the same requests in a step at the high class: the prefill waits for it, to carry dec
    pure = dataclasses.replace(mixed, decode_classes=frozenset({(on0, Priority.HIGH)}))
    d = make_policy("slice").schedule(pure)
    assert not d.plans and not d.admissions and d.retry_on_progress


def test_a_held_request_is_not_simulated_again_until_a_plan_in_flight_ends() -> None:
    hp = req("hp", Priority.HIGH, prompt=40, slo=1.0)
    on0 = single("cpu:0")
    dec = req("dec", Priority.HIGH, prompt=20, computed=20, output=1, placement=on0, blocks=2)
    long1 = (_busy("cpu:1", 0.5, Priority.HIGH),)
    sims = Simulations()
    policy = SlicePolicy(sims)
    per_round = []
    for step_left in (0.005, 0.003, 0.001):  # ops of dec's step end: a round each
        view = make_view(waiting=[hp], running=[dec], prefills=_prefilling("cpu:1"),
                         ops=long1 + (_busy("cpu:0", step_left, Priority.HIGH),))
        before = len(sims)
        d = policy.schedule(view)
        per_round.append(len(sims) - before)
        assert not d.plans and d.retry_on_progress
    assert per_round[0] > 0 and per_round[1:] == [0, 0]  # simulated in the first round only
    # the step ended (dec is runnable again): simulated afresh, and dec rides along
    before = len(sims)
    d = policy.schedule(make_view(waiting=[hp], runnable=[dec], ops=long1,
                                  prefills=_prefilling("cpu:1")))
    assert [f.rid for f in d.plans[0].chunks[0]] == ["hp", "dec"]
    assert len(sims) > before


def test_while_one_request_waits_for_a_decode_step_the_next_may_take_another_device() -> None:
    on0 = single("cpu:0")
    dec = req("dec", Priority.HIGH, prompt=20, computed=20, output=1, placement=on0, blocks=2)
    step0 = (_busy("cpu:0", 0.005, Priority.HIGH),)
    low1 = (_busy("cpu:1", 0.05, Priority.LOW),)  # one low op ahead of anything on cpu:1
    short = req("short", Priority.HIGH, prompt=40, slo=1.0)  # best on cpu:0, after the step
    long = req("long", Priority.HIGH, prompt=400, arrival=0.001, slo=1.0)  # best on cpu:1
    d = make_policy("slice").schedule(make_view(waiting=[short, long], running=[dec],
                                                ops=step0 + low1))
    assert [a.rid for a in d.admissions] == ["long"] and d.retry_on_progress
    assert [p.placement for p in d.plans] == [single("cpu:1")]
    # a later request whose best plan is on the device waited for waits too
    short2 = dataclasses.replace(short, rid="short2", arrival_s=0.001)
    d = make_policy("slice").schedule(make_view(waiting=[short, short2], running=[dec],
                                                ops=step0 + low1))
    assert not d.plans and not d.admissions and d.retry_on_progress


def test_no_request_rides_along_where_it_would_break_the_deadline() -> None:
    on0 = single("cpu:0")
    hp = req("hp", Priority.HIGH, prompt=40, slo=0.0305)  # alone: 30 ms; with riders: later
    long1 = (_busy("cpu:1", 0.5, Priority.HIGH),)  # cpu:1 runs a long prefill of the class
    decs = [req(f"d{i}", Priority.HIGH, prompt=20, computed=20, output=1, placement=on0,
                blocks=2) for i in range(8)]
    d = make_policy("slice").schedule(make_view(waiting=[hp], runnable=decs, ops=long1,
                                                prefills=_prefilling("cpu:1")))
    prefill = next(p for p in d.plans if p.is_prefill)
    assert prefill.placement == on0 and [f.rid for f in prefill.chunks[0]] == ["hp"]
    relaxed = dataclasses.replace(hp, ttft_slo_s=1.0)
    d = make_policy("slice").schedule(make_view(waiting=[relaxed], runnable=decs, ops=long1,
                                                prefills=_prefilling("cpu:1")))
    prefill = next(p for p in d.plans if p.is_prefill)
    assert len(prefill.chunks[0]) == 9  # the same riders, where the deadline allows them


def test_a_one_token_prompt_is_fed_once() -> None:
    # found by the KV property test: a one-token prompt is not "prefilling" once admitted
    hp = req("hp", Priority.HIGH, prompt=1, slo=1.0)
    d = make_policy("slice").schedule(make_view(waiting=[hp], prefills=_prefilling("cpu:1")))
    assert [[f.rid for f in c] for p in d.plans for c in p.chunks] == [["hp"]]


def test_the_baseline_is_simulated_only_when_a_deadline_is_missed() -> None:
    hp = req("hp", Priority.HIGH, prompt=40, slo=1.0)
    busy = (_busy("cpu:0", 0.5),)
    kept = Simulations()
    d = SlicePolicy(kept).schedule(make_view(waiting=[hp], ops=busy, deadlines=(("x", 9.0),)))
    assert d.plans and kept and None not in kept  # no baseline
    missed = Simulations()  # "x" is past its deadline in every prediction: the baseline decides
    d2 = SlicePolicy(missed).schedule(make_view(waiting=[hp], ops=busy + (
        SimOp(7, "head", "cpu:0", Priority.HIGH, (), 0.01, 0.0, None, 0, ("x",), 0.0),),
        deadlines=(("x", 0.0),)))
    assert missed.count(None) == 1
    assert [p.placement for p in d2.plans] == [p.placement for p in d.plans]
