"""One row per chaos scenario: what was sent, what came back, what the server kept, the goal."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from loadgen.client import CANCELLED, RequestRecord

SHED_CODES = ("overloaded", "rate_limit_exceeded")  # 503 shed / evicted, 429 tenant quota
IN_STREAM = "503 in stream"  # evicted after a stream's 200 went out: no Retry-After possible


@dataclass(slots=True)
class Outcomes:
    """The requests of a scenario, classified."""

    sent: int = 0
    completed: int = 0
    shed: Counter[str] = field(default_factory=Counter)  # status -> requests
    shed_without_retry_after: int = 0
    failed: int = 0  # ended with a clear error (an error status or an error event)
    lost: int = 0  # no clear end: cut off, timed out, or still running when the run ended
    server_5xx: int = 0  # 5xx other than shedding
    errors: Counter[str] = field(default_factory=Counter)  # first words of errors -> count


def classify(records: Iterable[RequestRecord]) -> Outcomes:
    out = Outcomes()
    for r in records:
        out.sent += 1
        if r.ok:
            out.completed += 1
        elif r.error_code in SHED_CODES and r.status in (429, 503):
            out.shed[str(r.status)] += 1
            out.shed_without_retry_after += not (r.retry_after or "").isdigit()
        elif r.error_code == "overloaded" and r.status == 200:
            out.shed[IN_STREAM] += 1
            out.shed_without_retry_after += 1
        elif r.status == 0 or r.error == CANCELLED or r.error_code is None and r.status == 200:
            out.lost += 1  # transport error, timeout, cancelled, or a stream cut short
            out.errors[(r.error or "?")[:60]] += 1
        else:
            out.failed += 1
            out.server_5xx += r.status >= 500
            out.errors[f"{r.status} {r.error_code}"] += 1
    return out


def slo_attainment(records: Sequence[RequestRecord], slo_s: float) -> tuple[float | None, int]:
    """Of admitted requests (not shed), the fraction whose first token came within `slo_s`."""
    admitted = [r for r in records
                if not (r.error_code in SHED_CODES and r.status in (429, 503))
                and not (r.error_code == "overloaded" and r.status == 200)]
    if not admitted:
        return None, 0
    met = sum(r.ttft_s is not None and r.ttft_s <= slo_s for r in admitted)
    return met / len(admitted), len(admitted)


@dataclass(slots=True)
class Row:
    """The figures the reliability table (docs/benchmarks/reliability.md) shows for one scenario."""

    scenario: str
    goal: str
    met: bool
    outcomes: Outcomes
    interactive_slo: float | None = None  # attainment of admitted interactive requests
    interactive_admitted: int = 0
    kv_blocks_after: int | None = None
    rss_start_mib: float | None = None
    rss_end_mib: float | None = None
    healthy: bool = True  # every /health poll during the run and after it answered 200
    jain: dict[str, float] = field(default_factory=dict)  # class -> server's Jain's index
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["outcomes"]["shed"] = dict(self.outcomes.shed)
        doc["outcomes"]["errors"] = dict(self.outcomes.errors)
        return doc


def mib(n: int | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def markdown(rows: Sequence[Row]) -> str:
    head = ("| scenario | sent | completed | shed (status) | failed | lost | interactive SLO "
            "| KV blocks after | RSS start → end MiB | 5xx not shed | healthy | goal | met |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        o = r.outcomes
        shed = ", ".join(f"{n}×{s}" for s, n in sorted(o.shed.items())) or "0"
        slo = (f"{100 * r.interactive_slo:.1f}% of {r.interactive_admitted}"
               if r.interactive_slo is not None else "—")
        lines.append(f"| {r.scenario} | {o.sent} | {o.completed} | {shed} | {o.failed} "
                     f"| {o.lost} | {slo} | {_fmt(r.kv_blocks_after)} "
                     f"| {_fmt(r.rss_start_mib)} → {_fmt(r.rss_end_mib)} | {o.server_5xx} "
                     f"| {'yes' if r.healthy else 'NO'} | {r.goal} | "
                     f"{'yes' if r.met else 'NO'} |")
    return "\n".join(lines)
