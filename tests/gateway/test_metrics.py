"""GET /metrics: vLLM's names and slicegate's own, labelled by tenant and priority class."""

from __future__ import annotations

import re
import time

import pytest

from gateway.metrics import GatewayMetrics
from gateway.tenants import parse_tenants
from scheduler.api import SchedulerStats, SpecDecodeCounts
from tests.gateway.harness import (
    TENANTS_YAML,
    EngineFactory,
    auth_config,
    make_config,
    record_requests,
    running,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

NAMES = (
    "vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "slicegate_slo_attainment", "slicegate_device_busy_ratio", "slicegate_scheduler_round_seconds",
    "slicegate_scheduler_errors_total",
    "slicegate_estimator_mape", "slicegate_estimator_sample_cov", "slicegate_estimator_level",
    "slicegate_estimator_reprofiles_total", "slicegate_estimator_reprofiling",
    "slicegate_colocation_slowdown",
    "slicegate_first_token_factor",
    "slicegate_tenant_ttft_slo_seconds",
)


async def test_names_and_labels(make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine()) as h:
        waits = []
        for key, tier in (("sk-ide-1", None), ("sk-ide-1", "flex"), ("sk-nightly-1", None)):
            sent = time.perf_counter()
            response = await h.client.post(
                "/v1/completions", json={"prompt": "hello", "max_tokens": 3, "service_tier": tier},
                headers={"authorization": f"Bearer {key}"})
            waits.append(time.perf_counter() - sent)
            assert response.status_code == 200
        response = await h.client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        text = response.text
        for name in NAMES:
            assert f"# TYPE {name} " in text, name
        labels = 'model_name="tiny",priority="{}",tenant="{}"'
        assert f"vllm:generation_tokens_total{{{labels.format('high', 'ide')}}} 3.0" in text
        assert f"vllm:generation_tokens_total{{{labels.format('low', 'ide')}}} 3.0" in text
        assert f"vllm:generation_tokens_total{{{labels.format('low', 'nightly')}}} 3.0" in text
        assert 'slicegate_tenant_ttft_slo_seconds{priority="high",tenant="ide"} 0.5' in text
        assert 'slicegate_device_busy_ratio{device="cpu:0"}' in text
        assert 'vllm:request_success_total{finished_reason="length"' in text
        # the one high-priority request (the first) met its 0.5 s TTFT SLO if its whole reply
        # came within it; a busy machine may take longer (in CI: the fresh app's first request)
        attained = re.search(r'slicegate_slo_attainment\{model_name="tiny",priority="high"\} (\S+)',
                             text)
        assert attained is not None
        assert float(attained[1]) == 1.0 if waits[0] <= 0.5 else float(attained[1]) in (0.0, 1.0)


async def test_request_gauges_carry_each_models_name_with_several_models() -> None:
    stats = SchedulerStats(num_running={("ide", "high"): 2}, num_waiting={("ide", "high"): 1},
                           num_running_by_model={("chat", "ide", "high"): 1,
                                                 ("batch", "ide", "high"): 1},
                           num_waiting_by_model={("batch", "ide", "high"): 1})
    text = GatewayMetrics("chat").render(stats).decode()
    assert 'vllm:num_requests_running{model_name="chat",priority="high",tenant="ide"} 1.0' \
        in text
    assert 'vllm:num_requests_running{model_name="batch",priority="high",tenant="ide"} 1.0' \
        in text
    assert 'vllm:num_requests_waiting{model_name="batch",priority="high",tenant="ide"} 1.0' \
        in text
    one = GatewayMetrics("chat").render(SchedulerStats(num_running={("ide", "high"): 2}))
    assert 'vllm:num_requests_running{model_name="chat",priority="high",tenant="ide"} 2.0' \
        in one.decode()


async def test_request_gauges_show_every_served_model_from_start_up() -> None:
    metrics = GatewayMetrics("chat")
    metrics.set_tenants(parse_tenants("""\
tenants:
  - {name: ide, api_keys: [k1], priority: high}
  - {name: bulk, api_keys: [k2], priority: low, models: [batch]}
""").tenants)
    served = ("chat", "batch", "q")  # two models and an adapter

    def running(stats: SchedulerStats, models: tuple[str, ...] = served) -> dict[str, float]:
        return _samples(metrics.render(stats, models).decode(), "vllm:num_requests_running")

    idle = {'model_name="batch",priority="high",tenant="ide"': 0.0,
            'model_name="batch",priority="low",tenant="bulk"': 0.0,
            'model_name="chat",priority="high",tenant="ide"': 0.0,
            'model_name="q",priority="high",tenant="ide"': 0.0}  # bulk may use batch only
    assert running(SchedulerStats()) == idle
    flex = 'model_name="q",priority="low",tenant="ide"'
    busy = SchedulerStats(num_running_by_model={("q", "ide", "low"): 2, ("", "ide", "high"): 1})
    assert running(busy) == {**idle, flex: 2.0,
                             'model_name="chat",priority="high",tenant="ide"': 1.0}
    assert running(SchedulerStats()) == {**idle, flex: 0.0}  # back to 0, not gone
    assert running(SchedulerStats(), ("chat", "batch")) == {  # q unloaded: its series go
        k: v for k, v in idle.items() if "q" not in k}
    text = metrics.render(SchedulerStats()).decode()  # the models as before
    assert 'vllm:num_requests_waiting{model_name="batch",priority="low",tenant="bulk"} 0.0' \
        in text


def _samples(text: str, name: str) -> dict[str, float]:
    """The samples of family `name`: their label text -> value."""
    return {m[1]: float(m[2]) for m in re.finditer(
        rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.M)}


async def test_scheduler_figures_are_per_model_with_several_models() -> None:
    stats = SchedulerStats(
        kv_cache_usage=0.3, kv_cache_usage_by_model={"chat": 0.5, "batch": 0.0},
        num_preemptions={("chat", "ide", "high"): 2, ("batch", "bulk", "low"): 1},
        slo_attainment={"high": 0.5},
        slo_attainment_by_model={("chat", "high"): 1.0, ("batch", "high"): 0.0},
        spec_decode={"chat": SpecDecodeCounts(4, 12, 7, (3, 2, 2)),
                     "batch": SpecDecodeCounts()})
    text = GatewayMetrics("chat").render(stats).decode()
    assert _samples(text, "vllm:kv_cache_usage_perc") == {
        'model_name="batch"': 0.0, 'model_name="chat"': 0.5}
    assert _samples(text, "vllm:num_preemptions_total") == {
        'model_name="batch",priority="low",tenant="bulk"': 1.0,
        'model_name="chat",priority="high",tenant="ide"': 2.0}
    assert _samples(text, "slicegate_slo_attainment") == {
        'model_name="batch",priority="high"': 0.0, 'model_name="chat",priority="high"': 1.0}
    assert _samples(text, "vllm:spec_decode_num_drafts_total") == {
        'model_name="batch"': 0.0, 'model_name="chat"': 4.0}
    assert _samples(text, "vllm:spec_decode_num_accepted_tokens_total") == {
        'model_name="batch"': 0.0, 'model_name="chat"': 7.0}
    assert _samples(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total") == {
        f'model_name="chat",position="{i}"': n for i, n in enumerate((3.0, 2.0, 2.0))}


async def test_one_models_figures_carry_its_served_name() -> None:
    """The scheduler keys its only model "" (and a fake gives no per-model figures): both
    come out under the served name, one series as with several models."""
    real = SchedulerStats(kv_cache_usage_by_model={"": 0.25},
                          num_preemptions={("", "ide", "high"): 1},
                          slo_attainment_by_model={("", "high"): 0.75},
                          spec_decode={"": SpecDecodeCounts(1, 3, 2, (1, 1, 0))})
    fake = SchedulerStats(kv_cache_usage=0.25, slo_attainment={"high": 0.75})
    for stats in (real, fake):
        text = GatewayMetrics("tiny").render(stats).decode()
        assert _samples(text, "vllm:kv_cache_usage_perc") == {'model_name="tiny"': 0.25}
        assert _samples(text, "slicegate_slo_attainment") == {
            'model_name="tiny",priority="high"': 0.75}
        assert set(_samples(text, "vllm:spec_decode_num_drafts_total")) == {
            'model_name="tiny"'}
    text = GatewayMetrics("tiny").render(real).decode()
    assert _samples(text, "vllm:num_preemptions_total") == {
        'model_name="tiny",priority="high",tenant="ide"': 1.0}
    assert _samples(text, "vllm:spec_decode_num_draft_tokens_total") == {
        'model_name="tiny"': 3.0}


async def test_tpot_slo_attainment_per_tenant(make_engine: EngineFactory) -> None:
    # 20 ms per decode step: ide's 1 s pace is kept, chat's 5 ms one is not
    yaml = TENANTS_YAML.replace("ttft_slo_ms: 500", "ttft_slo_ms: 500\n    tpot_slo_ms: 1000")
    yaml = yaml.replace("priority: normal", "priority: normal\n    tpot_slo_ms: 5")
    engine = make_engine(token_delay_s=0.02)
    seen = record_requests(engine)
    async with running(make_config(parse_tenants(yaml)), engine) as h:
        for key in ("sk-ide-1", "sk-chat-1", "sk-nightly-1"):
            response = await h.client.post(
                "/v1/completions", json={"prompt": "hello", "max_tokens": 4},
                headers={"authorization": f"Bearer {key}"})
            assert response.status_code == 200
        text = (await h.client.get("/metrics")).text
    assert [r.tpot_slo_s for r in seen] == [1.0, 0.005, None]
    assert 'slicegate_tenant_tpot_slo_seconds{priority="high",tenant="ide"} 1.0' in text
    assert 'slicegate_tpot_slo_requests_total{tenant="ide"} 1.0' in text
    assert 'slicegate_tpot_slo_attained_total{tenant="ide"} 1.0' in text
    assert 'slicegate_tpot_slo_requests_total{tenant="chat"} 1.0' in text
    assert 'slicegate_tpot_slo_attained_total{tenant="chat"}' not in text
    assert 'tenant="nightly"' not in "\n".join(
        line for line in text.splitlines() if line.startswith("slicegate_tpot_slo"))
