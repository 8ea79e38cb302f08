"""Tenant workloads: what each tenant of a replay sends, and when.

A tenant is given on the command line as ``NAME:KEY:SOURCE[:priority=N][:slo_ms=M]``:

- ``NAME`` labels the tenant in reports (match the server's tenant name to pick
  up its TTFT SLO from ``/metrics``); ``KEY`` is its API key (empty: no
  ``Authorization`` header).
- ``SOURCE`` is one of
  - a trace: a path (``.csv[.gz]`` Azure, ``.jsonl[.gz]`` Mooncake) or
    ``synthetic-coding``, then optional ``,key=value`` reshaping options named
    as in ``load_trace``: ``window_s=A-B``, ``rate_scale``, ``token_scale``,
    ``max_prompt_tokens``, ``max_output_tokens``, ``max_total_tokens``,
    ``max_requests``; and ``prompt_scale`` / ``output_scale``, which scale one
    side only (applied after ``token_scale``, before the caps);
  - open loop: ``rate=R,prompt=P,gen=G[,requests=N][,arrival=poisson|uniform][,seed=S]``
    (R requests per second, Poisson arrivals by default);
  - closed loop: ``concurrency=C,prompt=P,gen=G[,requests=N]`` (C requests
    always in flight).
- ``priority=N`` sends a body ``priority`` (vLLM's sense: lower first);
  ``slo_ms=M`` is the TTFT SLO the report holds this tenant to.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loadgen.traces import TraceOptions, TraceRequest, apply_options, load_trace

CAP_KEYS = ("max_prompt_tokens", "max_output_tokens", "max_total_tokens")
SIDE_SCALE_KEYS = ("prompt_scale", "output_scale")
TRACE_KEYS = ("window_s", "rate_scale", "token_scale", *SIDE_SCALE_KEYS, *CAP_KEYS,
              "max_requests")
OPEN_LOOP_KEYS = ("rate", "prompt", "gen", "requests", "arrival", "seed")
CLOSED_LOOP_KEYS = ("concurrency", "prompt", "gen", "requests")
TENANT_KEYS = ("priority", "slo_ms")
_TENANT_OPTION_RE = re.compile(r"(priority|slo_ms)=.*")
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")


class WorkloadError(ValueError):
    """A tenant spec that cannot be used; the message quotes the spec and says what is wrong."""


@dataclass(frozen=True, slots=True)
class TraceSource:
    """Replay a trace file (or the shipped synthetic coding trace), reshaped by ``options``."""

    spec: str  # path or "synthetic-coding"
    options: tuple[tuple[str, object], ...] = ()  # load_trace keyword arguments


@dataclass(frozen=True, slots=True)
class OpenLoop:
    """Requests of one shape arriving at ``rate_per_s``, whether or not earlier ones finished."""

    rate_per_s: float
    prompt_tokens: int
    output_tokens: int
    num_requests: int | None = None  # None: until the replay's duration ends
    arrival: str = "poisson"  # "poisson" (exponential gaps) or "uniform" (fixed gaps)
    seed: int = 0


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """``concurrency`` workers, each sending its next request as soon as the last one ends."""

    concurrency: int
    prompt_tokens: int
    output_tokens: int
    num_requests: int | None = None  # in total over all workers; None: until the duration ends


Source = TraceSource | OpenLoop | ClosedLoop


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """One tenant of a replay: who it is, what it sends, and how it is judged."""

    name: str
    api_key: str  # "" sends no Authorization header
    source: Source
    priority: int | None = None  # body "priority" (vLLM sense, lower first); None: not sent
    slo_s: float | None = None  # TTFT SLO for the report; None: given elsewhere or the server's

    @property
    def is_closed_loop(self) -> bool:
        return isinstance(self.source, ClosedLoop)


# --- parsing -----------------------------------------------------------------------------


def parse_tenant(text: str) -> TenantSpec:
    """Parse ``NAME:KEY:SOURCE[:priority=N][:slo_ms=M]`` (see the module docstring)."""
    parts = text.split(":")
    if len(parts) < 3:
        raise WorkloadError(f"tenant {text!r}: expected NAME:KEY:SOURCE[:priority=N][:slo_ms=M]")
    name, key, rest = parts[0], parts[1], parts[2:]
    if not _NAME_RE.fullmatch(name):
        raise WorkloadError(f"tenant {text!r}: the name must be letters, digits, '_', '.' or '-'")
    options: dict[str, str] = {}
    while rest and _TENANT_OPTION_RE.fullmatch(rest[-1]):
        option_key, _, value = rest.pop().partition("=")
        if option_key in options:
            raise WorkloadError(f"tenant {text!r}: {option_key} is given twice")
        options[option_key] = value
    source_text = ":".join(rest)
    if not source_text:
        raise WorkloadError(f"tenant {text!r}: the SOURCE is empty")
    where = f"tenant {name!r}"
    return TenantSpec(
        name=name,
        api_key=key,
        source=parse_source(source_text, where=where),
        priority=_int(options, "priority", where, least=None),
        slo_s=_slo_s(options, where),
    )


def parse_tenants(texts: Sequence[str]) -> list[TenantSpec]:
    """Parse several tenant specs; names must be unique."""
    if not texts:
        raise WorkloadError("no tenants: give at least one --tenant NAME:KEY:SOURCE")
    tenants = [parse_tenant(t) for t in texts]
    seen: set[str] = set()
    for tenant in tenants:
        if tenant.name in seen:
            raise WorkloadError(f"tenant name {tenant.name!r} is used twice")
        seen.add(tenant.name)
    return tenants


def parse_source(text: str, *, where: str = "source") -> Source:
    """Parse the SOURCE part of a tenant spec: a trace with options, or a batch spec."""
    items = [item.strip() for item in text.split(",")]
    if "=" not in items[0]:
        options = _key_values(items[1:], TRACE_KEYS, f"{where} trace {items[0]!r}")
        return _trace_source(items[0], options, where)
    options = _key_values(items, OPEN_LOOP_KEYS + CLOSED_LOOP_KEYS, where)
    if ("rate" in options) == ("concurrency" in options):
        raise WorkloadError(f"{where}: give exactly one of rate=R (open loop) or "
                            f"concurrency=C (closed loop), got {text!r}")
    if "rate" in options:
        return _open_loop(options, where)
    return _closed_loop(options, where)


def _key_values(items: Sequence[str], known: Sequence[str], where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not value:
            raise WorkloadError(f"{where}: expected key=value, got {item!r}")
        if key not in known:
            raise WorkloadError(f"{where}: unknown option {key!r} (known: {', '.join(known)})")
        if key in out:
            raise WorkloadError(f"{where}: {key} is given twice")
        out[key] = value
    return out


def _trace_source(spec: str, options: dict[str, str], where: str) -> TraceSource:
    parsed: list[tuple[str, object]] = []
    for key, value in options.items():
        if key == "window_s":
            parsed.append((key, _window(value, where)))
        elif key in ("rate_scale", "token_scale", *SIDE_SCALE_KEYS):
            parsed.append((key, _float(options, key, where)))
        else:
            parsed.append((key, _int(options, key, where, least=1)))
    return TraceSource(spec, tuple(parsed))


def _open_loop(options: dict[str, str], where: str) -> OpenLoop:
    _reject(options, ("concurrency",), where, "an open-loop (rate=) source")
    arrival = options.get("arrival", "poisson")
    if arrival not in ("poisson", "uniform"):
        raise WorkloadError(f"{where}: arrival must be poisson or uniform, got {arrival!r}")
    return OpenLoop(
        rate_per_s=_float(options, "rate", where),
        prompt_tokens=_required_int(options, "prompt", where),
        output_tokens=_required_int(options, "gen", where),
        num_requests=_int(options, "requests", where, least=1),
        arrival=arrival,
        seed=_int(options, "seed", where, least=0) or 0,
    )


def _closed_loop(options: dict[str, str], where: str) -> ClosedLoop:
    _reject(options, ("arrival", "seed"), where, "a closed-loop (concurrency=) source")
    return ClosedLoop(
        concurrency=_required_int(options, "concurrency", where),
        prompt_tokens=_required_int(options, "prompt", where),
        output_tokens=_required_int(options, "gen", where),
        num_requests=_int(options, "requests", where, least=1),
    )


def _reject(options: dict[str, str], keys: Sequence[str], where: str, what: str) -> None:
    for key in keys:
        if key in options:
            raise WorkloadError(f"{where}: {key}= does not apply to {what}")


def _required_int(options: dict[str, str], key: str, where: str) -> int:
    if key not in options:
        raise WorkloadError(f"{where}: missing {key}=N")
    value = _int(options, key, where, least=1)
    assert value is not None
    return value


def _int(options: dict[str, str], key: str, where: str, *, least: int | None) -> int | None:
    if key not in options:
        return None
    text = options[key]
    try:
        value = int(text)
    except ValueError:
        raise WorkloadError(f"{where}: {key} must be an integer, got {text!r}") from None
    if least is not None and value < least:
        raise WorkloadError(f"{where}: {key} must be >= {least}, got {value}")
    return value


def _float(options: dict[str, str], key: str, where: str) -> float:
    text = options[key]
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise WorkloadError(f"{where}: {key} must be a number > 0, got {text!r}")
    return value


def _window(text: str, where: str) -> tuple[float, float]:
    start, dash, end = text.partition("-")
    try:
        window = (float(start), float(end)) if dash else None
    except ValueError:
        window = None
    if window is None or not (0 <= window[0] < window[1] and math.isfinite(window[1])):
        raise WorkloadError(f"{where}: window_s must be START-END seconds with "
                            f"0 <= START < END, got {text!r}")
    return window


def _slo_s(options: dict[str, str], where: str) -> float | None:
    if "slo_ms" not in options:
        return None
    return _float(options, "slo_ms", where) / 1000


# --- planning ----------------------------------------------------------------------------


def plan_arrivals(source: Source, duration_s: float | None = None) -> list[TraceRequest]:
    """The requests of a trace or open-loop source, arrivals in seconds from the replay start.

    Requests arriving at or after ``duration_s`` are left out. A closed-loop
    source has no arrival times (its workers pace themselves): asking for them
    is an error.
    """
    if isinstance(source, ClosedLoop):
        raise TypeError("a closed-loop source has no planned arrivals")
    if isinstance(source, TraceSource):
        try:
            planned = _trace_arrivals(source)
        except (OSError, ValueError) as exc:
            raise WorkloadError(f"trace {source.spec!r}: {exc}") from exc
    else:
        planned = _open_loop_arrivals(source, duration_s)
    if duration_s is not None:
        planned = [r for r in planned if r.arrival_s < duration_s]
    return planned


def _trace_arrivals(source: TraceSource) -> list[TraceRequest]:
    """``load_trace`` with the source's options, then the one-sided scales, then the caps."""
    options: dict[str, Any] = dict(source.options)
    prompt_scale, output_scale = options.pop("prompt_scale", 1.0), options.pop("output_scale", 1.0)
    caps = {key: options.pop(key) for key in CAP_KEYS if key in options}
    planned = load_trace(source.spec, **options)
    if prompt_scale != 1.0 or output_scale != 1.0:
        planned = [TraceRequest(r.arrival_s, max(1, round(r.prompt_tokens * prompt_scale)),
                                max(1, round(r.output_tokens * output_scale)), r.hash_ids)
                   for r in planned]
    return apply_options(planned, TraceOptions(**caps)) if caps else planned


def _open_loop_arrivals(source: OpenLoop, duration_s: float | None) -> list[TraceRequest]:
    if source.num_requests is None and duration_s is None:
        raise WorkloadError("an open-loop source needs requests=N or a replay duration")
    rng = random.Random(source.seed)
    gap: Callable[[], float] = (
        (lambda: rng.expovariate(source.rate_per_s)) if source.arrival == "poisson"
        else (lambda: 1 / source.rate_per_s)
    )
    planned: list[TraceRequest] = []
    t = 0.0
    while source.num_requests is None or len(planned) < source.num_requests:
        if duration_s is not None and t >= duration_s:
            break
        planned.append(TraceRequest(t, source.prompt_tokens, source.output_tokens))
        t += gap()
    return planned


def describe(source: Source) -> str:
    """A short human description of a source, for report headers."""
    if isinstance(source, TraceSource):
        options = ",".join(f"{k}={_fmt(v)}" for k, v in source.options)
        return f"trace {source.spec}" + (f" ({options})" if options else "")
    bound = f", {source.num_requests} requests" if source.num_requests else ""
    if isinstance(source, OpenLoop):
        return (f"open loop {source.rate_per_s:g} req/s ({source.arrival}), prompt "
                f"{source.prompt_tokens}, gen {source.output_tokens}{bound}")
    return (f"closed loop x{source.concurrency}, prompt {source.prompt_tokens}, "
            f"gen {source.output_tokens}{bound}")


def _fmt(value: object) -> str:
    if isinstance(value, tuple):
        return "-".join(f"{v:g}" for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)

