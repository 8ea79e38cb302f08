"""The report of one replay: per-tenant latency, SLO attainment and throughput, device use.

``build_report`` turns a ``ReplayResult`` into a JSON-able dict;
``format_markdown`` renders it; ``write_report`` writes ``report.json``,
``report.md``, ``requests.jsonl`` (one line per request) and, from slicegate,
``timeline.jsonl`` (one line per operator execution) into a folder; times in
both are seconds since the replay's origin.

Definitions (all per tenant):
- TTFT: first token chunk - send, over requests that got one.
- SLO attainment: requests whose TTFT is within the SLO / requests judged.
  Judged: every request that got a first token or failed; a request the
  replay cancelled without a first token is judged (a miss) only if it had
  already waited longer than the SLO.
- TPOT: (last token - first token) / (output tokens - 1), per request.
- Output tok/s and req/s: over the measurement window (until sending stopped
  when the duration ended, else until the last request ended).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadgen.client import CANCELLED, RequestRecord
from loadgen.replay import ReplayResult
from loadgen.stats import distribution
from loadgen.timeline import device_usage
from loadgen.workload import TenantSpec, describe


def resolve_slos(result: ReplayResult,
                 given_s: float | None = None) -> dict[str, tuple[float | None, str]]:
    """Tenant -> (TTFT SLO s, where it came from): its spec, ``given_s``, the server, or none."""
    out: dict[str, tuple[float | None, str]] = {}
    for tenant in result.tenants:
        if tenant.slo_s is not None:
            out[tenant.name] = (tenant.slo_s, "tenant spec")
        elif given_s is not None:
            out[tenant.name] = (given_s, "given")
        elif tenant.name in result.server_slos:
            out[tenant.name] = (result.server_slos[tenant.name], "server")
        else:
            out[tenant.name] = (None, "none")
    return out


def slo_attainment(records: Sequence[RequestRecord], slo_s: float) -> tuple[float | None, int]:
    """(fraction of judged requests with TTFT <= slo_s, number judged); see the module doc."""
    met = judged = 0
    for r in records:
        ttft = r.ttft_s
        if ttft is not None:
            judged += 1
            met += ttft <= slo_s
        elif r.error != CANCELLED or (r.end_s or r.send_s) - r.send_s > slo_s:
            judged += 1
    return (met / judged if judged else None), judged


def tokens_within(record: RequestRecord, window_s: float) -> int:
    """Output tokens of ``record`` that arrived by ``window_s``."""
    if record.token_s and record.token_s[-1] <= window_s:
        return record.output_tokens
    return sum(1 for t in record.token_s if t <= window_s)


def tenant_summary(tenant: TenantSpec, records: Sequence[RequestRecord], window_s: float,
                   slo: tuple[float | None, str]) -> dict[str, Any]:
    """The report entry of one tenant."""
    ok = [r for r in records if r.ok]
    errors = Counter(key for r in records if (key := r.error_key) is not None)
    attainment, judged = slo_attainment(records, slo[0]) if slo[0] is not None else (None, 0)
    output_tokens = sum(tokens_within(r, window_s) for r in records)
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return {
        "source": describe(tenant.source),
        "priority": tenant.priority,
        "num_requests": len(records),
        "num_ok": len(ok),
        "num_errors": sum(errors.values()),
        "errors_by_status": dict(sorted(errors.items())),
        "ttft_s": distribution([t for r in records if (t := r.ttft_s) is not None]).to_json(),
        "tpot_s": distribution([t for r in ok if (t := r.tpot_s) is not None]).to_json(),
        "e2e_s": distribution([r.end_s - r.send_s for r in ok if r.end_s is not None]).to_json(),
        "slo_s": slo[0],
        "slo_source": slo[1],
        "slo_attainment": attainment,
        "num_slo_judged": judged,
        "prompt_tokens_mean": sum(prompts) / len(prompts) if prompts else None,
        "reported_hit_rate": _reported_hit_rate(ok),
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / window_s if window_s > 0 else 0.0,
        "req_s": _completed_within(ok, window_s) / window_s if window_s > 0 else 0.0,
    }


def _reported_hit_rate(records: Sequence[RequestRecord]) -> float | None:
    """Cached over prompt tokens as the server reported them (None where it reports none)."""
    both = [(r.cached_tokens, r.prompt_tokens) for r in records
            if r.cached_tokens is not None and r.prompt_tokens]
    total = sum(p for _, p in both)
    return sum(c for c, _ in both) / total if total else None


def prefix_summary(result: ReplayResult) -> dict[str, Any]:
    """Per tenant: the trace's theoretical hit rate and the server's /metrics one."""
    counters = result.prefix_counters
    metrics = {t: h / q for t, (q, h) in counters.items() if q > 0}
    return {"theoretical_hit_rate": dict(result.theoretical_hit_rate),
            "metrics_hit_rate": metrics}


def _completed_within(records: Sequence[RequestRecord], window_s: float) -> int:
    return sum(1 for r in records if r.end_s is not None and r.end_s <= window_s)


def devices_summary(result: ReplayResult) -> dict[str, Any]:
    """Busy fraction and idle slices per device over the window, from the server timeline."""
    if not result.spans:
        return {"available": False, "reason": result.timeline_error or "empty timeline"}
    start, end = result.origin, result.origin + result.window_s
    usage = device_usage(result.spans, start, end)
    if not any(u.num_ops for u in usage):
        return {"available": False,
                "reason": "no timeline op falls in the replay window"}
    per_device = {u.device: {
        "busy_fraction": u.busy_fraction,
        "num_ops": u.num_ops,
        "idle_slices_s": u.idle_distribution().to_json(),
    } for u in usage}
    return {
        "available": True,
        "busy_fraction_mean": sum(u.busy_fraction for u in usage) / len(usage),
        "per_device": per_device,
    }


def build_report(result: ReplayResult, slo_s: float | None = None) -> dict[str, Any]:
    """The whole report as a JSON-able dict (see the module docstring)."""
    slos = resolve_slos(result, slo_s)
    window = result.window_s
    tenants = {t.name: tenant_summary(t, [r for r in result.records if r.tenant == t.name],
                                      window, slos[t.name]) for t in result.tenants}
    total_tokens = sum(t["output_tokens"] for t in tenants.values())
    return {
        "url": result.url,
        "model": result.model,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "origin_monotonic_s": result.origin,
        "window_s": window,
        "end_s": result.end_s,
        "stopped_early": result.stopped_early,
        "interrupted": result.interrupted,
        "tenants": tenants,
        "total": {
            "num_requests": sum(t["num_requests"] for t in tenants.values()),
            "num_errors": sum(t["num_errors"] for t in tenants.values()),
            "output_tokens": total_tokens,
            "output_tok_s": total_tokens / window if window > 0 else 0.0,
            "req_s": sum(t["req_s"] for t in tenants.values()),
        },
        "devices": devices_summary(result),
        "prefix_cache": prefix_summary(result),
        "fairness_jain": fairness(tenants),
    }


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all equal; None for no values."""
    square = sum(x * x for x in values)
    if not values:
        return None
    return 1.0 if square == 0 else sum(values) ** 2 / (len(values) * square)


def fairness(tenants: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Jain's index of output tok/s among the interactive tenants (those judged by an SLO)
    and among the batch tenants, for groups of two or more."""
    groups: dict[str, list[float]] = {"interactive": [], "batch": []}
    for t in tenants.values():
        groups["interactive" if t["slo_s"] is not None else "batch"].append(t["output_tok_s"])
    return {name: jain_index(v) for name, v in groups.items() if len(v) > 1}


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.0f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def tenant_table(report: dict[str, Any]) -> list[str]:
    """Markdown rows: one per tenant."""
    lines = [
        "| tenant | requests | errors | TTFT p50 / p90 / p99 ms | SLO ms | SLO attained "
        "| TPOT p50 ms | output tok/s | req/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, t in report["tenants"].items():
        ttft = t["ttft_s"]
        lines.append(
            f"| {name} | {t['num_requests']} | {t['num_errors']} "
            f"| {_ms(ttft['p50'])} / {_ms(ttft['p90'])} / {_ms(ttft['p99'])} "
            f"| {_ms(t['slo_s'])} ({t['slo_source']}) | {_pct(t['slo_attainment'])} "
            f"| {_ms(t['tpot_s']['p50'])} | {t['output_tok_s']:.1f} | {t['req_s']:.2f} |")
    return lines


def device_table(devices: dict[str, Any]) -> list[str]:
    """Markdown rows: one per device, or a line saying why there are none."""
    if not devices["available"]:
        return [f"Device use: not available ({devices['reason']})."]
    lines = ["| device | busy | ops | idle slices | idle p50 / p90 / p99 ms |",
             "|---|---:|---:|---:|---:|"]
    for name, d in devices["per_device"].items():
        idle = d["idle_slices_s"]
        lines.append(f"| {name} | {_pct(d['busy_fraction'])} | {d['num_ops']} | {idle['count']} "
                     f"| {_ms(idle['p50'])} / {_ms(idle['p90'])} / {_ms(idle['p99'])} |")
    return lines


def format_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: a header, the tenant table, errors and device use."""
    total = report["total"]
    lines = [
        f"# Replay against {report['url']} ({report['model']})", "",
        f"{report['generated_at']}; window {report['window_s']:.1f} s"
        + ("; stopped early" if report["stopped_early"] else "")
        + ("; interrupted" if report["interrupted"] else "")
        + f"; total {total['output_tok_s']:.1f} output tok/s, {total['req_s']:.2f} req/s, "
        f"{total['num_errors']} errors of {total['num_requests']} requests.", "",
        *tenant_table(report), "",
    ]
    if report.get("fairness_jain"):
        lines += ["Jain's fairness index of output tok/s: " + ", ".join(
            f"{k} {v:.3f}" for k, v in report["fairness_jain"].items() if v is not None), ""]
    for name, t in report["tenants"].items():
        lines.append(f"- {name}: {t['source']}"
                     + (f"; errors {t['errors_by_status']}" if t["errors_by_status"] else ""))
    lines += prefix_lines(report)
    return "\n".join([*lines, "", *device_table(report["devices"]), ""])


def prefix_lines(report: dict[str, Any]) -> list[str]:
    """Per tenant with a prefix cache figure: theoretical, reported and /metrics hit rates."""
    prefix = report.get("prefix_cache", {})
    theory, metrics = prefix.get("theoretical_hit_rate", {}), prefix.get("metrics_hit_rate", {})
    out = []
    for name, t in report["tenants"].items():
        if name in theory or t.get("reported_hit_rate"):
            out.append(f"- {name} prefix cache hit rate: trace {_pct(theory.get(name))}, "
                       f"reported cached_tokens {_pct(t.get('reported_hit_rate'))}, "
                       f"/metrics {_pct(metrics.get(name, metrics.get('*')))}")
    return out


def write_report(result: ReplayResult, out: Path, slo_s: float | None = None) -> dict[str, Any]:
    """Write report.json, report.md, requests.jsonl (and timeline.jsonl); return the report."""
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(result, slo_s)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(format_markdown(report))
    with (out / "requests.jsonl").open("w") as f:
        for record in result.records:
            f.write(json.dumps(asdict(record)) + "\n")
    if result.spans:
        with (out / "timeline.jsonl").open("w") as f:
            for span in result.spans:
                f.write(json.dumps({**asdict(span), "start_s": span.start_s - result.origin,
                                    "end_s": span.end_s - result.origin}) + "\n")
    return report
