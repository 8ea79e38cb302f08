"""The feeder through the app: short queues, supervision and /health, resume, expiry, lock."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gateway.app import batch_context
from gateway.batches.feeder import MAX_STEP_FAILURES
from gateway.batches.service import BatchService, DataDirBusy
from gateway.batches.types import BatchStatus
from gateway.config import BatchSettings
from tests.gateway.batches.helpers import line, results, submit, wait_for
from tests.gateway.harness import EngineFactory, auth_config, running

pytestmark = pytest.mark.asyncio(loop_scope="session")

NIGHTLY = "sk-nightly-1"


async def test_lines_are_fed_a_few_at_a_time(make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine(token_delay_s=0.002, max_running=4)) as h:
        batch = await submit(h.client, NIGHTLY, [line(i, max_tokens=8) for i in range(60)])
        feeder = h.app.state.gateway.batches._feeder
        waiting, in_flight = [], []
        while (await wait_for(h.client, NIGHTLY, batch["id"], ("in_progress", "completed"))
               )["status"] != "completed":
            waiting.append(sum(h.fake.stats().num_waiting.values()))
            in_flight.append(feeder.num_in_flight)
            await asyncio.sleep(0.005)
        assert max(waiting) <= BatchSettings().max_waiting, waiting
        assert 1 < max(in_flight) <= BatchSettings().max_in_flight
        done = await wait_for(h.client, NIGHTLY, batch["id"])
        assert done["request_counts"]["completed"] == 60


async def test_a_failing_feeder_turns_health_503_then_recovers(
        make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    async with running(auth_config(), make_engine()) as h:
        store = h.app.state.gateway.batches.store
        real = store.batches_in
        broken = {"on": True}

        def flaky(statuses: object) -> object:
            if broken["on"]:
                raise OSError("disk on fire")
            return real(statuses)  # type: ignore[arg-type]

        monkeypatch.setattr(store, "batches_in", flaky)
        h.app.state.gateway.batches.wake()
        deadline = time.monotonic() + 5
        while (r := await h.client.get("/health")).status_code == 200:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert r.status_code == 503 and "disk on fire" in r.json()["detail"]
        broken["on"] = False
        deadline = time.monotonic() + 5
        while (await h.client.get("/health")).status_code != 200:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)


async def test_a_feeder_that_keeps_failing_stops_and_health_stays_503(
        make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.batches.feeder.MAX_STEP_FAILURES", 2)
    async with running(auth_config(), make_engine()) as h:
        store = h.app.state.gateway.batches.store

        def broken(statuses: object) -> object:
            raise OSError("gone")

        monkeypatch.setattr(store, "batches_in", broken)
        h.app.state.gateway.batches.wake()
        deadline = time.monotonic() + 5
        while not h.app.state.gateway.batches._feeder.dead:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        r = await h.client.get("/health")
        assert r.status_code == 503 and "stopped" in r.json()["detail"]
    assert MAX_STEP_FAILURES == 5  # the module default, untouched by the patch


async def test_a_stopped_server_resumes_its_batches(make_engine: EngineFactory,
                                                    tmp_path: Path) -> None:
    lines = [line(i, max_tokens=20) for i in range(40)]
    async with running(auth_config(), make_engine(token_delay_s=0.01)) as h:
        batch = await submit(h.client, NIGHTLY, lines)
        while (await wait_for(h.client, NIGHTLY, batch["id"], ("in_progress",)))[
                "request_counts"]["completed"] < 3:
            await asyncio.sleep(0.01)
    async with running(auth_config(), make_engine()) as h:
        done = await wait_for(h.client, NIGHTLY, batch["id"])
        assert done["status"] == "completed" and done["request_counts"]["completed"] == 40
        out = await results(h.client, NIGHTLY, done["output_file_id"])
        assert [x["custom_id"] for x in out] == [f"req-{i}" for i in range(40)]


async def test_a_batch_past_its_window_expires(make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine(token_delay_s=0.02)) as h:
        batch = await submit(h.client, NIGHTLY, [line(i, max_tokens=30) for i in range(20)])
        await wait_for(h.client, NIGHTLY, batch["id"], ("in_progress",))
        service = h.app.state.gateway.batches
        service.store.update_batch(batch["id"], expires_at=int(time.time()) - 1)
        service.wake()
        done = await wait_for(h.client, NIGHTLY, batch["id"])
        assert done["status"] == "expired" and done["expired_at"] is not None
        errors = await results(h.client, NIGHTLY, done["error_file_id"])
        assert errors and {e["error"]["code"] for e in errors} == {"batch_expired"}
        out = await results(h.client, NIGHTLY, done["output_file_id"])
        assert len(out) + len(errors) == 20
        assert service.store.get_batch(batch["id"]).status is BatchStatus.EXPIRED


async def test_a_second_server_on_the_same_data_dir_refuses(tmp_path: Path,
                                                            make_engine: EngineFactory) -> None:
    settings = BatchSettings(data_dir=str(tmp_path / "data"))
    first = BatchService(settings)
    async with running(auth_config(), make_engine()) as h:
        await first.start(batch_context(h.app.state.gateway))
        with pytest.raises(DataDirBusy, match="another slicegate server"):
            await BatchService(settings).start(batch_context(h.app.state.gateway))
        await first.stop()
        second = BatchService(settings)
        await second.start(batch_context(h.app.state.gateway))  # free again once the first stopped
        await second.stop()
