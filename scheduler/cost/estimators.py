"""Cost estimators: op time as a linear model on shape features, transfers as α·bytes + c.

One `LinearEstimator` (scheduler/cost/linear.py) per (device kind, template op name)
and per (source, destination) of a transfer: fitted on relative error at
start-up, refined online by a robust windowed refit. Every observed timing first
scores the prediction made before it, so `mape()` is a running out-of-sample
error. Device kind: `cpu` for every `cpu:N`, the GPU's name for `cuda:N` (all
CPU devices share one estimator per op).

Estimates are solo times. Where the profile measured `interference` (devices
sharing a host slow each other down), the simulator applies it, and a measured
op is first brought back to its solo time from what ran beside it
(scheduler/cost/overlap.py); the slowdowns themselves are refined from those same ops
(scheduler/cost/colearn.py) and handed to `on_interference`. When an estimator's
measured/base level drifts past `DRIFT_THRESHOLD` over a full window, and the
drift moves its median time by `DRIFT_MIN_S` or more (scheduler/cost/drift.py), its
device kind (or transfer pair) is handed out for a background re-profile
(scheduler/cost/reprofile.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from executors.interference import Interference
from executors.types import Device, OpInstance, OpRole, OpState
from models.batch import BatchShape
from scheduler.cost.colearn import ColocationLearner
from scheduler.cost.drift import DriftWatch
from scheduler.cost.features import (
    OP_FEATURES,
    OP_SCALE,
    XFER_SCALE,
    device_kind,
    group_size,
    op_features,
    op_mask,
    runs_native,
)
from scheduler.cost.learnlog import LearningLog
from scheduler.cost.linear import MIN_TIME_S, LinearEstimator
from scheduler.cost.overlap import Overlaps, Resolved

# NOTE: a transfer between devices that were never profiled together is priced as bytes
# over a bandwidth (a measured host copy bandwidth divided by this margin, else the default)
# plus a fixed cost, until the pair is profiled in the background.
FALLBACK_MARGIN = 4.0
FALLBACK_BANDWIDTH_BYTES_S = 1e9
FALLBACK_XFER_CONST_S = 1e-4
logger = logging.getLogger(__name__)
FORMAT_VERSION = 4


class Estimators:
    """Every estimator of a deployment: ops per (device kind, op name), transfers per pair.

    `op_time` / `transfer_time` are the simulator's hot path (a dict lookup and one
    dot product). `observe(op)` feeds measured `(start, end)` back: it scores the
    prediction, then refits unless `freeze()` was called.
    """

    def __init__(self, kinds: dict[str, str] | None = None, window: int = 64,
                 refit_every: int = 16) -> None:
        self.ops: dict[tuple[str, str], LinearEstimator] = {}  # (kind, op name)
        self.transfers: dict[tuple[str, str], LinearEstimator] = {}  # (src, dst) device or kind
        self.meta: dict[str, Any] = {}  # what the fit was made for (profiling's cache key)
        self.frozen = False
        self.window, self.refit_every = window, refit_every
        self._kinds = dict(kinds or {})  # device name -> kind (overrides, and a cache)
        self._op_cache: dict[tuple[str, str], LinearEstimator] = {}  # (device, op name)
        self._xfer_cache: dict[tuple[str, str], LinearEstimator] = {}  # (src, dst) devices
        self.copy_bandwidth_bytes_s: float | None = None  # measured at profiling, if it was
        # op name -> coefficients over OP_FEATURES for a kind never profiled (the factory
        # derives them from the template's FLOPs and bytes)
        self.fallback_op: Callable[[str], tuple[float, ...]] | None = None
        self.missing_ops: set[tuple[str, str]] = set()  # (kind, op name) priced by fallback
        self.missing_pairs: set[tuple[str, str]] = set()  # (src, dst) priced by fallback
        self._to_profile: list[tuple[str, str]] = []  # pairs not yet handed out to profile
        self.interference: Interference | None = None  # co-location slowdowns, if profiled
        self._overlaps: Overlaps | None = None
        # what the learners changed, summarised at INFO once a period (scheduler.cost.learnlog)
        self.learning = LearningLog()
        self.learning.count("estimator refits", self.num_refits)
        self.colearn = ColocationLearner(learning=self.learning)
        self.learn_colocation = True  # False: keep the profile's slowdowns (an A/B bench)
        # called with the slowdowns once they were learnt anew (the factory wires the GMG)
        self.on_interference: Callable[[Interference], None] | None = None
        self.drift = DriftWatch()
        # called with a device kind whose ops drifted (the factory wires the re-profiler)
        self.on_drift: Callable[[str], None] | None = None
        self.cache_file: Path | None = None  # the start-up fit's cache (re-profiles update it)
        self.native_rows = 1  # rows the native GEMV takes (fit_kind sets it): see OP_FEATURES
        # a wide op's time over its time on one device's threads (`executors.wide`), as the
        # profile measured it; None where not measured (fewer than two CPU devices here)
        self.wide_factor: float | None = None

    # -- the simulator's hot path --------------------------------------------------------
    def op_time(self, device: Device | str, op_name: str, shape: BatchShape) -> float:
        """Predicted solo seconds of template op `op_name` for a batch of `shape` on `device`."""
        name = device if isinstance(device, str) else device.name
        est = self._op_cache.get((name, op_name))
        if est is None:
            est = self._op_cache[(name, op_name)] = self._resolve_op(name, op_name)
        c = est.coef
        t = (c[0] * shape.num_tokens + c[1] * shape.attn_work + c[2] * shape.num_seqs
             + c[3] * shape.num_sampled + c[4] * shape.num_context_tokens + c[7])
        if runs_native(shape, self.native_rows):
            t += c[5] * (shape.num_tokens - 1)
        else:
            t += c[6]
        return t if t > MIN_TIME_S else MIN_TIME_S

    def transfer_time(self, src: str, dst: str, num_bytes: int) -> float:
        """Predicted seconds to move `num_bytes` from device `src` to device `dst` (a SEND)."""
        est = self._xfer_cache.get((src, dst))
        if est is None:
            est = self._xfer_cache[(src, dst)] = self._resolve_xfer(src, dst)
        c = est.coef
        t = c[0] * num_bytes + c[1]
        return t if t > MIN_TIME_S else MIN_TIME_S

    def estimate(self, op: OpInstance) -> float:
        """`est_s` for an op instance: its template op, or its transfer (a RECV is ~free)."""
        if op.role is OpRole.COMPUTE:
            return self.op_time(op.device, op.name, op.shape)
        if op.role is OpRole.SEND and op.peer is not None:
            return self.transfer_time(op.device, op.peer.device, op.transfer_bytes)
        return MIN_TIME_S

    # -- learning ------------------------------------------------------------------------
    def observe(self, op: OpInstance) -> float | None:
        """Learn from a DONE op's measured `(start, end)`; returns the prediction's APE.

        Compute ops refit (device kind, op name); a SEND refits its (src, dst) pair.
        RECVs and unfinished or failed ops are ignored (None). On a host that devices
        share, the op is learnt (as its solo time) once what ran beside it is known, maybe
        at a later call: then this returns None.
        """
        if op.state is not OpState.DONE or op.start is None or op.end is None:
            return None
        if op.role is OpRole.RECV or (op.role is OpRole.SEND and op.peer is None):
            return None
        if op.role is OpRole.HOLD or op.wide is not None:
            # NOTE: a wide op ran on two devices' threads, not as its op on one: its time
            # is not its estimator's to learn (a hold's is that of its chain)
            return None
        ov = self._overlaps
        if ov is None or not ov.shares(op.device):
            return self._learn(op, op.end - op.start)
        ape = None
        for r in ov.add(op.device, op.name, op.start, op.end, op):
            a = self._learn_resolved(r)
            ape = a if r.item is op else ape
        return ape

    def flush(self, now: float) -> None:
        """Learn the ops on shared hosts still waiting for what ran beside them, if they
        ended `Overlaps.settle_s` before `now` (the scheduler's clock): the other devices
        were idle since."""
        if self._overlaps is not None:
            for r in self._overlaps.flush(now):
                self._learn_resolved(r)

    def _learn_resolved(self, r: Resolved) -> float:
        op: OpInstance = r.item  # type: ignore[assignment]
        if not self.frozen and self.learn_colocation and op.role is OpRole.COMPUTE:
            self._colearn(op, r)
        return self._learn(op, r.solo_s)

    def _colearn(self, op: OpInstance, r: Resolved) -> None:
        """Teach the co-location learner `op`, with the solo time the profile predicts (not
        the online fit, which learns from times these slowdowns converted)."""
        assert op.start is not None and op.end is not None
        try:
            est = self._op_cache.get((op.device, op.name)) or self._resolve_op(op.device,
                                                                                op.name)
        except KeyError:  # never profiled, no fallback: nothing to compare with yet
            return
        predicted = est.predict_base(op_features(op.shape, self.native_rows))
        self.colearn.add(r.cls, op.end - op.start, predicted, r.overlap_s, op.cpu_s)
        if self.colearn.due():
            self._relearn_interference()

    def _relearn_interference(self) -> None:
        assert self.interference is not None and self._overlaps is not None
        inter = self.colearn.relearn(self.interference)
        if inter is not None:
            self.interference = self._overlaps.inter = inter
            if self.on_interference is not None:
                self.on_interference(inter)

    def _learn(self, op: OpInstance, seconds: float) -> float:
        if op.role is OpRole.COMPUTE:
            return self.observe_op(op.device, op.name, op.shape, seconds, op.end)
        assert op.peer is not None
        return self.observe_transfer(op.device, op.peer.device, op.transfer_bytes, seconds,
                                     op.end)

    def observe_op(self, device: Device | str, op_name: str, shape: BatchShape,
                   seconds: float, at: float | None = None) -> float:
        """Score and learn one solo time of `op_name` on `device`, measured at `at`."""
        name = device if isinstance(device, str) else device.name
        kind = self.kind_of(name)
        try:
            est = self._op_cache.get((name, op_name)) or self._resolve_op(name, op_name)
        except KeyError:  # never profiled, no fallback: learn from scratch
            est = self._new_op(kind, op_name)
        if (kind, op_name) not in self.ops:  # a fallback: learn from it onwards
            est = self.ops[(kind, op_name)] = est.clone(f"{kind}/{op_name}")
            self._op_cache.clear()
        ape = est.observe(op_features(shape, self.native_rows), seconds, learn=not self.frozen,
                          at=at)
        if self.drift.check(est, kind, at):
            logger.warning("%s drifted to %.2fx its profiled time: %s", est.name, est.level,
                           f"re-profiling {kind}" if self.on_drift is not None else
                           "re-profiling is off, the online refit follows it")
            if self.on_drift is not None:
                self.on_drift(kind)
        return ape

    def observe_transfer(self, src: str, dst: str, num_bytes: int, seconds: float,
                         at: float | None = None) -> float:
        key = (src, dst)
        est = self.transfers.get(key)
        if est is None:  # the first timing of this exact pair: from its kind pair or fallback
            base = self._resolve_xfer(src, dst)
            est = self.transfers[key] = base.clone(_xfer_name(*key))
            self._xfer_cache.pop(key, None)
        ape = est.observe((num_bytes, 1.0), seconds, learn=not self.frozen, at=at)
        if self.drift.check(est, key, at):
            logger.warning("%s drifted to %.2fx its profiled time: re-profiling it", est.name,
                           est.level)
            self._to_profile.append(key)
        return ape

    def fit_op(self, kind: str, op_name: str, shapes: Sequence[BatchShape],
               seconds: Sequence[float]) -> LinearEstimator:
        est = self._new_op(kind, op_name)
        est.fit([op_features(s, self.native_rows) for s in shapes], seconds)
        return est

    def fit_transfer(self, src: str, dst: str, num_bytes: Sequence[int],
                     seconds: Sequence[float]) -> LinearEstimator:
        """Fit `(src, dst)`; both may be device names or kinds (a kind pair is a fallback)."""
        est = self.transfers[(src, dst)] = LinearEstimator(
            _xfer_name(src, dst), (True, True), XFER_SCALE, self.window, self.refit_every)
        est.fit([(b, 1.0) for b in num_bytes], seconds)
        self._xfer_cache.clear()
        return est

    def rebase_kind(self, kind: str, fresh: Estimators, prefix: str = "") -> None:
        """Take the base fits of `kind`'s ops from a re-profile (`fresh`), keeping the
        observations; layer groups it did not time are scaled copies as usual. `prefix`:
        the re-profiled model's in a set (`NAME/`), before each of `fresh`'s op names."""
        for (k, name), est in fresh.ops.items():
            key = (k, prefix + name)
            if k == kind and key in self.ops:
                self.ops[key].rebase(est)
            elif k == kind:
                self.ops[key] = est.clone(f"{k}/{prefix}{name}") if prefix else est
        self._op_cache.clear()

    def take_models(self, parts: Sequence[tuple[str, Estimators]]) -> None:
        """Hold the op estimators of a model set's members (models/modelset.py) in place of
        this one's, each under its op names in the set (`NAME/layers[0:5]`)."""
        self.ops = {(kind, f"{name}/{op}"): e.clone(f"{kind}/{name}/{op}")
                    for name, est in parts for (kind, op), e in est.ops.items()}
        self._op_cache.clear()

    def set_interference(self, inter: Interference | None) -> None:
        """Use `inter` to bring measured times back to solo times (and save it with the fit)."""
        self.interference = inter
        self._overlaps = Overlaps(inter) if inter is not None else None
        self.colearn = ColocationLearner(learning=self.learning)

    def num_refits(self) -> int:
        """Refits from observations so far, over every op and transfer estimator."""
        return sum(e.num_refits for e in (*self.ops.values(), *self.transfers.values()))

    def freeze(self) -> None:
        """Stop refitting; observations still score predictions (held-out MAPE)."""
        self.frozen = True

    def unfreeze(self) -> None:
        self.frozen = False

    def mape(self) -> dict[str, float]:
        """Running MAPE (fraction) of each estimator that has scored predictions."""
        return {e.name: m for e in self._all() if (m := e.mape()) is not None}

    def sample_cov(self) -> dict[str, float]:
        """Run-to-run noise (CoV, fraction) each estimator's profiling sweep measured."""
        return {e.name: e.sample_cov for e in self._all() if e.sample_cov is not None}

    def levels(self) -> dict[str, float]:
        """Measured over profiled time (median of the window) of each estimator that has
        observations: 1.0 while the machine runs as profiled."""
        return {e.name: e.level for e in self._all() if e.level_n}

    def reset_errors(self) -> None:
        for est in self._all():
            est.errors.clear()

    def _all(self) -> list[LinearEstimator]:
        return [*self.ops.values(), *self.transfers.values()]

    # -- lookup --------------------------------------------------------------------------
    def kind_of(self, device: str) -> str:
        kind = self._kinds.get(device)
        if kind is None:
            kind = self._kinds[device] = device_kind(device)
        return kind

    def _new_op(self, kind: str, op_name: str) -> LinearEstimator:
        est = self.ops[(kind, op_name)] = LinearEstimator(
            f"{kind}/{op_name}", op_mask(op_name), OP_SCALE, self.window, self.refit_every)
        self._op_cache.clear()
        return est

    def _resolve_op(self, device: str, op_name: str) -> LinearEstimator:
        """The estimator of (kind, op); an unseen layer group starts as a copy of a seen
        one, scaled by its number of layers (all groups of one size cost the same). A kind
        never profiled gets the fallback cost model (see `fallback_op`)."""
        kind = self.kind_of(device)
        est = self.ops.get((kind, op_name))
        if est is not None:
            return est
        size = group_size(op_name)
        seen = [(group_size(n), e) for (k, n), e in self.ops.items()
                if k == kind and group_size(n) is not None]
        if size is None or not seen:
            return self._fallback_op(kind, device, op_name)
        base_size, base = min(seen, key=lambda s: (abs((s[0] or 0) - size), s[1].name))
        est = self.ops[(kind, op_name)] = base.clone(f"{kind}/{op_name}", size / (base_size or 1))
        return est

    def _fallback_op(self, kind: str, device: str, op_name: str) -> LinearEstimator:
        if self.fallback_op is None:
            raise KeyError(f"no estimator for {op_name!r} on {kind} ({device}) and no "
                           f"fallback cost model: profile this device kind first")
        if (kind, op_name) not in self.missing_ops:
            logger.warning("no estimator for %s on %s: using the FLOP/byte fallback", op_name,
                           kind)
            self.missing_ops.add((kind, op_name))
        return LinearEstimator.fixed(f"{kind}/{op_name} (fallback)", op_mask(op_name),
                                     OP_SCALE, self.fallback_op(op_name))

    def _fallback_xfer(self, src: str, dst: str) -> LinearEstimator:
        bandwidth = (self.copy_bandwidth_bytes_s / FALLBACK_MARGIN
                     if self.copy_bandwidth_bytes_s else FALLBACK_BANDWIDTH_BYTES_S)
        if (src, dst) not in self.missing_pairs:
            logger.warning("no transfer estimator for %s->%s: %.2f GB/s + %.0f us until it is "
                           "profiled", src, dst, bandwidth / 1e9, FALLBACK_XFER_CONST_S * 1e6)
            self.missing_pairs.add((src, dst))
            self._to_profile.append((src, dst))
        return LinearEstimator.fixed(_xfer_name(src, dst) + " (fallback)", (True, True),
                                     XFER_SCALE, (1 / bandwidth, FALLBACK_XFER_CONST_S))

    def take_pairs_to_profile(self) -> list[tuple[str, str]]:
        """Device pairs that fell back since the last call (each is handed out once)."""
        pairs, self._to_profile = self._to_profile, []
        return pairs

    def _resolve_xfer(self, src: str, dst: str) -> LinearEstimator:
        for key in ((src, dst), (self.kind_of(src), self.kind_of(dst))):
            if key in self.transfers:
                return self.transfers[key]
        return self._fallback_xfer(src, dst)

    # -- persistence ---------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({
            "version": FORMAT_VERSION, "op_features": OP_FEATURES, "meta": self.meta,
            "window": self.window, "refit_every": self.refit_every,
            "interference": self.interference.to_dict() if self.interference else None,
            "copy_bandwidth_bytes_s": self.copy_bandwidth_bytes_s,
            "native_rows": self.native_rows, "wide_factor": self.wide_factor,
            "ops": [{"kind": k, "op": n, **e.to_dict()} for (k, n), e in self.ops.items()],
            "transfers": [{"src": s, "dst": d, **e.to_dict()}
                          for (s, d), e in self.transfers.items()],
        })

    @classmethod
    def from_json(cls, text: str, kinds: dict[str, str] | None = None) -> Estimators:
        d = json.loads(text)
        if d.get("version") != FORMAT_VERSION or tuple(d["op_features"]) != OP_FEATURES:
            raise ValueError("estimators saved in another format; profile again")
        est = cls(kinds, d["window"], d["refit_every"])
        est.meta = d["meta"]
        if d["interference"] is not None:
            est.set_interference(Interference.from_dict(d["interference"]))
        est.copy_bandwidth_bytes_s = d.get("copy_bandwidth_bytes_s")
        est.native_rows = d["native_rows"]
        est.wide_factor = d.get("wide_factor")
        for o in d["ops"]:
            est.ops[(o["kind"], o["op"])] = LinearEstimator.from_dict(o)
        for t in d["transfers"]:
            est.transfers[(t["src"], t["dst"])] = LinearEstimator.from_dict(t)
        return est


def _xfer_name(src: str, dst: str) -> str:
    return f"transfer {src}->{dst}"
