import pytest

from scheduler.policies.burst import BurstJob, Spread, burst_schedule, in_burst_order

# a 465-token prompt as the fakes run it: ~285 ms on one device, ~190 ms as a pipeline over two
LONG = (0.285, 0.19)


def _job(rid: str, slack_s: float, one_s: float, split_s: float | None) -> BurstJob:
    return BurstJob(rid, slack_s, one_s, split_s)


def test_three_long_prompts_go_one_per_device_when_pipelines_one_after_another_miss() -> None:
    jobs = [_job(f"r{i}", 0.3, *LONG) for i in range(3)]
    got = burst_schedule(jobs, num_devices=2)
    # NOTE: the deadline order with each at its earliest first token pipelines them one
    # after another: 0.19, 0.38, 0.57 s, one within 0.3 s
    assert got.num_on_time == 2
    assert [s for _, s in got.order[:2]] == [Spread.ONE, Spread.ONE]


def test_a_lone_long_prompt_still_takes_the_pipeline() -> None:
    got = burst_schedule([_job("a", 0.3, *LONG), _job("b", 5.0, 0.01, None)], num_devices=2)
    assert dict(got.order)["a"] is Spread.SPLIT  # after the short one, on one device
    assert got.num_on_time == 2


def test_the_shortest_goes_first_and_one_that_cannot_make_it_goes_last() -> None:
    jobs = [_job("hopeless", 0.1, 0.4, 0.25), _job("long", 0.5, 0.3, 0.2),
            _job("short", 0.5, 0.1, None)]
    got = burst_schedule(jobs, num_devices=1)
    assert [rid for rid, _ in got.order] == ["short", "long", "hopeless"]
    assert got.num_on_time == 2


def test_requests_past_the_enumerated_few_follow_in_their_order() -> None:
    jobs = [_job(f"r{i}", 10.0, 0.01, None) for i in range(6)]
    got = burst_schedule(jobs, num_devices=2)
    assert [rid for rid, _ in got.order][4:] == ["r4", "r5"]
    assert got.num_on_time == 6


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="prefill seconds"):
        _job("x", 1.0, -0.1, None)
    with pytest.raises(ValueError, match="num_devices"):
        burst_schedule([], num_devices=0)


def test_the_burst_is_reordered_in_its_own_places_and_the_rest_keep_theirs() -> None:
    items = ["held", "b1", "other", "b2", "b3"]
    got = in_burst_order(items, ["b3", "b1", "b2"], lambda x: x)
    assert got == ["held", "b3", "other", "b1", "b2"]
