"""Cost estimators: op time as a linear model on shape features, transfers as α·bytes + c.

One `LinearEstimator` per (device kind, template op name) and per (source,
destination) of a transfer. Each is fitted on relative error (a 1 ms op
counts as much as a 100 ms one) by least squares at start-up and refitted
online by recursive least squares with a forgetting factor. Every observed
timing first scores the prediction made before it, so `mape()` is a running
out-of-sample error. Device kind: `cpu` for every `cpu:N`, the GPU's name for
`cuda:N` (all CPU devices share one estimator per op).
"""

from __future__ import annotations

import json
import logging
import re
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from executors.types import Device, OpInstance, OpRole, OpState
from models.batch import BatchShape

# NOTE: num_context_tokens separates the KV read of batched decode (which pads to the
# longest context) from prefill attention; it halves the layer groups' error on CPU.
OP_FEATURES = ("num_tokens", "attn_work", "num_seqs", "num_sampled", "num_context_tokens",
               "const")
_OP_MASKS = {  # which features each kind of op uses (by op name)
    "embed": (True, False, False, False, False, True),
    "layers": (True, True, True, False, True, True),
    "head": (True, False, False, True, False, True),
}
_OP_SCALE = (1e3, 1e6, 1e2, 1e2, 1e4, 1.0)  # typical magnitudes, for a well-conditioned fit
XFER_FEATURES = ("num_bytes", "const")
_XFER_SCALE = (1e6, 1.0)
MIN_TIME_S = 1e-7  # floor of every prediction
# NOTE: a transfer between devices that were never profiled together is priced as bytes
# over a bandwidth (a measured host copy bandwidth divided by this margin, else the default)
# plus a fixed cost, until the pair is profiled in the background.
FALLBACK_MARGIN = 4.0
FALLBACK_BANDWIDTH_BYTES_S = 1e9
FALLBACK_XFER_CONST_S = 1e-4
logger = logging.getLogger(__name__)
_GROUP = re.compile(r"layers\[(\d+):(\d+)\]")
FORMAT_VERSION = 1


def op_features(s: BatchShape) -> tuple[float, ...]:
    return (s.num_tokens, s.attn_work, s.num_seqs, s.num_sampled, s.num_context_tokens, 1.0)


def op_mask(op_name: str) -> tuple[bool, ...]:
    kind = "layers" if _GROUP.fullmatch(op_name) else op_name
    if kind not in _OP_MASKS:
        raise KeyError(f"no feature set for op {op_name!r}")
    return _OP_MASKS[kind]


def group_size(op_name: str) -> int | None:
    m = _GROUP.fullmatch(op_name)
    return int(m.group(2)) - int(m.group(1)) if m else None


def device_kind(name: str) -> str:
    """`cpu` for `cpu:N`; the GPU's name for `cuda:N` (`cuda` when CUDA is absent)."""
    if name.startswith("cpu"):
        return "cpu"
    import torch  # NOTE: local so that reading estimators never initialises CUDA eagerly

    dev = Device(name, 1)
    if torch.cuda.is_available() and dev.index < torch.cuda.device_count():
        return torch.cuda.get_device_name(dev.index)
    return "cuda"


class LinearEstimator:
    """time ≈ coef · features, fitted on relative error; weighted RLS online.

    `coef` holds the coefficients in raw feature units (0 where a feature is unused),
    so a prediction is one dot product of plain floats.
    """

    def __init__(self, name: str, mask: Sequence[bool], scale: Sequence[float],
                 forget: float = 0.998, window: int = 500, p0: float = 1e4) -> None:
        self.name = name
        self.mask = tuple(mask)
        self.scale = tuple(scale)
        self.forget = forget
        self._cols = [i for i, m in enumerate(self.mask) if m]
        n = len(self._cols)
        self.theta = np.zeros(n)  # over the used features, scaled
        self.p = np.eye(n) * p0  # RLS inverse information matrix
        self.p0 = p0
        self.errors: deque[float] = deque(maxlen=window)
        self.num_obs = 0
        self.coef: tuple[float, ...] = (0.0,) * len(self.mask)

    def _x(self, raw: Sequence[float]) -> np.ndarray:
        return np.array([raw[i] / self.scale[i] for i in self._cols])

    def _publish(self) -> None:
        coef = [0.0] * len(self.mask)
        for j, i in enumerate(self._cols):
            coef[i] = float(self.theta[j]) / self.scale[i]
        self.coef = tuple(coef)

    def predict(self, raw: Sequence[float]) -> float:
        t = sum(c * x for c, x in zip(self.coef, raw, strict=True))
        return t if t > MIN_TIME_S else MIN_TIME_S

    def fit(self, xs: Sequence[Sequence[float]], ys: Sequence[float], ridge: float = 1e-9) -> None:
        """Batch fit (replaces the state); features whose coefficient would be negative
        are dropped one at a time, so the model stays monotone in every feature."""
        a = np.array([self._x(x) / y for x, y in zip(xs, ys, strict=True)])  # rows x/y
        keep = list(range(len(self._cols)))
        while True:
            sub = a[:, keep]
            info = sub.T @ sub + ridge * np.eye(len(keep))
            theta = np.linalg.solve(info, sub.T @ np.ones(len(a)))
            neg = [k for k, t in zip(keep, theta, strict=True) if t < 0]
            if not neg or len(keep) == 1:
                break
            keep.remove(min(neg, key=lambda k: theta[keep.index(k)]))
        self.theta = np.zeros(len(self._cols))
        self.theta[keep] = theta
        self.p = np.zeros((len(self._cols),) * 2)
        self.p[np.ix_(keep, keep)] = np.linalg.inv(info)
        self._publish()

    def observe(self, raw: Sequence[float], seconds: float, learn: bool = True) -> float:
        """Score the current prediction against `seconds`, then (if `learn`) refit."""
        ape = abs(self.predict(raw) - seconds) / max(seconds, MIN_TIME_S)
        self.errors.append(ape)
        self.num_obs += 1
        if learn and seconds > 0:
            self._rls(self._x(raw) / seconds)
        return ape

    def _rls(self, x: np.ndarray) -> None:
        # minimise sum of (theta·x/y - 1)^2 with forgetting: target is 1 for every sample
        px = self.p @ x
        gain = px / (self.forget + x @ px)
        self.theta = self.theta + gain * (1.0 - x @ self.theta)
        self.p = (self.p - np.outer(gain, px)) / self.forget
        if np.trace(self.p) > self.p0 * len(x):  # NOTE: bound wind-up on unexcited inputs
            self.p *= self.p0 * len(x) / np.trace(self.p)
        self._publish()

    def mape(self) -> float | None:
        return sum(self.errors) / len(self.errors) if self.errors else None

    @classmethod
    def fixed(cls, name: str, mask: Sequence[bool], scale: Sequence[float],
              coef: Sequence[float]) -> LinearEstimator:
        """An estimator with given coefficients (raw feature units); used for fallbacks."""
        e = cls(name, mask, scale)
        e.theta = np.array([coef[i] * scale[i] for i in e._cols])
        e._publish()
        return e

    def clone(self, name: str, factor: float = 1.0) -> LinearEstimator:
        """A copy under another name, coefficients times `factor`, with no error history."""
        c = LinearEstimator(name, self.mask, self.scale, self.forget, self.errors.maxlen or 500,
                            self.p0)
        c.theta, c.p = self.theta * factor, self.p.copy()
        c._publish()
        return c

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mask": self.mask, "scale": self.scale,
                "forget": self.forget, "p0": self.p0, "theta": self.theta.tolist(),
                "p": self.p.tolist(), "num_obs": self.num_obs, "errors": list(self.errors),
                "window": self.errors.maxlen}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LinearEstimator:
        e = cls(d["name"], d["mask"], d["scale"], d["forget"], d["window"], d["p0"])
        e.theta, e.p = np.array(d["theta"], dtype=float), np.array(d["p"], dtype=float)
        e.num_obs = d["num_obs"]
        e.errors.extend(d["errors"])
        e._publish()
        return e


class Estimators:
    """Every estimator of a deployment: ops per (device kind, op name), transfers per pair.

    `op_time` / `transfer_time` are the simulator's hot path (a dict lookup and one
    dot product). `observe(op)` feeds measured `(start, end)` back: it scores the
    prediction, then refits unless `freeze()` was called.
    """

    def __init__(self, kinds: dict[str, str] | None = None, forget: float = 0.998,
                 window: int = 500) -> None:
        self.ops: dict[tuple[str, str], LinearEstimator] = {}  # (kind, op name)
        self.transfers: dict[tuple[str, str], LinearEstimator] = {}  # (src, dst) device or kind
        self.meta: dict[str, Any] = {}  # what the fit was made for (profiling's cache key)
        self.frozen = False
        self.forget, self.window = forget, window
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

    # -- the simulator's hot path --------------------------------------------------------
    def op_time(self, device: Device | str, op_name: str, shape: BatchShape) -> float:
        """Predicted seconds of template op `op_name` for a batch of `shape` on `device`."""
        name = device if isinstance(device, str) else device.name
        est = self._op_cache.get((name, op_name))
        if est is None:
            est = self._op_cache[(name, op_name)] = self._resolve_op(name, op_name)
        c = est.coef
        t = (c[0] * shape.num_tokens + c[1] * shape.attn_work + c[2] * shape.num_seqs
             + c[3] * shape.num_sampled + c[4] * shape.num_context_tokens + c[5])
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
        RECVs and unfinished or failed ops are ignored (None).
        """
        if op.state is not OpState.DONE or op.start is None or op.end is None:
            return None
        seconds = op.end - op.start
        if op.role is OpRole.COMPUTE:
            return self.observe_op(op.device, op.name, op.shape, seconds)
        if op.role is OpRole.SEND and op.peer is not None:
            return self.observe_transfer(op.device, op.peer.device, op.transfer_bytes, seconds)
        return None

    def observe_op(self, device: Device | str, op_name: str, shape: BatchShape,
                   seconds: float) -> float:
        name = device if isinstance(device, str) else device.name
        kind = self.kind_of(name)
        try:
            est = self._op_cache.get((name, op_name)) or self._resolve_op(name, op_name)
        except KeyError:  # never profiled, no fallback: learn from scratch
            est = self._new_op(kind, op_name)
        if (kind, op_name) not in self.ops:  # a fallback: learn from it onwards
            est = self.ops[(kind, op_name)] = est.clone(f"{kind}/{op_name}")
            self._op_cache.clear()
        return est.observe(op_features(shape), seconds, learn=not self.frozen)

    def observe_transfer(self, src: str, dst: str, num_bytes: int, seconds: float) -> float:
        key = (src, dst)
        est = self.transfers.get(key)
        if est is None:  # the first timing of this exact pair: from its kind pair or fallback
            base = self._resolve_xfer(src, dst)
            est = self.transfers[key] = base.clone(_xfer_name(*key))
            self._xfer_cache.pop(key, None)
        return est.observe((num_bytes, 1.0), seconds, learn=not self.frozen)

    def fit_op(self, kind: str, op_name: str, shapes: Sequence[BatchShape],
               seconds: Sequence[float]) -> LinearEstimator:
        est = self._new_op(kind, op_name)
        est.fit([op_features(s) for s in shapes], seconds)
        return est

    def fit_transfer(self, src: str, dst: str, num_bytes: Sequence[int],
                     seconds: Sequence[float]) -> LinearEstimator:
        """Fit `(src, dst)`; both may be device names or kinds (a kind pair is a fallback)."""
        est = self.transfers[(src, dst)] = LinearEstimator(
            _xfer_name(src, dst), (True, True), _XFER_SCALE, self.forget, self.window)
        est.fit([(b, 1.0) for b in num_bytes], seconds)
        self._xfer_cache.clear()
        return est

    def freeze(self) -> None:
        """Stop refitting; observations still score predictions (held-out MAPE)."""
        self.frozen = True

    def unfreeze(self) -> None:
        self.frozen = False

    def mape(self) -> dict[str, float]:
        """Running MAPE (fraction) of each estimator that has scored predictions."""
        out = {}
        for est in [*self.ops.values(), *self.transfers.values()]:
            m = est.mape()
            if m is not None:
                out[est.name] = m
        return out

    def reset_errors(self) -> None:
        for est in [*self.ops.values(), *self.transfers.values()]:
            est.errors.clear()

    # -- lookup --------------------------------------------------------------------------
    def kind_of(self, device: str) -> str:
        kind = self._kinds.get(device)
        if kind is None:
            kind = self._kinds[device] = device_kind(device)
        return kind

    def _new_op(self, kind: str, op_name: str) -> LinearEstimator:
        est = self.ops[(kind, op_name)] = LinearEstimator(
            f"{kind}/{op_name}", op_mask(op_name), _OP_SCALE, self.forget, self.window)
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
                                     _OP_SCALE, self.fallback_op(op_name))

    def _fallback_xfer(self, src: str, dst: str) -> LinearEstimator:
        bandwidth = (self.copy_bandwidth_bytes_s / FALLBACK_MARGIN
                     if self.copy_bandwidth_bytes_s else FALLBACK_BANDWIDTH_BYTES_S)
        if (src, dst) not in self.missing_pairs:
            logger.warning("no transfer estimator for %s->%s: %.2f GB/s + %.0f us until it is "
                           "profiled", src, dst, bandwidth / 1e9, FALLBACK_XFER_CONST_S * 1e6)
            self.missing_pairs.add((src, dst))
            self._to_profile.append((src, dst))
        return LinearEstimator.fixed(_xfer_name(src, dst) + " (fallback)", (True, True),
                                     _XFER_SCALE, (1 / bandwidth, FALLBACK_XFER_CONST_S))

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
            "forget": self.forget, "window": self.window,
            "copy_bandwidth_bytes_s": self.copy_bandwidth_bytes_s,
            "ops": [{"kind": k, "op": n, **e.to_dict()} for (k, n), e in self.ops.items()],
            "transfers": [{"src": s, "dst": d, **e.to_dict()}
                          for (s, d), e in self.transfers.items()],
        })

    @classmethod
    def from_json(cls, text: str, kinds: dict[str, str] | None = None) -> Estimators:
        d = json.loads(text)
        if d.get("version") != FORMAT_VERSION or tuple(d["op_features"]) != OP_FEATURES:
            raise ValueError("estimators saved in another format; profile again")
        est = cls(kinds, d["forget"], d["window"])
        est.meta = d["meta"]
        est.copy_bandwidth_bytes_s = d.get("copy_bandwidth_bytes_s")
        for o in d["ops"]:
            est.ops[(o["kind"], o["op"])] = LinearEstimator.from_dict(o)
        for t in d["transfers"]:
            est.transfers[(t["src"], t["dst"])] = LinearEstimator.from_dict(t)
        return est


def _xfer_name(src: str, dst: str) -> str:
    return f"transfer {src}->{dst}"
