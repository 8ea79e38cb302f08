"""loadgen replay end to end: the real gateway (over a FakeScheduler) on a loopback port."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gateway.config import GatewayConfig, SchedulerSettings, ServerSettings
from gateway.engine import Engine, eos_ids, load_tokenizer
from gateway.server import GatewayServer, make_server
from gateway.tenants import parse_tenants as parse_tenants_yaml
from loadgen.__main__ import main
from loadgen.client import CANCELLED
from loadgen.progress import Progress
from loadgen.prompts import PromptBuilder
from loadgen.replay import ReplayConfig, replay
from loadgen.report import build_report
from loadgen.workload import parse_tenants
from scheduler.testing.fake import FakeConfig, FakeScheduler

TENANTS_YAML = """\
admin_keys: [sk-admin]
tenants:
  - name: ide
    api_keys: [sk-ide]
    priority: high
    ttft_slo_ms: 500
  - name: batch
    api_keys: [sk-batch]
    priority: low
"""
MAX_MODEL_LEN = 1024


class LiveGateway:
    """The gateway over a FakeScheduler, served by uvicorn on 127.0.0.1 in a thread."""

    def __init__(self, engine: Engine, server: GatewayServer) -> None:
        self.engine, self.server = engine, server

    @property
    def fake(self) -> FakeScheduler:
        assert isinstance(self.engine.scheduler, FakeScheduler)
        return self.engine.scheduler

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"


@contextmanager
def live_gateway(tiny_model_dir: Path, token_delay_s: float) -> Iterator[LiveGateway]:
    tokenizer = load_tokenizer(tiny_model_dir)
    fake = FakeScheduler(FakeConfig(vocab_size=len(tokenizer), token_delay_s=token_delay_s,
                                    max_model_len=MAX_MODEL_LEN))
    engine = Engine(tokenizer, fake, "tiny", MAX_MODEL_LEN, len(tokenizer), eos_ids(tokenizer))
    config = GatewayConfig(scheduler=SchedulerSettings(devices=("cpu:0",)),
                           server=ServerSettings(port=0, log_level="warning"),
                           tenants=parse_tenants_yaml(TENANTS_YAML))
    server = make_server(config, engine)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "gateway did not start"
        time.sleep(0.01)
    try:
        yield LiveGateway(engine, server)
    finally:
        server.should_exit = True
        thread.join(timeout=20)


@pytest.fixture(scope="module")
def prompts(tiny_model_dir: Path) -> PromptBuilder:
    return PromptBuilder.from_folder(tiny_model_dir)


def test_cli_replay_of_two_tenants_writes_a_complete_report(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with live_gateway(tiny_model_dir, token_delay_s=0.004) as gw:
        code = main([
            "replay", "--url", gw.url, "--out", str(out), "--tokenizer", str(tiny_model_dir),
            "--tenant", "ide:sk-ide:rate=20,prompt=32,gen=4,requests=15:priority=0",
            "--tenant", "batch:sk-batch:concurrency=3,prompt=64,gen=16:priority=2",
            "--duration", "1.5", "--admin-key", "sk-admin", "--warmup", "1", "--no-progress"])
    assert code == 0
    for name in ("report.json", "report.md", "requests.jsonl", "ttft_cdf.png", "over_time.png",
                 "idle_slices_cdf.png"):
        assert (out / name).stat().st_size > 0, name
    report = json.loads((out / "report.json").read_text())
    assert report["model"] == "tiny" and report["stopped_early"]
    ide, batch = report["tenants"]["ide"], report["tenants"]["batch"]
    for tenant in (ide, batch):
        for key in ("num_requests", "num_errors", "errors_by_status", "ttft_s", "tpot_s",
                    "slo_s", "slo_attainment", "output_tok_s", "req_s", "prompt_tokens_mean"):
            assert key in tenant, key
        assert tenant["num_errors"] == 0 and tenant["output_tok_s"] > 0
    assert ide["num_requests"] == 15 and ide["num_ok"] == 15
    assert (ide["slo_s"], ide["slo_source"]) == (0.5, "server")  # from /metrics
    assert ide["slo_attainment"] is not None and ide["ttft_s"]["p50"] is not None
    assert ide["prompt_tokens_mean"] == 32  # calibrated prompts, as the server counted them
    assert batch["prompt_tokens_mean"] == 64 and batch["slo_source"] == "none"
    devices = report["devices"]
    assert devices["available"], devices
    assert 0 < devices["per_device"]["cpu:0"]["busy_fraction"] <= 1
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert all(r["output_tokens"] == 4 for r in rows if r["tenant"] == "ide")
    assert "| ide | 15 | 0 |" in (out / "report.md").read_text()


async def test_a_bounded_run_cancels_what_outlasts_the_drain(
        tiny_model_dir: Path, prompts: PromptBuilder) -> None:
    with live_gateway(tiny_model_dir, token_delay_s=0.05) as gw:
        tenants = parse_tenants(["batch:sk-batch:concurrency=4,prompt=16,gen=500"])
        config = ReplayConfig(gw.url, tuple(tenants), duration_s=0.3, drain_timeout_s=0.3)
        started = time.monotonic()
        result = await replay(config, prompts.text)
        assert time.monotonic() - started < 10
        assert len(result.records) == 4 and result.stopped_early and not result.interrupted
        assert all(r.error == CANCELLED and r.output_tokens > 0 for r in result.records)
        assert result.window_s == pytest.approx(0.3, abs=0.1)
        report = build_report(result)
        assert report["tenants"]["batch"]["errors_by_status"] == {"cancelled": 4}
        assert report["devices"] == {"available": False, "reason": "no admin key given"}
        deadline = time.monotonic() + 5
        while gw.fake.num_requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert gw.fake.num_requests == 0 and gw.fake.kv_blocks_in_use == 0


async def test_ctrl_c_stops_sending_then_cancels(tiny_model_dir: Path,
                                                 prompts: PromptBuilder) -> None:
    with live_gateway(tiny_model_dir, token_delay_s=0.05) as gw:
        tenants = parse_tenants(["ide:sk-ide:rate=50,prompt=8,gen=400,requests=1000"])
        config = ReplayConfig(gw.url, tuple(tenants), drain_timeout_s=60, handle_signals=True)

        async def interrupt() -> None:
            # NOTE: by what the server holds, not by a timer: a slow start sends nothing
            # for a while, and a timer would then interrupt before anything was in flight
            deadline = time.monotonic() + 10
            while gw.fake.num_requests < 5 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)  # stop sending
            await asyncio.sleep(0.4)
            os.kill(os.getpid(), signal.SIGINT)  # cancel what is in flight

        started = time.monotonic()
        ctrl_c = asyncio.create_task(interrupt())
        result = await replay(config, prompts.text)
        await ctrl_c
        assert time.monotonic() - started < 15
    assert result.interrupted and result.stopped_early
    assert 5 <= len(result.records) < 1000
    assert all(r.error == CANCELLED for r in result.records)


async def test_a_failing_warm_up_stops_the_replay_early(tiny_model_dir: Path,
                                                        prompts: PromptBuilder) -> None:
    with live_gateway(tiny_model_dir, token_delay_s=0.0) as gw:
        tenants = tuple(parse_tenants(["ide:sk-wrong:rate=1,prompt=8,gen=2,requests=2"]))
        with pytest.raises(RuntimeError, match=r"/v1/models: HTTP 401; pass --model"):
            await replay(ReplayConfig(gw.url, tenants), prompts.text)
        config = ReplayConfig(gw.url, tenants, model="tiny", warmup_requests=1)
        with pytest.raises(RuntimeError, match="warm-up request of tenant 'ide' failed: HTTP 401"):
            await replay(config, prompts.text)


async def test_a_failing_tenant_driver_stops_the_replay(tiny_model_dir: Path,
                                                        prompts: PromptBuilder) -> None:
    calls = 0

    def prompt(num_tokens: int, salt: str) -> str:
        nonlocal calls
        calls += 1
        if calls > 3:
            raise ValueError("no more prompts")
        return prompts.text(num_tokens, salt)

    with live_gateway(tiny_model_dir, token_delay_s=0.01) as gw:
        tenants = tuple(parse_tenants(["b:sk-batch:concurrency=2,prompt=8,gen=5"]))
        with pytest.raises(ValueError, match="no more prompts"):
            await replay(ReplayConfig(gw.url, tenants, duration_s=30), prompt)
        deadline = time.monotonic() + 5
        while gw.fake.num_requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert gw.fake.num_requests == 0


def test_cli_errors_name_the_bad_trace_row(tiny_model_dir: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:17:03.9799600,10,2\n2023-11-16 18:17:04.0,ten,2\n")
    code = main(["replay", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "out"),
                 "--tokenizer", str(tiny_model_dir), "--tenant", f"a::{bad}"])
    assert code == 2
    assert "line 3: ContextTokens is not an integer: 'ten'" in capsys.readouterr().err
    code = main(["replay", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "out"),
                 "--tenant", "a::rate=1,prompt=1"])
    assert code == 2 and "missing gen=N" in capsys.readouterr().err


def test_replay_config_needs_a_bound() -> None:
    tenants = tuple(parse_tenants(["b::concurrency=2,prompt=8,gen=2"]))
    with pytest.raises(ValueError, match="give a duration"):
        ReplayConfig("http://127.0.0.1:1", tenants)
    with pytest.raises(ValueError, match="at least one tenant"):
        ReplayConfig("http://127.0.0.1:1", ())


def test_progress_line() -> None:
    from loadgen.client import RequestRecord

    records = [RequestRecord("a", i, 0.0, 1, 1, end_s=1.0, status=200) for i in range(3)]
    records[0].error = "boom"
    records.append(RequestRecord("a", 3, 0.0, 1, 1))
    line = Progress(records, 10, lambda: 2.0, width=10).line()
    assert line == "[###.......] 3/10  1 in flight  1 errors  2.0 s"
    assert Progress(records, None, lambda: 2.0).line().startswith("3 done  1 in flight")
