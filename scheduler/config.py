"""Scheduler settings: one frozen tree, validated once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from executors.types import Priority

PROVISIONING = ("off", "opscale", "model")


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """Bounds on waiting work: per class (requests, prompt tokens), and over all classes."""

    max_requests: Mapping[Priority, int]
    max_tokens: Mapping[Priority, int]
    total_requests: int | None = None  # None: only the per-class bounds
    total_tokens: int | None = None

    def __post_init__(self) -> None:
        values = [*self.max_requests.values(), *self.max_tokens.values(),
                  *(v for v in (self.total_requests, self.total_tokens) if v is not None)]
        if any(v < 0 for v in values):
            raise ValueError("queue limits must be >= 0")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    policy: str = "slice"
    block_size: int = 16
    max_batch_tokens: int = 2048  # prefill tokens per plan
    max_decode_seqs: int = 64  # sequences per decode plan
    max_model_len: int = 2048
    # NOTE: admission by work (scheduler/core/admission.py): each class's waiting queue holds at
    # most this many requests and prompt tokens; all classes together at most the totals
    # (None: no total), beyond which a higher class evicts the newest of the lowest.
    queue_capacity: dict[Priority, int] = field(default_factory=lambda: {
        Priority.HIGH: 256, Priority.NORMAL: 256, Priority.LOW: 1024})
    queue_token_capacity: dict[Priority, int] = field(default_factory=lambda: {
        Priority.HIGH: 1 << 18, Priority.NORMAL: 1 << 18, Priority.LOW: 1 << 20})
    queue_total_requests: int | None = 1024
    queue_total_tokens: int | None = 1 << 20
    # a low request waiting longer than this is aged into the normal class (None: never)
    max_low_wait_s: float | None = None
    # NOTE: a low-priority op may delay a high-priority one by one operator; its prefill
    # chunk is sized so that one layer group takes at most this fraction of the tightest SLO.
    lp_op_slo_fraction: float = 0.1
    min_lp_chunk_tokens: int = 16
    default_ttft_slo_s: float = 1.0  # sizes low-priority chunks until a request sets one
    timeline_size: int = 20000  # op executions kept for /admin/timeline
    # NOTE: admission leaves this fraction of each device's KV blocks free, for the running
    # requests' next tokens (vLLM's watermark); decode steps grow KV block by block.
    kv_watermark: float = 0.01
    swap_space_bytes: int = 4 << 30  # host memory for preempted requests' KV (else recompute)
    kv_cache_bytes: int | None = None  # KV pool per device; None: what the budget leaves
    # kept on every device for LoRA adapters added at run time (`models.lora`), before KV;
    # adapters loaded before start-up take this much or their own size, whichever is larger
    lora_reserve_bytes: int = 0
    # "on-demand": admission reserves a request's tokens so far and decode grows it;
    # "full": the old rule, prompt + max_tokens reserved at admission (kept to compare)
    kv_admission: str = "on-demand"
    # full KV blocks stay cached by a hash of their prefix and are shared between requests
    # (vLLM's automatic prefix caching); False: every prompt is computed in full
    prefix_caching: bool = True
    # a device kind whose ops drift from their profile is timed again in the background
    # (scheduler/cost/reprofile.py); False: the online refit alone follows the drift
    reprofile: bool = True
    # a long interactive prompt may run its chain on one device with the cores of another
    # of its host lent to it (`executors.wide`); False: one device's threads per op
    wide_prefill: bool = True
    max_op_attempts: int = 2  # an op that fails is retried once, then its requests fail
    # NOTE: rounds that raise outside any request's decision are retried with a backoff;
    # after this many in a row, the requests not in flight end with a server error.
    max_failed_rounds: int = 3
    # operator-level provisioning (scheduler/provisioning/planning.py): "off" (every device
    # holds every operator), "opscale" (replicas of single operators sized by queueing every
    # `provision_interval_s`) or "model" (whole-model replicas every `model_interval_s`)
    provisioning: str = "off"
    provision_interval_s: float = 1.0
    model_interval_s: float = 20.0

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.max_batch_tokens < 1 or self.max_decode_seqs < 1:
            raise ValueError("block_size, max_batch_tokens and max_decode_seqs must be >= 1")
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        if not 0 < self.lp_op_slo_fraction <= 1:
            raise ValueError("lp_op_slo_fraction must be in (0, 1]")
        if self.kv_admission not in ("on-demand", "full"):
            raise ValueError("kv_admission must be 'on-demand' or 'full'")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise ValueError("kv_cache_bytes must be > 0")
        if self.lora_reserve_bytes < 0:
            raise ValueError("lora_reserve_bytes must be >= 0")
        if not 0 <= self.kv_watermark < 1 or self.swap_space_bytes < 0:
            raise ValueError("kv_watermark must be in [0, 1) and swap_space_bytes >= 0")
        if self.provisioning not in PROVISIONING:
            raise ValueError(f"provisioning must be one of {', '.join(PROVISIONING)}")
        if self.provision_interval_s <= 0 or self.model_interval_s <= 0:
            raise ValueError("provision_interval_s and model_interval_s must be > 0")
        if self.max_low_wait_s is not None and self.max_low_wait_s <= 0:
            raise ValueError("max_low_wait_s must be > 0 (or None: no ageing)")
        _ = self.queue_limits  # validates the bounds

    @property
    def queue_limits(self) -> QueueLimits:
        return QueueLimits(self.queue_capacity, self.queue_token_capacity,
                           self.queue_total_requests, self.queue_total_tokens)
