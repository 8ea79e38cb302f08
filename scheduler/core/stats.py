"""The scheduler's numbers for /metrics (`SchedulerStats`)."""

from __future__ import annotations

from collections import Counter

from executors.types import Priority
from scheduler.api import NO_DEVICE, SchedulerStats
from scheduler.core.components import Components


def collect(s: Components) -> SchedulerStats:
    running: Counter[tuple[str, str]] = Counter()
    waiting: Counter[tuple[str, str]] = Counter()
    by_model: tuple[Counter[tuple[str, str, str]], ...] = (Counter(), Counter())
    for st in s.states.values():
        key = (st.req.tenant, st.priority.label)
        (running if st.status.holds_kv else waiting)[key] += 1
        # NOTE: an adapter's requests under its name, as vLLM's `model_name` (one model: "")
        model = st.req.adapter or st.req.model
        by_model[0 if st.status.holds_kv else 1][(model, *key)] += 1
    problem = s.health.problem(s.exec.healthy)
    down = s.exec.down()
    if problem is not None and s.devices and len(down) == len(s.devices):
        problem = f"{NO_DEVICE}: every device is down ({', '.join(sorted(down))})"
    wall = max(1e-9, s.clock() - s.started_at)
    est = s.estimator
    if est is not None:
        est.flush(s.clock())
    mape = est.mape() if est is not None else {}
    return SchedulerStats(
        num_running=dict(running), num_waiting=dict(waiting), kv_cache_usage=s.kv.usage(),
        num_running_by_model=dict(by_model[0]), num_waiting_by_model=dict(by_model[1]),
        kv_cache_usage_by_model=_kv_usage(s), num_preemptions=dict(s.requests.preemptions),
        kv_swapped_bytes=s.requests.swapped_out_bytes,
        kv_recomputed_tokens=s.requests.dropped_tokens,
        slo_attainment={p.label: c.attainment for p, c in s.books.slo.items()},
        slo_attainment_by_model={(m, p.label): c.attainment
                                 for (m, p), c in s.books.slo_by_model.items()},
        device_busy_ratio={d: min(1.0, s.exec.busy_s(d) / wall) for d in s.devices},
        round_seconds=s.books.rounds.copy(), estimator_mape=mape,
        estimator_cov=est.sample_cov() if est is not None else {},
        estimator_level=est.levels() if est is not None else {},
        reprofiles=_reprofiles(s), reprofiling=s.profiler is not None and s.profiler.busy,
        slowdown=dict(est.interference.slowdown) if est is not None and est.interference else {},
        first_token_factor=dict(s.calibration.factors()),
        fairness_jain=s.fair.jain(),
        queued_tokens={p.label: s.requests.waiting.tokens(p) for p in Priority},
        errors_total=s.health.errors_total, healthy=problem is None, health_detail=problem,
        device_up={d: d not in down for d in s.exec.executors},
        device_detail={d: describe() for d, e in s.exec.executors.items()
                       if callable(describe := getattr(e, "describe", None))})


def _kv_usage(s: Components) -> dict[str, float]:
    """model -> KV usage of the pools it uses on the devices it runs on (one model: all).

    NOTE: models of one KV layout share a pool per device (models/modelset.py); each then
    reports the shared pool's usage, as blocks are not split between them."""
    return {m: s.kv.usage(m, s.model_devices.get(m)) for m in s.model_names}


def _reprofiles(s: Components) -> dict[str, int]:
    """Background profiles done, per device kind or transfer pair."""
    p = s.profiler
    if p is None:
        return {}
    done: Counter[str] = Counter(p.kinds_done)
    done.update(f"{a}->{b}" for a, b in p.done)
    return dict(done)
