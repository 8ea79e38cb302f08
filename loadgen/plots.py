"""PNG plots of a replay (matplotlib, Agg backend): TTFT CDF, throughput and busy over time,
idle-slice CDF. The CDF plots take named series, so the bench overlays its runs with them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from loadgen.client import RequestRecord  # noqa: E402
from loadgen.replay import ReplayResult  # noqa: E402
from loadgen.stats import cdf  # noqa: E402
from loadgen.timeline import busy_over_time, device_usage  # noqa: E402

_DPI = 110


def plot_cdf(series: Mapping[str, Sequence[float]], path: Path, *, xlabel: str, title: str,
             log_x: bool = False, marks: Mapping[str, float] | None = None) -> Path:
    """Empirical CDFs of several samples on one axes; ``marks`` draws labelled vertical lines."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, values in series.items():
        xs, ys = cdf(v for v in values if not log_x or v > 0)
        if xs:
            ax.step(xs, ys, where="post", label=f"{name} (n={len(xs)})")
    for name, x in (marks or {}).items():
        ax.axvline(x, linestyle="--", linewidth=1, color="grey")
        ax.annotate(name, (x, 0.02), rotation=90, fontsize=8, color="grey")
    if log_x and any(v > 0 for values in series.values() for v in values):
        ax.set_xscale("log")
    ax.set(xlabel=xlabel, ylabel="fraction", title=title, ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def tokens_per_bin(records: Sequence[RequestRecord], num_bins: int, bin_s: float) -> list[float]:
    """Output tokens per second in each bin (a chunk is a token; usage extras go to the last)."""
    bins = [0.0] * num_bins
    for r in records:
        for i, t in enumerate(r.token_s):
            extra = max(0, r.output_tokens - len(r.token_s)) if i == len(r.token_s) - 1 else 0
            k = int(t // bin_s)
            if 0 <= k < num_bins:
                bins[k] += 1 + extra
    return [b / bin_s for b in bins]


def plot_over_time(result: ReplayResult, path: Path, bin_s: float | None = None) -> Path:
    """Output tok/s per tenant (top) and device busy fraction (bottom) over the replay, in bins
    of ``bin_s`` (default: 1 s, or 1/120 of a longer run)."""
    bin_s = bin_s or max(1.0, result.end_s / 120)
    end = max(result.end_s, bin_s)
    num_bins = int(end // bin_s) + 1
    xs = [(i + 0.5) * bin_s for i in range(num_bins)]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.0, 5.6), sharex=True)
    for tenant in result.tenants:
        mine = [r for r in result.records if r.tenant == tenant.name]
        top.plot(xs, tokens_per_bin(mine, num_bins, bin_s), label=tenant.name)
    top.plot(xs, tokens_per_bin(result.records, num_bins, bin_s), label="total", color="black",
             linewidth=1)
    top.set(ylabel="output tok/s", title="Throughput and device busy fraction")
    top.legend(fontsize=8)
    if result.spans:
        busy = busy_over_time(result.spans, result.origin, result.origin + end, bin_s)
        for device, fractions in busy.items():
            bottom.plot(xs[: len(fractions)], fractions, label=device)
        bottom.legend(fontsize=8)
    else:
        bottom.text(0.5, 0.5, f"no timeline: {result.timeline_error}", ha="center",
                    transform=bottom.transAxes, fontsize=8)
    bottom.set(xlabel="seconds since start", ylabel="busy fraction", ylim=(0, 1.05))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return _save(fig, path)


def idle_slices(result: ReplayResult) -> dict[str, list[float]]:
    """Device -> idle slice lengths (s) over the measurement window."""
    if not result.spans:
        return {}
    usage = device_usage(result.spans, result.origin, result.origin + result.window_s)
    return {u.device: list(u.idle_slices_s) for u in usage}


def ttft_series(result: ReplayResult) -> dict[str, list[float]]:
    """Tenant -> TTFTs (s) of the requests that got a first token."""
    return {t.name: [x for r in result.records if r.tenant == t.name and (x := r.ttft_s)
                     is not None] for t in result.tenants}


def write_plots(result: ReplayResult, out: Path,
                slos: Mapping[str, float | None] | None = None) -> list[Path]:
    """Write ttft_cdf.png, over_time.png and idle_slices_cdf.png into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    marks = {f"SLO {name}": s for name, s in (slos or {}).items() if s is not None}
    return [
        plot_cdf(ttft_series(result), out / "ttft_cdf.png", xlabel="TTFT (s)",
                 title="Time to first token", marks=marks),
        plot_over_time(result, out / "over_time.png"),
        plot_cdf(idle_slices(result), out / "idle_slices_cdf.png", xlabel="idle slice (s)",
                 title="Idle slices between operators", log_x=True),
    ]


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return path
