"""A two-device server on a one-device fit: requests complete, the missing pair is profiled."""

from __future__ import annotations

from pathlib import Path

from executors.types import Priority
from models.loader import load
from models.sampling_params import SamplingParams
from scheduler.config import SchedulerConfig
from scheduler.factory import build_scheduler, parse_devices
from scheduler.ieg import FinishReason, Request
from scheduler.profiling import Sweep, load_or_profile

SMALL = Sweep(prefill_tokens=(4, 64, 256), chunks=((32, 64),), decode_batches=(1, 3),
              decode_contexts=(8, 64), transfer_tokens=(1, 8, 32), repeats=1)


async def test_a_fit_without_the_pair_serves_and_profiles_it(tiny_model_dir: Path,
                                                             tmp_path: Path) -> None:
    model = load(tiny_model_dir, dtype="float32")
    est = load_or_profile(model, ["cpu:0"], tmp_path, SMALL)  # as a one-device bench leaves it
    assert not est.transfers
    cfg = SchedulerConfig(policy="slice", max_model_len=1024, max_batch_tokens=512)
    sched = build_scheduler(model, parse_devices("cpu:0,cpu:1", 0.25), cfg, est)
    await sched.start()
    try:
        prompt = [(7 * j) % 500 + 3 for j in range(400)]  # long enough for split candidates
        req = Request("p", "t", Priority.HIGH, prompt, SamplingParams(temperature=0,
                                                                       max_tokens=3))
        events = [ev async for ev in sched.submit(req)]
        assert sched.profiler is not None
        await sched.profiler.idle()
    finally:
        await sched.stop()
    assert events[-1].finish_reason is FinishReason.LENGTH and len(events) == 3
    assert ("cpu:0", "cpu:1") in sched.profiler.done
    assert ("cpu:0", "cpu:1") in est.transfers and sched.stats().errors_total == 0
