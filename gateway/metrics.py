"""Prometheus metrics: vLLM's names where the meaning is the same, plus slicegate's own.

Request metrics are labelled by model_name (a LoRA adapter's name for its requests, as
vLLM's), tenant and priority class. The
scheduler's state is read once per scrape from `SchedulerAPI.stats()`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from typing import Any, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    ProcessCollector,
    generate_latest,
)
from prometheus_client import Histogram as PromHistogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from gateway.recent import RecentRequests
from gateway.tenants import Tenant
from scheduler.api import Histogram, SchedulerStats, SpecDecodeCounts

_LABELS = ["model_name", "tenant", "priority"]
Key = tuple[str, str, str]  # (model_name, tenant, priority) of a request gauge's series
K = TypeVar("K")
V = TypeVar("V")
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0, 160.0, 640.0)
_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                  2.5, 5.0, 10.0)


class _StatsCollector:
    """Emits the scheduler-side metric families from the latest `SchedulerStats`."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.stats = SchedulerStats()
        self.idle: frozenset[Key] = frozenset()  # series shown at 0 before any request
        self.served: frozenset[str] = frozenset((model_name,))  # models and adapters now
        self.running, self.waiting = _RequestGauge(), _RequestGauge()

    def collect(self) -> Iterator[Metric]:
        s, m = self.stats, self.model_name
        for gauge, name, help_, values, per_model in (
                (self.running, "vllm:num_requests_running",
                 "Requests decoding or prefilling, per model, tenant and class.",
                 s.num_running, s.num_running_by_model),
                (self.waiting, "vllm:num_requests_waiting",
                 "Requests waiting to be scheduled, per model, tenant and class.",
                 s.num_waiting, s.num_waiting_by_model)):
            family = GaugeMetricFamily(name, help_, labels=_LABELS)
            now = _named(m, per_model) or {(m, *k): v for k, v in values.items()}
            for labels, count in gauge.series(now, self.idle, self.served).items():
                family.add_metric(list(labels), count)
            yield family
        yield _per_class(CounterMetricFamily("vllm:num_preemptions",
                                             "Cumulative preemptions.", labels=_LABELS),
                         m, {}, _named(m, s.num_preemptions))
        yield _by_key(GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage of a model's pools on its devices; "
            "1 means 100 percent (models of one KV layout share a pool and report its usage).",
            labels=["model_name"]), _named(m, s.kv_cache_usage_by_model).items()
            if s.kv_cache_usage_by_model else [(m, s.kv_cache_usage)])
        slo = GaugeMetricFamily("slicegate_slo_attainment", "Fraction of requests meeting "
                                "their TTFT SLO, per model and class.",
                                labels=["model_name", "priority"])
        by_model = _named(m, s.slo_attainment_by_model) or \
            {(m, p): v for p, v in s.slo_attainment.items()}
        for key, value in sorted(by_model.items()):
            slo.add_metric(list(key), value)
        yield slo
        yield _by_key(GaugeMetricFamily("slicegate_device_busy_ratio",
                                        "Fraction of time a device runs an operator.",
                                        labels=["device"]), s.device_busy_ratio.items())
        yield _by_key(GaugeMetricFamily("slicegate_estimator_mape",
                                        "Mean absolute percentage error of an estimator.",
                                        labels=["estimator"]), s.estimator_mape.items())
        yield _by_key(GaugeMetricFamily("slicegate_estimator_sample_cov",
                                        "Run-to-run noise (coefficient of variation) of the "
                                        "profiling sweep an estimator was fitted on.",
                                        labels=["estimator"]), s.estimator_cov.items())
        yield _by_key(GaugeMetricFamily("slicegate_first_token_factor",
                                        "Measured over predicted wait for the first token of "
                                        "recent plans of a placement kind (scales the "
                                        "policy's predictions).",
                                        labels=["placement"]), s.first_token_factor.items())
        yield _by_key(GaugeMetricFamily("slicegate_estimator_level",
                                        "Measured over profiled time of an estimator's recent "
                                        "ops (median); 1 while the machine runs as profiled.",
                                        labels=["estimator"]), s.estimator_level.items())
        yield _by_key(CounterMetricFamily("slicegate_estimator_reprofiles",
                                          "Background profiles of a device kind (its ops "
                                          "drifted) or a transfer pair.", labels=["target"]),
                      s.reprofiles.items())
        yield GaugeMetricFamily("slicegate_estimator_reprofiling",
                                "1 while a background profile runs (its ops share the "
                                "devices), else 0.", value=float(s.reprofiling))
        slowdown = GaugeMetricFamily("slicegate_colocation_slowdown",
                                     "How much longer an op class takes while another device "
                                     "of its host runs an op of class `beside` (profiled).",
                                     labels=["op", "beside"])
        for (op, beside), factor in sorted(s.slowdown.items()):
            slowdown.add_metric([op, beside], factor)
        yield slowdown
        yield _by_key(GaugeMetricFamily("slicegate_fairness_jain",
                                        "Jain's fairness index of the tokens served to each "
                                        "tenant of a class (1: all the same).",
                                        labels=["priority"]), s.fairness_jain.items())
        yield _by_key(GaugeMetricFamily("slicegate_queued_prompt_tokens",
                                        "Prompt tokens of the requests waiting, per class.",
                                        labels=["priority"]), s.queued_tokens.items())
        yield _by_key(GaugeMetricFamily("slicegate_device_up",
                                        "1 while a device's executor is up; 0 while it is "
                                        "down (a lost Ray node, until its actor is back).",
                                        labels=["device"]),
                      ((d, 1.0 if up else 0.0) for d, up in s.device_up.items()))
        healthy = GaugeMetricFamily("slicegate_healthy",
                                    "1 while the scheduler runs, its rounds succeed and every "
                                    "executor is alive.")
        healthy.add_metric([], 1.0 if s.healthy else 0.0)
        yield healthy
        for name, help_, value in (
                ("slicegate_kv_swapped_bytes", "KV bytes preemptions moved to host memory.",
                 s.kv_swapped_bytes),
                ("slicegate_kv_recomputed_tokens",
                 "Tokens of KV preemptions dropped, to recompute.", s.kv_recomputed_tokens)):
            counter = CounterMetricFamily(name, help_)
            counter.add_metric([], value)
            yield counter
        errors = CounterMetricFamily("slicegate_scheduler_errors",
                                     "Exceptions caught in scheduling rounds and completion "
                                     "handlers (their requests ended with a server error).")
        errors.add_metric([], s.errors_total)
        yield errors
        yield from _spec_decode(s, m)
        yield _histogram(HistogramMetricFamily(
            "slicegate_scheduler_round_seconds",
            "Wall time of one scheduling round (view, policy decision, apply)."), s.round_seconds)


def _spec_decode(s: SchedulerStats, model_name: str) -> Iterator[Metric]:
    """vLLM's speculative-decoding counters, per model (docs/speculation.md)."""
    per_model = sorted(_named(model_name, s.spec_decode).items()) or \
        [(model_name, SpecDecodeCounts())]
    for name, help_, field in (
            ("vllm:spec_decode_num_drafts", "Verify steps of drafted tokens.", "num_drafts"),
            ("vllm:spec_decode_num_draft_tokens", "Tokens drafted (prompt lookup).",
             "num_draft_tokens"),
            ("vllm:spec_decode_num_accepted_tokens", "Drafted tokens accepted.",
             "num_accepted_tokens")):
        counter = CounterMetricFamily(name, help_, labels=["model_name"])
        for model, counts in per_model:
            counter.add_metric([model], getattr(counts, field))
        yield counter
    per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                  "Drafted tokens accepted, per draft position (0 first).",
                                  labels=["model_name", "position"])
    for model, counts in per_model:
        for pos, n in enumerate(counts.accepted_per_pos):
            per_pos.add_metric([model, str(pos)], n)
    yield per_pos


def _named(served: str, values: dict[K, V]) -> dict[K, V]:
    """`values` keyed by model (a key, or a tuple whose first item is one) with the
    scheduler's "" (its only model) renamed to the `served` name."""
    out: dict[Any, V] = {}
    for key, value in values.items():
        if isinstance(key, tuple):
            out[(key[0] or served, *key[1:])] = value
        else:
            out[key or served] = value
    return out


def _per_class(family: GaugeMetricFamily | CounterMetricFamily, model_name: str,
               values: dict[tuple[str, str], int],
               by_model: dict[tuple[str, str, str], int] | None = None) -> Metric:
    """One sample per (tenant, class) under `model_name`; with several models (`by_model`
    set), one per (model, tenant, class) instead."""
    if by_model:
        for (model, tenant, priority), value in sorted(_named(model_name, by_model).items()):
            family.add_metric([model, tenant, priority], value)
        return family
    for (tenant, priority), value in sorted(values.items()):
        family.add_metric([model_name, tenant, priority], value)
    return family


class _RequestGauge:
    """The series of one request gauge (running or waiting) across scrapes.

    NOTE: vLLM shows `vllm:num_requests_running{model_name=...}` for every served model from
    start-up, at 0, so a dashboard's `sum by (model_name)` never reads "no data". Ours carries
    tenant and class too (as every request metric here does), so an idle model shows one
    0-valued series per tenant that may use it, at the tenant's class (`idle`); a series
    once seen stays, at 0 when its requests end, while its model or adapter is served (an
    unloaded adapter's series go with it)."""

    def __init__(self) -> None:
        self.seen: set[Key] = set()

    def series(self, now: dict[Key, int], idle: Collection[Key],
               served: Collection[str]) -> dict[Key, int]:
        """Every series to emit: those with requests `now`, then the idle ones and those
        seen before (of models still `served`) at 0."""
        self.seen = {k for k in self.seen if k[0] in served} | set(now)
        keys = self.seen | {k for k in idle if k[0] in served}
        return {k: now.get(k, 0) for k in sorted(keys)}


def _histogram(family: HistogramMetricFamily, h: Histogram) -> Metric:
    cumulative, buckets = 0, []
    for bound, count in zip([*map(str, h.bounds_s), "+Inf"], h.counts, strict=True):
        cumulative += count
        buckets.append((bound, cumulative))
    family.add_metric([], buckets, h.sum_s)
    return family


def _by_key(family: GaugeMetricFamily | CounterMetricFamily,
            items: Iterable[tuple[str, float]]) -> Metric:
    for key, value in sorted(items):
        family.add_metric([key], value)
    return family


class GatewayMetrics:
    """All metrics of one app, in its own registry (so several apps can share a process)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = PromHistogram("vllm:time_to_first_token_seconds", "Time to first token.",
                              _LABELS, buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = PromHistogram("vllm:time_per_output_token_seconds",
                              "Mean time per output token after the first, per request.",
                              _LABELS, buckets=_TOKEN_BUCKETS, registry=r)
        self.e2e = PromHistogram("vllm:e2e_request_latency_seconds", "Arrival to last token.",
                             _LABELS, buckets=_LATENCY_BUCKETS, registry=r)
        self.queue = PromHistogram("vllm:request_queue_time_seconds",
                               "Arrival to hand-over to the scheduler.", _LABELS,
                               buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefilled prompt tokens.", _LABELS,
                                     registry=r)
        # NOTE: vLLM's names; per request (not per scheduling attempt), so hits / queries
        # is the share of prompt tokens served from the cache, per tenant and class
        self.prefix_queries = Counter("vllm:prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache.", _LABELS,
                                      registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits",
                                   "Prompt tokens found in the prefix cache.", _LABELS,
                                   registry=r)
        self._prefix_totals: dict[str, tuple[int, int]] = {}  # tenant -> (queries, hits)
        self.prefix_hit_rate = Gauge("slicegate_prefix_cache_hit_rate",
                                     "Prompt tokens found in the prefix cache over those looked "
                                     "up, per tenant, since start.", ["tenant"], registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", _LABELS,
                                         registry=r)
        self.success = Counter("vllm:request_success", "Finished requests by finish reason.",
                               [*_LABELS, "finished_reason"], registry=r)
        self.rejected = Counter("slicegate_requests_rejected",
                                "Requests refused before running (quota, overload, draining).",
                                ["tenant", "reason"], registry=r)
        self.shed = Counter("slicegate_shed", "Requests shed: rejected by a tenant quota "
                            "(429, reason quota_*) or by admission (503: class_full, "
                            "server_full), or evicted from a queue for a higher class.",
                            ["tenant", "class", "reason"], registry=r)
        self.ttft_slo = Gauge("slicegate_tenant_ttft_slo_seconds", "A tenant's TTFT SLO.",
                              ["tenant", "priority"], registry=r)
        self.tpot_slo = Gauge("slicegate_tenant_tpot_slo_seconds", "A tenant's TPOT SLO.",
                              ["tenant", "priority"], registry=r)
        # NOTE: per request, its mean time per output token after the first (the TPOT
        # histogram's value) against its tenant's TPOT SLO: attained / requests per tenant
        self.tpot_slo_requests = Counter("slicegate_tpot_slo_requests",
                                         "Requests of two tokens or more with a TPOT SLO.",
                                         ["tenant"], registry=r)
        self.tpot_slo_attained = Counter("slicegate_tpot_slo_attained",
                                         "Requests whose TPOT kept their TPOT SLO.",
                                         ["tenant"], registry=r)
        ProcessCollector(registry=r)  # process_resident_memory_bytes & co (chaos reads RSS)
        self._stats = _StatsCollector(model_name)
        self._tenants: tuple[Tenant, ...] = ()
        r.register(self._stats)
        self.recent = RecentRequests()  # per-request records for /admin/timeline

    def observe_prefix_cache(self, labels: tuple[str, str, str], num_prompt_tokens: int,
                             num_cached_tokens: int) -> None:
        """One request's prompt tokens and those its prefill found cached."""
        self.prefix_queries.labels(*labels).inc(num_prompt_tokens)
        self.prefix_hits.labels(*labels).inc(num_cached_tokens)
        tenant = labels[1]
        queries, hits = self._prefix_totals.get(tenant, (0, 0))
        queries, hits = queries + num_prompt_tokens, hits + num_cached_tokens
        self._prefix_totals[tenant] = (queries, hits)
        self.prefix_hit_rate.labels(tenant).set(hits / queries if queries else 0.0)

    def set_tenants(self, tenants: Iterable[Tenant]) -> None:
        """The running tenants' SLOs (again after each change of the tenants), and the
        series each shows at 0 in the request gauges before its first request."""
        self.ttft_slo.clear()
        self.tpot_slo.clear()
        self._tenants = tuple(tenants)
        self.set_served(self._stats.served)
        for tenant in tenants:
            if tenant.ttft_slo_s is not None:
                self.ttft_slo.labels(tenant.name, tenant.priority.label).set(tenant.ttft_slo_s)
            if tenant.tpot_slo_s is not None:
                self.tpot_slo.labels(tenant.name, tenant.priority.label).set(tenant.tpot_slo_s)

    def observe_tpot(self, labels: tuple[str, str, str], tpot_s: float,
                     slo_s: float | None) -> None:
        """One request's mean time per output token, and whether it kept its SLO."""
        self.tpot.labels(*labels).observe(tpot_s)
        if slo_s is not None:
            self.tpot_slo_requests.labels(labels[1]).inc()
            if tpot_s <= slo_s:
                self.tpot_slo_attained.labels(labels[1]).inc()

    def labels(self, tenant: str, priority: str,
               model: str | None = None) -> tuple[str, str, str]:
        """A request's labels: `model` is the name it ran as (an adapter's, as vLLM's
        `model_name`); None: the served model."""
        return model or self.model_name, tenant, priority

    def set_served(self, models: Iterable[str]) -> None:
        """The models and adapters served now: each shows a 0-valued request gauge series per
        tenant that may use it, from start-up (`_RequestGauge`)."""
        served = frozenset(models)
        self._stats.served = served
        self._stats.idle = frozenset((m, t.name, t.priority.label) for m in served
                                     for t in self._tenants if t.may_use(m))

    def render(self, stats: SchedulerStats, models: Iterable[str] | None = None) -> bytes:
        """The exposition text, after folding in the scheduler's current stats; `models`:
        the models and adapters served now (None: as before)."""
        if models is not None and frozenset(models) != self._stats.served:
            self.set_served(models)
        self._stats.stats = stats
        return generate_latest(self.registry)
