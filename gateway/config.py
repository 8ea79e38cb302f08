"""The gateway's one frozen configuration tree, loaded from YAML/TOML with CLI overrides.

A config file mirrors the tree (every key optional)::

    model:     {spec: default, served_model_name: null, dtype: bfloat16, max_model_len: null,
                generation_config: auto, fim: auto, tool_parser: auto,
                lora: {sql: /adapters/sql}, lora_reserve_gib: 0,   # docs/lora.md
                speculative_config: null,   # vLLM's JSON: docs/speculation.md
                layers_per_group: null, layer_groups: []}   # docs/granularity.md
    scheduler: {devices: "cpu:0,cpu:1", device_memory_gib: null, policy: slice,
                ray_address: null, max_batch_tokens: null}
    server:    {host: 127.0.0.1, port: 8000, drain_timeout_s: 30, request_timeout_s: 600,
                log_level: info, log_format: text}
    batch:     {data_dir: null, max_file_bytes: 104857600, max_file_lines: 50000}
    cors:      {allowed_origins: [], ...}      # and tls: gateway/transport.py
    tenants_file: tenants.yaml

Precedence: built-in defaults < config file < command-line flags.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs
import yaml

from gateway.config_values import (
    ConfigError,
    default_devices,
    parse_devices,
    parse_lora,
    parse_lora_bases,
    parse_queue_bounds,
)
from gateway.config_values import is_number as _is_number
from gateway.config_values import require as _require
from gateway.fim import parse_fim_setting
from gateway.logs import LOG_FORMATS, LOG_LEVELS
from gateway.model_entries import ModelEntryError, parse_models
from gateway.speculation import parse_setting
from gateway.tenants import TenantsConfig, load_tenants
from gateway.tools.formats import parse_tool_parser_setting
from gateway.transport import CorsSettings, TlsSettings, TransportError
from models.variants import parse_group_sizes
from scheduler import factory
from scheduler.config import PROVISIONING

DTYPES = ("bfloat16", "float32")
POLICIES = ("slice", "fcfs", "priority", "static")
KV_ADMISSIONS = ("on-demand", "full")


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """Which model to serve and how."""

    spec: str = "default"  # models.load spec: "default", a folder, or a hub id
    served_model_name: str | None = None  # the `model` clients send; None = derived from spec
    dtype: str = "bfloat16"
    max_model_len: int | None = None  # None = the model's own limit
    # sampling defaults for what requests omit: "auto" (the model folder's
    # generation_config.json, as vLLM), "none" (OpenAI's), or a folder holding one
    generation_config: str = "auto"
    # fill-in-the-middle tokens for `suffix` (gateway/fim.py): "auto" (a known set found in
    # the vocabulary), "none", a known set's name, or the three tokens (prefix, suffix, middle)
    fim: Any = "auto"
    # how tool calls are read from the output (gateway/tools/formats.py): "auto" (from the
    # chat template and vocabulary) or a format's name
    tool_parser: str = "auto"
    # LoRA adapters loaded at start-up: name -> PEFT folder (or a list of "NAME=PATH")
    lora: Any = field(default_factory=dict)
    # adapter -> the base model it runs on, for those of `lora` that name one (read from
    # `lora`'s `base_model_name`s, docs/lora.md)
    lora_bases: Any = field(default_factory=dict)
    lora_reserve_gib: float = 0.0  # kept on each device for adapters loaded at run time
    # several base models in one server (gateway/model_entries.py, docs/models.md); empty:
    # the one model of `spec`
    models: Any = ()
    # prompt-lookup speculative decoding (docs/speculation.md): vLLM's --speculative-config,
    # a JSON string or mapping, parsed to a `SpecConfig`; None = off
    speculative_config: Any = None
    # decoder layers per operator (None: the model's default split); or several sizes,
    # "2,10": operators of the largest, and variant chains of the others chosen per plan
    # (docs/granularity.md)
    layers_per_group: int | None = None
    layer_groups: Any = ()

    def __post_init__(self) -> None:
        _require(isinstance(self.lora_bases, Mapping) and all(
            isinstance(v, str) for v in self.lora_bases.values()), "model.lora_bases",
            "a mapping of adapter name: base model name")
        bases = {**self.lora_bases, **parse_lora_bases(self.lora)}
        object.__setattr__(self, "lora", parse_lora(self.lora))
        object.__setattr__(self, "lora_bases", {n: b for n, b in bases.items() if n in self.lora})
        try:
            object.__setattr__(self, "models", parse_models(self.models))
        except ModelEntryError as exc:
            raise ConfigError(f"model.models: {exc}") from None
        _require(not (self.models and self.served_model_name), "model.served_model_name",
                 "unset with model.models (each model's name is what clients send)")
        try:
            object.__setattr__(self, "speculative_config",
                               parse_setting(self.speculative_config))
        except ValueError as exc:
            raise ConfigError(f"model.speculative_config: {exc}") from None
        _require(_is_number(self.lora_reserve_gib) and self.lora_reserve_gib >= 0,
                 "model.lora_reserve_gib", "a non-negative number")
        try:
            object.__setattr__(self, "tool_parser", parse_tool_parser_setting(self.tool_parser))
        except ValueError as exc:
            raise ConfigError(f"model.tool_parser: {exc}") from None
        try:
            object.__setattr__(self, "fim", parse_fim_setting(self.fim))
        except ValueError as exc:
            raise ConfigError(f"model.fim: {exc}") from None
        _require(isinstance(self.spec, str) and bool(self.spec), "model.spec", "non-empty string")
        _require(isinstance(self.generation_config, str) and bool(self.generation_config),
                 "model.generation_config", "'auto', 'none' or a folder")
        _require(self.dtype in DTYPES, "model.dtype", f"one of {', '.join(DTYPES)}")
        # NOTE: 2 at least: a prompt token and room for one more (gateway/context.py caps it
        # further to what one device's KV holds)
        _require(self.max_model_len is None or (isinstance(self.max_model_len, int)
                                                and self.max_model_len >= 2),
                 "model.max_model_len", "an integer >= 2")
        self._check_groups()

    def _check_groups(self) -> None:
        """`layers_per_group` and `layer_groups` (parsed, largest first): docs/granularity.md."""
        _require(self.layers_per_group is None or (isinstance(self.layers_per_group, int)
                                                    and not isinstance(self.layers_per_group,
                                                                       bool)
                                                    and self.layers_per_group >= 1),
                 "model.layers_per_group", "an integer >= 1")
        if self.layer_groups in ((), None, ""):
            object.__setattr__(self, "layer_groups", ())
            return
        try:
            object.__setattr__(self, "layer_groups", parse_group_sizes(self.layer_groups))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"model.layer_groups: {exc}") from None
        _require(self.layers_per_group is None, "model.layers_per_group",
                 "unset with model.layer_groups (its largest size is the chain's)")
        _require(not self.models, "model.layer_groups", "needs a one-model server")


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """Where and how requests run."""

    devices: tuple[str, ...] = field(default_factory=default_devices)
    device_memory_gib: float | None = None  # per-device budget; None = what the device has
    # intra-op threads of each CPU device; None = the cores split between the CPU devices
    cpu_threads: int | None = None
    policy: str = "slice"
    kv_cache_gib: float | None = None  # KV pool per device; None = what the budget leaves
    swap_space_gib: float = 4.0  # host memory for preempted requests' KV (0: recompute)
    kv_admission: str = "on-demand"  # or "full": reserve prompt + max_tokens at admission
    prefix_cache: bool = True  # share cached KV blocks of equal prompt prefixes
    reprofile: bool = True  # time drifted ops again in the background (scheduler/cost/reprofile)
    wide_prefill: bool = True  # long interactive prompts may borrow another CPU device's cores
    # waiting-queue bounds (scheduler/core/admission.py): N (each class and the total) or
    # "high=N,normal=N,low=N,total=N" (any of them); None = the scheduler's defaults
    max_queued_requests: Any = None
    max_queued_tokens: Any = None  # prompt tokens, same forms
    max_low_wait_s: float | None = None  # age low requests into normal after this wait
    fault_rate: float = 0.0  # testing only: fraction of compute ops made to fail
    ray_address: str | None = None  # a Ray cluster (or "auto"): devices are NODE/cpu:N, ...
    provisioning: str = "off"  # or "opscale" (operator replicas), "model" (whole replicas)
    provision_interval_s: float = 1.0  # how often `opscale` re-plans
    # prefill tokens in one plan (a longer prompt runs in chunks of it); None: the scheduler's
    # default (2048). vLLM's --max-num-batched-tokens (docs/granularity.md)
    max_batch_tokens: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", parse_devices(self.devices))
        remote = [d for d in self.devices if "/" in d or d == factory.RAY_ALL]
        _require(self.ray_address is None or (isinstance(self.ray_address, str)
                                              and bool(self.ray_address)),
                 "scheduler.ray_address", "a Ray address or 'auto'")
        _require(self.ray_address is not None or not remote, "scheduler.devices",
                 f"{remote[0] if remote else ''} is on a Ray cluster: give --ray-address")
        _require(self.ray_address is None or len(remote) == len(self.devices),
                 "scheduler.devices", "with a Ray cluster every device is NODE/cpu:N, "
                 "NODE/cuda:N or ray:all")
        for key in ("max_queued_requests", "max_queued_tokens"):
            object.__setattr__(self, key, parse_queue_bounds(getattr(self, key),
                                                             f"scheduler.{key}"))
        _require(self.max_low_wait_s is None or (_is_number(self.max_low_wait_s)
                                                 and self.max_low_wait_s > 0),
                 "scheduler.max_low_wait_s", "a positive number of seconds")
        _require(_is_number(self.fault_rate) and 0 <= self.fault_rate <= 1,
                 "scheduler.fault_rate", "a number in [0, 1]")
        _require(self.policy in POLICIES, "scheduler.policy", f"one of {', '.join(POLICIES)}")
        _require(self.cpu_threads is None or (isinstance(self.cpu_threads, int)
                                              and not isinstance(self.cpu_threads, bool)
                                              and self.cpu_threads >= 1),
                 "scheduler.cpu_threads", "a positive integer")
        for key, zero_ok in (("device_memory_gib", False), ("kv_cache_gib", False),
                             ("swap_space_gib", True)):
            gib = getattr(self, key)
            _require(gib is None or (isinstance(gib, int | float) and not isinstance(gib, bool)
                                     and (gib >= 0 if zero_ok else gib > 0)),
                     f"scheduler.{key}", "a non-negative number" if zero_ok else
                     "a positive number")
        _require(self.kv_admission in KV_ADMISSIONS, "scheduler.kv_admission",
                 f"one of {', '.join(KV_ADMISSIONS)}")
        _require(isinstance(self.prefix_cache, bool), "scheduler.prefix_cache", "true or false")
        _require(isinstance(self.reprofile, bool), "scheduler.reprofile", "true or false")
        _require(isinstance(self.wide_prefill, bool), "scheduler.wide_prefill", "true or false")
        _require(self.provisioning in PROVISIONING, "scheduler.provisioning",
                 f"one of {', '.join(PROVISIONING)}")
        _require(isinstance(self.provision_interval_s, int | float)
                 and not isinstance(self.provision_interval_s, bool)
                 and self.provision_interval_s > 0, "scheduler.provision_interval_s",
                 "a positive number")
        _require(self.max_batch_tokens is None or (isinstance(self.max_batch_tokens, int)
                                                    and not isinstance(self.max_batch_tokens,
                                                                       bool)
                                                    and self.max_batch_tokens >= 16),
                 "scheduler.max_batch_tokens", "an integer >= 16")


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """HTTP server and per-request limits."""

    host: str = "127.0.0.1"
    port: int = 8000
    drain_timeout_s: float = 30.0  # SIGTERM: how long in-flight requests may finish
    request_timeout_s: float = 600.0  # total deadline of one request, from arrival
    max_prompts_per_request: int = 64  # completions: a list of prompts -> one choice each
    max_body_bytes: int = 8 << 20  # larger request bodies get 413
    log_level: str = "info"
    # OTLP endpoint request spans are exported to (gateway/tracing/); None = tracing off
    otlp_traces_endpoint: str | None = None
    log_format: str = "text"  # or "json": one object per line (gateway/logs.py)

    def __post_init__(self) -> None:
        _require(self.log_level in LOG_LEVELS, "server.log_level",
                 f"one of {', '.join(LOG_LEVELS)}")
        _require(self.log_format in LOG_FORMATS, "server.log_format",
                 f"one of {', '.join(LOG_FORMATS)}")
        _require(isinstance(self.port, int) and 0 <= self.port <= 65535, "server.port",
                 "an integer in [0, 65535]")
        _require(self.otlp_traces_endpoint is None or (isinstance(self.otlp_traces_endpoint, str)
                                                       and bool(self.otlp_traces_endpoint)),
                 "server.otlp_traces_endpoint", "an OTLP endpoint URL")
        for key in ("drain_timeout_s", "request_timeout_s"):
            value = getattr(self, key)
            _require(isinstance(value, int | float) and not isinstance(value, bool) and value > 0,
                     f"server.{key}", "a positive number of seconds")
        for key in ("max_prompts_per_request", "max_body_bytes"):
            value = getattr(self, key)
            _require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                     f"server.{key}", "a positive integer")


def default_data_dir() -> str:
    """`$SLICEGATE_DATA_DIR`, else slicegate's folder in the user data dir."""
    return os.environ.get("SLICEGATE_DATA_DIR") or platformdirs.user_data_dir("slicegate")


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """The Batch API: where files and batch state live, upload limits, how lines are fed."""

    data_dir: str | None = None  # None = default_data_dir(), resolved when the app starts
    max_file_bytes: int = 100 << 20  # a larger upload gets 413
    max_file_lines: int = 50_000  # requests per input file, as OpenAI's limit
    max_in_flight: int = 32  # batch lines submitted and unfinished, over all batches
    max_waiting: int = 2  # of those, lines not yet started (no first token): feeding pauses

    def __post_init__(self) -> None:
        _require(self.data_dir is None or (isinstance(self.data_dir, str) and bool(self.data_dir)),
                 "batch.data_dir", "a non-empty path")
        for key in ("max_file_bytes", "max_file_lines", "max_in_flight", "max_waiting"):
            value = getattr(self, key)
            _require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                     f"batch.{key}", "a positive integer")

    @property
    def resolved_data_dir(self) -> str:
        return self.data_dir or default_data_dir()


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything `create_app` and `serve` need, validated once."""

    model: ModelSettings = field(default_factory=ModelSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    batch: BatchSettings = field(default_factory=BatchSettings)
    tenants: TenantsConfig = field(default_factory=TenantsConfig)
    tenants_file: str | None = None  # where `tenants` came from, for messages
    cors: CorsSettings = field(default_factory=CorsSettings)  # gateway/transport.py
    tls: TlsSettings = field(default_factory=TlsSettings)

    @property
    def served_model_name(self) -> str:
        if self.model.models:  # NOTE: several models: the first's name (docs/models.md)
            return self.model.models[0].name
        return self.model.served_model_name or self.model.spec


_SECTIONS = {"model": ModelSettings, "scheduler": SchedulerSettings, "server": ServerSettings,
             "batch": BatchSettings, "cors": CorsSettings, "tls": TlsSettings}


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML (.yaml/.yml) or TOML (.toml) config file as a dict."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (OSError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections")
    return data


def load_config(path: str | Path | None = None,
                overrides: Mapping[str, Any] | None = None) -> GatewayConfig:
    """Defaults < file at `path` < `overrides` (keys `section.field` or `tenants_file`)."""
    data = read_config_file(path) if path is not None else {}
    unknown = set(data) - {*_SECTIONS, "tenants_file"}
    if unknown:
        raise ConfigError(f"unknown config key(s): {', '.join(sorted(unknown))}")
    values: dict[str, dict[str, Any]] = {}
    for name, cls in _SECTIONS.items():
        section = data.get(name) or {}
        if not isinstance(section, dict):
            raise ConfigError(f"{name}: expected a mapping")
        known = {f.name for f in dataclasses.fields(cls)}
        bad = set(section) - known
        if bad:
            raise ConfigError(f"{name}: unknown key(s) {', '.join(sorted(bad))}")
        values[name] = dict(section)
    tenants_file = data.get("tenants_file")
    for key, value in (overrides or {}).items():
        if key == "tenants_file":
            tenants_file = value
        else:
            section, _, name = key.partition(".")
            values[section][name] = value
    return _build(values, tenants_file)


def _build(values: dict[str, dict[str, Any]], tenants_file: str | None) -> GatewayConfig:
    try:
        sections = {name: cls(**values[name]) for name, cls in _SECTIONS.items()}
    except (TypeError, TransportError) as exc:
        raise ConfigError(str(exc)) from None
    tenants = load_tenants(tenants_file) if tenants_file else TenantsConfig()
    return GatewayConfig(tenants=tenants, tenants_file=tenants_file, **sections)
