"""What the gateway serves: one model's tokenizer plus the scheduler that runs it."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from executors.types import Priority
from gateway.adapters import Adapters, NoAdapters, not_found
from gateway.cluster import ray_scheduler
from gateway.config import GatewayConfig, SchedulerSettings
from gateway.context import context_limit
from gateway.fim import Fim, resolve_fim
from gateway.lora import ModelAdapters, startup_adapters
from gateway.sampling_defaults import SamplingDefaults, load_sampling_defaults
from gateway.tools.formats import DEFAULT_FORMAT, KNOWN_FORMATS, CallFormat, resolve_format
from models.grammar import Grammars
from models.loader import load
from models.modelset import ModelSet, first_model, model_set
from models.spec_config import SpecConfig
from models.warmup import warm_limit, warm_rows
from scheduler.api import SchedulerAPI
from scheduler.config import SchedulerConfig
from scheduler.factory import build_scheduler, cpu_threads, local_executors, parse_devices
from scheduler.scheduler import Scheduler

if TYPE_CHECKING:
    from models import Model

logger = logging.getLogger("gateway")


@dataclass(frozen=True, slots=True)
class Engine:
    """A tokenizer and a `SchedulerAPI` for one served model.

    The gateway tokenizes, applies the chat template and detokenizes with
    `tokenizer`, and submits `scheduler.core.ieg.Request`s to `scheduler`.
    """

    tokenizer: PreTrainedTokenizerBase
    scheduler: SchedulerAPI
    served_model_name: str  # the `model` reported in responses and /v1/models
    max_model_len: int  # prompt + generated tokens, at most
    vocab_size: int  # prompt token ids must be below it
    eos_token_ids: tuple[int, ...] = ()  # end generation unless the request sets ignore_eos
    model_aliases: tuple[str, ...] = ()  # other `model` values accepted for this model
    sampling_defaults: SamplingDefaults = SamplingDefaults()  # for what requests omit
    fim: Fim | None = None  # fill-in-the-middle tokens; None: `suffix` is refused
    grammars: Grammars | None = None  # structured output; None: its fields are refused
    tool_format: CallFormat = KNOWN_FORMATS[DEFAULT_FORMAT]  # how its tool calls are read
    prefix_caching: bool = True  # the scheduler's; `n` choices then share one prefill
    context_note: str = ""  # why max_model_len is below the model's, for the 400s naming it
    created: int = field(default_factory=lambda: int(time.time()))  # unix s, for /v1/models
    adapters: Adapters = field(default_factory=Adapters)  # LoRA adapters, by name (mutable)
    root: str = ""  # where the weights came from (/v1/models `root`, as vLLM's)
    # the other base models one scheduler serves beside `served_model_name` (docs/models.md)
    base_models: tuple[str, ...] = ()
    speculative: SpecConfig | None = None  # the server's prompt-lookup drafting; None = off
    # base model (of `base_models`) -> its own engine: its tokenizer, chat template, vocab,
    # EOS ids, FIM tokens, grammars, tool format and context (docs/models.md)
    members: Mapping[str, Engine] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        if self.vocab_size < 1:
            raise ValueError("vocab_size must be >= 1")

    def serves(self, model: str | None) -> bool:
        """Whether a request's `model` names this model or another base model the scheduler
        serves (None: the client did not say)."""
        return (model is None or model == self.served_model_name or model in self.model_aliases
                or model in self.base_models)

    def of(self, base: str) -> Engine:
        """The engine of base model `base` (a `Target.base`; "": the first model, this one)."""
        return self.members.get(base, self) if base else self

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))


def check_model(engine: Engine, model: str | None, adapters: bool = True) -> None:
    """404 `model_not_found` unless a request's `model` names the served model (or is None)
    or, with `adapters`, one of its LoRA adapters."""
    if not engine.serves(model) and not (adapters and model in engine.adapters):
        raise not_found(model)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The transformers tokenizer of a local model folder (no network)."""
    tokenizer: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return tokenizer


def eos_ids(tokenizer: PreTrainedTokenizerBase, *more: int) -> tuple[int, ...]:
    """The tokenizer's EOS id plus `more` (e.g. the model config's), deduplicated."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return tuple(dict.fromkeys(int(i) for i in [*ids, *more]))


def base_names(model: Model, config: GatewayConfig) -> tuple[str, ...]:
    """The `model` values that name the base model: its served name, then its aliases."""
    if config.model.models:  # NOTE: several models answer to their names only
        return (config.served_model_name,)
    names = (config.served_model_name, model.name, config.model.spec)
    return tuple(dict.fromkeys(names))


def adapter_bases(model: Model, config: GatewayConfig) -> dict[str, tuple[str, ...]]:
    """The base models adapters may run on (a `Target.base`: "" for the first) -> the names
    that identify each: its served names first, then its spec (gateway/lora.py)."""
    if not config.model.models:
        return {"": (*base_names(model, config), str(model.path))}
    return {("" if i == 0 else e.name): (e.name, e.spec)
            for i, e in enumerate(config.model.models)}


def engine_for_model(model: Model, scheduler: SchedulerAPI, config: GatewayConfig,
                     adapters: Adapters | None = None) -> Engine:
    """An Engine over a loaded `models.Model` and the scheduler that runs it.

    Reads `model.path` (tokenizer files, generation_config.json), `model.name`,
    `model.config.vocab_size`, `model.config.max_position_embeddings` and
    `model.config.eos_token_ids`.
    """
    tokenizer = load_tokenizer(model.path)
    defaults = load_sampling_defaults(config.model.generation_config, model.path)
    logger.info("sampling defaults for what requests omit: %s%s", defaults.describe(),
                "; --generation-config none turns them off" if defaults.as_dict() else "")
    limit = model.config.max_position_embeddings
    max_model_len = min(config.model.max_model_len or limit, limit)
    fim = resolve_fim(tokenizer, config.model.fim, model.config.vocab_size)
    logger.info("fill-in-the-middle (suffix): %s", f"{fim.name} tokens {fim.tokens}" if fim
                else "off (no known FIM tokens, or model.fim: none)")
    tool_format = resolve_format(tokenizer, config.model.tool_parser, model.config.model_type)
    logger.info("tool calls: the %s parser", tool_format.name)
    return Engine(
        tokenizer=tokenizer,
        scheduler=scheduler,
        served_model_name=config.served_model_name,
        max_model_len=max_model_len,
        vocab_size=model.config.vocab_size,
        eos_token_ids=eos_ids(tokenizer, *model.config.eos_token_ids),
        model_aliases=base_names(model, config)[1:],
        sampling_defaults=defaults,
        fim=fim,
        grammars=Grammars(tokenizer, model.config.vocab_size),
        tool_format=tool_format,
        prefix_caching=config.scheduler.prefix_cache,
        adapters=adapters or Adapters(reserved=base_names(model, config)),
        root=str(model.path),
        speculative=config.model.speculative_config,
    )


CPU_DEVICE_MEMORY_GIB = 2.0  # default budget of a virtual CPU device


def device_memory_gib(config: GatewayConfig) -> float:
    """The configured per-device budget, else 90% of the first GPU, else the CPU default."""
    if config.scheduler.device_memory_gib is not None:
        return config.scheduler.device_memory_gib
    first = config.scheduler.devices[0]
    if first.startswith("cuda"):
        return 0.9 * torch.cuda.get_device_properties(first).total_memory / 2**30
    return CPU_DEVICE_MEMORY_GIB


def scheduler_config(s: SchedulerSettings, max_model_len: int,
                     lora_reserve_gib: float = 0.0) -> SchedulerConfig:
    """The scheduler's settings from the gateway's (GiB to bytes)."""
    kv = None if s.kv_cache_gib is None else int(s.kv_cache_gib * 2**30)
    cfg = SchedulerConfig(policy=s.policy, max_model_len=max_model_len, kv_cache_bytes=kv,
                          swap_space_bytes=int(s.swap_space_gib * 2**30),
                          kv_admission=s.kv_admission, max_low_wait_s=s.max_low_wait_s,
                          prefix_caching=s.prefix_cache, reprofile=s.reprofile,
                          wide_prefill=s.wide_prefill,
                          provisioning=s.provisioning,
                          provision_interval_s=s.provision_interval_s,
                          lora_reserve_bytes=int(lora_reserve_gib * 2**30))
    if s.max_batch_tokens is not None:
        cfg = dataclasses.replace(cfg, max_batch_tokens=s.max_batch_tokens)
    return queue_bounds(cfg, s.max_queued_requests, s.max_queued_tokens)


def queue_bounds(cfg: SchedulerConfig, requests: dict[str, int] | None,
                 tokens: dict[str, int] | None) -> SchedulerConfig:
    """`cfg` with the waiting-queue bounds the gateway's settings override."""
    changes: dict[str, Any] = {}
    for bounds, per_class, total in ((requests, "queue_capacity", "queue_total_requests"),
                                     (tokens, "queue_token_capacity", "queue_total_tokens")):
        if bounds:
            base = dict(getattr(cfg, per_class))
            base.update({p: bounds[p.label] for p in Priority if p.label in bounds})
            changes[per_class] = base
            if "total" in bounds:
                changes[total] = bounds["total"]
    return dataclasses.replace(cfg, **changes) if changes else cfg


def build_engine(config: GatewayConfig) -> Engine:
    """Load `config.model` and its LoRA adapters, profile (or load cached) estimators, build
    the scheduler. AdapterStartupError for an adapter that cannot be served."""
    if config.scheduler.ray_address is not None:
        if config.model.models:
            raise ValueError("several models in one server are not supported on Ray "
                             "executors yet (docs/models.md)")
        if config.model.layer_groups:
            raise ValueError("--layer-groups is not supported on Ray executors yet "
                             "(docs/granularity.md)")
        model = load(config.model.spec, dtype=config.model.dtype, threads=cpu_threads(1),
                     layers_per_group=config.model.layers_per_group)
        # NOTE: the actors load their own models; adapters would not reach them
        adapters = startup_adapters(NoAdapters("LoRA adapters are not supported on Ray "
                                               "executors yet"), config.model.lora,
                                    base_names(model, config))
        cfg = scheduler_config(config.scheduler, _max_len(model, config))
        return _capped(model, ray_scheduler(model, config, cfg, device_memory_gib(config)),
                       config, adapters)
    if config.model.layer_groups and config.scheduler.provisioning != "off":
        raise ValueError("--layer-groups needs --provisioning off: replicas hold the chain's "
                         "operators only (docs/granularity.md)")
    devices = parse_devices(list(config.scheduler.devices), device_memory_gib(config))
    # NOTE: kernels are chosen and operators profiled for the intra-op threads the CPU
    # executors will run on
    threads = config.scheduler.cpu_threads or cpu_threads(sum(d.kind == "cpu" for d in devices))
    model = load_models(config, threads)
    # NOTE: before the scheduler, whose memory reserve for adapters counts those loaded
    host = ModelAdapters(model, adapter_bases(model, config))
    # NOTE: no adapter may take the name of any base model
    reserved = (*base_names(model, config), *(m.name for m in config.model.models[1:]))
    adapters = startup_adapters(host, config.model.lora, reserved, config.model.lora_bases)
    cfg = scheduler_config(config.scheduler, _max_len(model, config),
                           config.model.lora_reserve_gib)
    # NOTE: the warm-up runs before profiling, which it would slow
    warm = warm_rows(first_model(model), threads, warm_limit(cfg.max_batch_tokens)) \
        if any(d.kind == "cpu" for d in devices) else None
    factory = local_executors(threads, config.scheduler.fault_rate, warm)
    sched = build_scheduler(model, devices, cfg, executor_factory=factory, threads=threads)
    host.watch(sched)
    return _capped(model, sched, config, adapters)


def _capped(model: Model, sched: Scheduler, config: GatewayConfig,
            adapters: Adapters) -> Engine:
    """The engine over `sched`, each base model's context capped to what one device's KV
    pool of that model holds (gateway/context.py)."""
    s = config.scheduler
    memory = f"--device-memory-gib {device_memory_gib(config):g}" + (
        f" and --kv-cache-gib {s.kv_cache_gib:g}" if s.kv_cache_gib is not None else "")
    members = model.members if isinstance(model, ModelSet) else ()
    engine = _limited(engine_for_model(model, sched, config, adapters), "", sched, config,
                      memory)
    others = {m.name: _limited(dataclasses.replace(
        engine_for_model(m.model, sched, config, engine.adapters), served_model_name=m.name,
        model_aliases=()), m.name, sched, config, memory) for m in members[1:]}
    # NOTE: the scheduler's bound is the longest; each engine holds its model to its own
    sched.limit_context(max(e.max_model_len for e in (engine, *others.values())))
    return dataclasses.replace(engine, base_models=tuple(others), members=others)


def _limited(engine: Engine, name: str, sched: Scheduler, config: GatewayConfig,
             memory: str) -> Engine:
    if config.model.models:  # NOTE: each model's context is what its own KV pools hold
        memory += f" (model {engine.served_model_name!r}'s KV pool)"
    limit = context_limit(engine.max_model_len, config.model.max_model_len is not None,
                          sched.kv_fit_tokens_of(name), memory)
    return dataclasses.replace(engine, max_model_len=limit.max_model_len,
                               context_note=limit.note)


def load_models(config: GatewayConfig, threads: int) -> Model:
    """The model of `model.spec`, or the set of `model.models` (models/modelset.py), each
    member with its own tokenizer (`Engine.members`) and KV pools."""
    if not config.model.models:
        return load(config.model.spec, dtype=config.model.dtype, threads=threads,
                    layers_per_group=config.model.layers_per_group,
                    layer_groups=config.model.layer_groups)
    return model_set([(e.name, load(e.spec, dtype=e.dtype or config.model.dtype, threads=threads,
                                    layers_per_group=config.model.layers_per_group),
                       e.devices) for e in config.model.models],
                     {e.name: e.kv_share for e in config.model.models})


def _max_len(model: Model, config: GatewayConfig) -> int:
    models = [m.model for m in model.members] if isinstance(model, ModelSet) else [model]
    limit = max(m.config.max_position_embeddings for m in models)
    return min(config.model.max_model_len or limit, limit)
