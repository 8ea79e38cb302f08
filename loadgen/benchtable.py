"""The bench's headline: one row per run, ratios to fcfs, the goals checked, overlay plots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.plots import idle_slices, plot_cdf
from loadgen.replay import ReplayResult

BASELINE = "fcfs"
_REASON_CHARS = 240
_NUM_COLUMNS = 11


@dataclass(slots=True)
class RunOutcome:
    """One run of the bench: its headline figures, or why it did not run."""

    name: str
    summary: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None  # why the run failed; None when it ran
    note: str = ""
    result: ReplayResult | None = None
    report_path: Path | None = None

    @classmethod
    def failed(cls, name: str, reason: str, note: str = "") -> RunOutcome:
        return cls(name, reason=reason, note=note)

    @property
    def ok(self) -> bool:
        return self.reason is None

    def to_json(self) -> dict[str, Any]:
        return {"status": "ok" if self.ok else "failed", "reason": self.reason,
                "note": self.note, "report": str(self.report_path or ""), **self.summary}


def summarize_run(report: Mapping[str, Any], hp: str, lp: str) -> dict[str, Any]:
    """The headline figures of one run's report (JSON keys as the scheduler's policies bench)."""
    tenants = report["tenants"]
    high, low = tenants.get(hp), tenants.get(lp)
    devices = report["devices"]
    return {
        "hp_requests": high["num_requests"] if high else 0,
        "hp_slo_attainment": high["slo_attainment"] if high else None,
        "hp_ttft_p50_s": high["ttft_s"]["p50"] if high else None,
        "hp_ttft_p90_s": high["ttft_s"]["p90"] if high else None,
        "hp_ttft_p99_s": high["ttft_s"]["p99"] if high else None,
        "hp_tpot_p50_s": high["tpot_s"]["p50"] if high else None,
        "hp_errors": high["num_errors"] if high else 0,
        "lp_tok_s": low["output_tok_s"] if low else 0.0,
        "total_tok_s": report["total"]["output_tok_s"],
        "errors": report["total"]["num_errors"],
        "busy_fraction": devices.get("busy_fraction_mean") if devices["available"] else None,
        **_hit_rates(report, hp),
    }


def _hit_rates(report: Mapping[str, Any], hp: str) -> dict[str, float | None]:
    """The interactive tenant's prefix cache hit rates: the trace's, reported, /metrics."""
    prefix = report.get("prefix_cache", {})
    metrics = prefix.get("metrics_hit_rate", {})
    high = report["tenants"].get(hp) or {}
    return {"hp_hit_rate_trace": prefix.get("theoretical_hit_rate", {}).get(hp),
            "hp_hit_rate_reported": high.get("reported_hit_rate"),
            "hp_hit_rate_metrics": metrics.get(hp, metrics.get("*"))}


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "–"
    return f"{value / base:.2f}×"


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "–" if value is None else format(value * scale, spec)


def _row(outcome: RunOutcome, base: Mapping[str, Any] | None, alone_p90: float | None) -> str:
    if not outcome.ok:
        reason = " ".join((outcome.reason or "").split())[:_REASON_CHARS]
        return f"| {outcome.name} | did not run: {reason} " + "|" * (_NUM_COLUMNS - 1)
    s, b = outcome.summary, base or {}
    return (
        f"| {outcome.name} | {_fmt(s['hp_slo_attainment'], '.1%')} ({s['hp_requests']}) "
        f"| {_fmt(s['hp_ttft_p50_s'], '.0f', 1000)} / {_fmt(s['hp_ttft_p90_s'], '.0f', 1000)} / "
        f"{_fmt(s['hp_ttft_p99_s'], '.0f', 1000)} | {_ratio(s['hp_ttft_p90_s'], alone_p90)} "
        f"| {s['lp_tok_s']:.1f} | {_ratio(s['lp_tok_s'], b.get('lp_tok_s'))} "
        f"| {s['total_tok_s']:.1f} | {_ratio(s['total_tok_s'], b.get('total_tok_s'))} "
        f"| {_fmt(s['busy_fraction'], '.0%')} | {s['errors']} | {outcome.note} |")


def headline_table(outcomes: Mapping[str, RunOutcome], order: Sequence[str],
                   missing: str = "not requested (see --peers)",
                   alone_p90: float | None = None) -> list[str]:
    """Markdown rows, one per run in ``order`` (``missing`` says why one is absent); ratios to
    the fcfs run, and of the interactive p90 TTFT to the alone run's."""
    base_run = outcomes.get(BASELINE)
    base = base_run.summary if base_run is not None and base_run.ok else None
    lines = [
        "| run | interactive SLO attained (requests) | interactive TTFT p50 / p90 / p99 ms "
        "| p90 × alone | batch tok/s | batch × fcfs | total tok/s | total × fcfs | busy "
        "| errors | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name in order:
        outcome = outcomes.get(name) or RunOutcome.failed(name, missing)
        lines.append(_row(outcome, base, alone_p90))
    return lines


def _at_least(value: float | None, base: float | None, factor: float) -> bool | None:
    return None if value is None or base is None else value >= factor * base


def goal_lines(outcomes: Mapping[str, RunOutcome], alone_run: str | None = None,
               alone_p90: float | None = None) -> list[str]:
    """The goals for ``slice``, each checked where the runs it needs succeeded."""
    ran = {name: o.summary for name, o in outcomes.items() if o.ok}
    sl = ran.get("slice")
    if sl is None:
        return ["- slice did not run: no goal can be checked."]

    def other(run: str, key: str) -> float | None:
        return ran[run][key] if run in ran else None

    attained, n = sl["hp_slo_attainment"], sl["hp_requests"]
    vllm_attained = other("vllm", "hp_slo_attainment")
    p90 = sl["hp_ttft_p90_s"]
    floor = alone_p90 if alone_run == "slice-alone" else None
    alone = (f"; alone: {_fmt(ran[alone_run]['hp_slo_attainment'], '.1%')}"
             if alone_run in ran else "")
    checks: list[tuple[str, bool | None]] = [
        (f"interactive SLO attainment {_fmt(attained, '.1%')} >= 99% over {n} requests{alone}",
         None if attained is None else attained >= 0.99),
        (f"interactive TTFT p90 <= 1.2x slice alone ({_ratio(p90, floor)})",
         None if p90 is None or floor is None else p90 <= 1.2 * floor),
        (f"total tok/s >= 0.97x fcfs ({_ratio(sl['total_tok_s'], other('fcfs', 'total_tok_s'))})",
         _at_least(sl["total_tok_s"], other("fcfs", "total_tok_s"), 0.97)),
        (f"batch tok/s >= 0.95x fcfs ({_ratio(sl['lp_tok_s'], other('fcfs', 'lp_tok_s'))})",
         _at_least(sl["lp_tok_s"], other("fcfs", "lp_tok_s"), 0.95)),
        (f"interactive SLO attainment above vLLM's ({_fmt(vllm_attained, '.1%')})",
         None if attained is None or vllm_attained is None else attained > vllm_attained),
        (f"total tok/s >= vLLM's ({_ratio(sl['total_tok_s'], other('vllm', 'total_tok_s'))})",
         _at_least(sl["total_tok_s"], other("vllm", "total_tok_s"), 1.0)),
    ]
    marks = {True: "met", False: "MISSED", None: "not checked (a run it needs is missing)"}
    return [f"- slice: {text}: {marks[ok]}" for text, ok in checks]


_LATENCY_KEYS = ("hp_ttft_p50_s", "hp_ttft_p90_s", "hp_ttft_p99_s", "hp_tpot_p50_s")


def latency_table(outcomes: Mapping[str, RunOutcome], names: Sequence[str]) -> list[str]:
    """Each run's interactive TTFT p50 / p90 / p99 and TPOT p50 (ms), and vLLM's ratio."""
    vllm = outcomes.get("vllm")
    base = vllm.summary if vllm is not None and vllm.ok else None
    lines = ["| run | interactive requests | TTFT p50 / p90 / p99 ms | TPOT p50 ms "
             "| each ≤ vLLM's |", "|---|---:|---:|---:|---|"]
    for name in names:
        o = outcomes.get(name)
        if o is None or not o.ok:
            continue
        s = o.summary
        ttft = " / ".join(_fmt(s.get(k), ".0f", 1000) for k in _LATENCY_KEYS[:3])
        lines.append(f"| {name} | {s['hp_requests']} | {ttft} | "
                     f"{_fmt(s.get('hp_tpot_p50_s'), '.1f', 1000)} | {_at_most_vllm(s, base)} |")
    return lines


def _at_most_vllm(s: Mapping[str, Any], base: Mapping[str, Any] | None) -> str:
    if base is None or s is base:
        return "–"
    pairs = [(s.get(k), base.get(k)) for k in _LATENCY_KEYS]
    checked = [a <= b for a, b in pairs if a is not None and b is not None]
    if len(checked) < len(pairs):
        return "not checked"
    return "yes" if all(checked) else "no"


def format_bench_markdown(doc: Mapping[str, Any], outcomes: Mapping[str, RunOutcome],
                          policies: Sequence[str], peers: Sequence[str],
                          section: Sequence[str] = ()) -> str:
    """The bench report: setup, the headline table, a recipe's own ``section`` (markdown
    lines), the goals, and links to each run."""
    slo, alone_p90 = doc["slo_s"], doc.get("alone_hp_ttft_p90_s")
    requested = [*policies, *peers]
    alone = [doc["alone_run"]] if doc.get("alone_run") in outcomes else []
    table = headline_table(outcomes, [*alone, *requested],
                           "the bench was interrupted before this run", alone_p90)
    if "vllm" not in requested:
        table += headline_table(outcomes, ["vllm"], alone_p90=alone_p90)[2:]
    lines = [
        "# slicegate bench", "",
        f"{doc['started_at']} to {doc['finished_at']}"
        + (" (interrupted)" if doc["interrupted"] else "") + f": `{doc['command']}`", "",
        f"Model {doc['config']['model']} ({doc['model_folder']}), "
        f"{doc['config']['dtype']}, max model len {doc['config']['max_model_len']}; "
        f"devices {doc['config']['devices'] or 'server default'}.",
        f"Interactive: {doc['config']['interactive']} ({doc['interactive_requests']} requests); "
        f"batch: {doc['config']['batch']}; mixed runs send for {doc['mixed_duration_s']:.1f} s.",
        f"Interactive TTFT SLO: {_fmt(slo, '.0f', 1000)} ms ({doc['slo_source']})."
        + (f" Interactive TPOT SLO (tenants file): {_fmt(tpot, '.0f', 1000)} ms."
           if (tpot := doc.get("tpot_slo_s")) else ""), "",
        *table, "",
        "## Interactive latency", "",
        *latency_table(outcomes, list(dict.fromkeys([*alone, *requested]))), "",
        *section,
        "## Goals", "", *goal_lines(outcomes, doc.get("alone_run"), alone_p90), "",
        *prefix_section(outcomes, list(dict.fromkeys([*alone, *requested, "vllm"]))),
        "## Runs", "",
    ]
    for name, outcome in outcomes.items():
        where = outcome.report_path or "no report"
        lines.append(f"- {name}: {where}" + ("" if outcome.ok else f" (failed: {outcome.reason})"))
    return "\n".join(lines) + "\n"


def prefix_section(outcomes: Mapping[str, RunOutcome], names: Sequence[str]) -> list[str]:
    """Interactive prefix cache hit rates per run and the prefix cache goals (only where the
    interactive trace has hash_ids)."""
    ran = {n: outcomes[n].summary for n in names if n in outcomes and outcomes[n].ok}
    if not any(s.get("hp_hit_rate_trace") is not None for s in ran.values()):
        return []
    lines = ["## Prefix cache", "", "| run | trace's theoretical hit rate | reported "
             "cached_tokens | /metrics | TTFT p50 ms |", "|---|---:|---:|---:|---:|"]
    for name, s in ran.items():
        lines.append(f"| {name} | {_fmt(s.get('hp_hit_rate_trace'), '.1%')} "
                     f"| {_fmt(s.get('hp_hit_rate_reported'), '.1%')} "
                     f"| {_fmt(s.get('hp_hit_rate_metrics'), '.1%')} "
                     f"| {_fmt(s.get('hp_ttft_p50_s'), '.0f', 1000)} |")
    return [*lines, "", *_prefix_goals(ran), ""]


def _prefix_goals(ran: Mapping[str, Mapping[str, Any]]) -> list[str]:
    sl, off, vllm = ran.get("slice"), ran.get("slice-no-cache"), ran.get("vllm")
    if sl is None:
        return ["- slice did not run: no prefix cache goal can be checked."]
    theory, got = sl.get("hp_hit_rate_trace"), sl.get("hp_hit_rate_reported")
    p50 = sl.get("hp_ttft_p50_s")
    p50_off = off.get("hp_ttft_p50_s") if off else None
    p99, p99_v = sl.get("hp_ttft_p99_s"), vllm.get("hp_ttft_p99_s") if vllm else None
    ahead = None if p99 is None or p99_v is None else (
        p99 < p99_v and sl["total_tok_s"] >= vllm["total_tok_s"])  # type: ignore[index]
    checks: list[tuple[str, bool | None]] = [
        (f"hit rate {_fmt(got, '.1%')} >= 95% of the trace's {_fmt(theory, '.1%')}",
         None if got is None or not theory else got >= 0.95 * theory),
        (f"TTFT p50 without the cache over with it {_ratio(p50_off, p50)} >= 2x",
         None if p50 is None or p50_off is None else p50_off >= 2 * p50),
        ("TTFT p99 below vLLM's at >= its total tok/s "
         f"({_fmt(p99, '.0f', 1000)} vs {_fmt(p99_v, '.0f', 1000)} ms; total "
         f"{_ratio(sl['total_tok_s'], vllm['total_tok_s'] if vllm else None)})", ahead),
    ]
    marks = {True: "met", False: "MISSED", None: "not checked (a run it needs is missing)"}
    return [f"- slice: {text}: {marks[ok]}" for text, ok in checks]


def write_bench_plots(outcomes: Mapping[str, RunOutcome], out: Path, slo_s: float | None,
                      hp: str) -> list[Path]:
    """Overlay plots of every run that ran: interactive TTFT CDF and idle-slice CDF."""
    ran = {name: o.result for name, o in outcomes.items() if o.ok and o.result is not None}
    ttft = {name: [t for r in result.records if r.tenant == hp and (t := r.ttft_s) is not None]
            for name, result in ran.items()}
    idle = {name: [s for slices in idle_slices(result).values() for s in slices]
            for name, result in ran.items() if result.spans}
    marks = {"SLO": slo_s} if slo_s is not None else {}
    return [
        plot_cdf(ttft, out / "bench_ttft_cdf.png", xlabel="interactive TTFT (s)",
                 title="Interactive TTFT by run", marks=marks),
        plot_cdf(idle, out / "bench_idle_slices_cdf.png", xlabel="idle slice (s)",
                 title="Idle slices between operators by run", log_x=True),
    ]
