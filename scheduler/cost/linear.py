"""One cost model: time ≈ coef · features, a profiled base refined online by a robust window.

The base is a least-squares fit on relative error (a 1 ms op counts as much as a
100 ms one) over the profiling sweep. Online, the last `window` observations
are refit every `refit_every` observations: least squares on relative error
with Tukey's biweight (an outlier, a GC pause or a preempted thread, weighs
nothing; the weights start from the prior's residuals),
pulled toward the base scaled by the window's median ratio of measured to base
time (its `level`) with the weight of `prior_obs` sweep samples, so directions
the live shapes do not excite keep the base's slope. A step change moves the
median, so the fit follows it within a window; observations older than
`max_age_s` (in the ops' own time) are dropped at the next refit, so a busy
period is forgotten once new observations come in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

MIN_TIME_S = 1e-7  # floor of every prediction
TUKEY_C = 4.685  # residuals past this many robust sigmas get no weight (Tukey's biweight)
IRLS_STEPS = 3
ERROR_WINDOW = 500  # predictions a running MAPE is taken over


class LinearEstimator:
    """time ≈ coef · features (see the module docstring).

    `coef` holds the coefficients in raw feature units (0 where a feature is unused),
    so a prediction is one dot product of plain floats.
    """

    def __init__(self, name: str, mask: Sequence[bool], scale: Sequence[float],
                 window: int = 64, refit_every: int = 16, prior_obs: float = 8.0,
                 max_age_s: float = 60.0) -> None:
        self.name = name
        self.mask = tuple(mask)
        self.scale = tuple(scale)
        self._cols = [i for i, m in enumerate(self.mask) if m]
        n = len(self._cols)
        self._div = np.array([self.scale[i] for i in self._cols])
        self.base = np.zeros(n)  # the profiled fit, over the used features, scaled
        self.base_info = np.zeros((n, n))  # its information per sweep sample
        self.theta = np.zeros(n)  # the current fit
        self.window, self.refit_every = window, refit_every
        self.prior_obs, self.max_age_s = prior_obs, max_age_s
        self.recent: deque[tuple[tuple[float, ...], float, float | None]] = deque(maxlen=window)
        self.errors: deque[float] = deque(maxlen=ERROR_WINDOW)  # APE of the latest predictions
        self.level = 1.0  # median of measured / base time over the window
        self.level_n = 0  # observations that median was taken over
        self.sample_cov: float | None = None  # run-to-run noise of the profiling sweep
        self.num_obs = 0
        self._since = 0  # observations since the last refit
        self.num_refits = 0  # refits from observations (summarised in the log)
        self.coef: tuple[float, ...] = (0.0,) * len(self.mask)

    # -- predicting ----------------------------------------------------------------------
    def predict(self, raw: Sequence[float]) -> float:
        t = sum(c * x for c, x in zip(self.coef, raw, strict=True))
        return t if t > MIN_TIME_S else MIN_TIME_S

    def predict_base(self, raw: Sequence[float]) -> float:
        """The profiled fit's prediction (the current one's where nothing was profiled)."""
        if not self.base.any():
            return self.predict(raw)
        x = np.asarray(raw, dtype=float)[self._cols] / self._div
        return max(float(x @ self.base), MIN_TIME_S)

    def _publish(self) -> None:
        coef = [0.0] * len(self.mask)
        for j, i in enumerate(self._cols):
            coef[i] = float(self.theta[j]) / self.scale[i]
        self.coef = tuple(coef)

    def _rows(self, raws: Sequence[Sequence[float]], ys: Sequence[float]) -> np.ndarray:
        """Relative-error rows: used features (scaled) over the measured time."""
        x = np.asarray(raws, dtype=float)[:, self._cols] / self._div
        return x / np.asarray(ys, dtype=float)[:, None]

    # -- fitting -------------------------------------------------------------------------
    def fit(self, xs: Sequence[Sequence[float]], ys: Sequence[float], ridge: float = 1e-9) -> None:
        """Batch fit of the base (replaces the state; the online window starts empty)."""
        a = self._rows(xs, ys)
        n = len(self._cols)
        self.base = _solve(a, np.ones(len(a)), ridge * np.eye(n), np.zeros(n))
        self.base_info = a.T @ a / len(a)
        self.theta = self.base.copy()
        self.recent.clear()
        self.level, self.level_n, self._since = 1.0, 0, 0
        self._publish()

    def observe(self, raw: Sequence[float], seconds: float, learn: bool = True,
                at: float | None = None) -> float:
        """Score the current prediction against `seconds` (returns its APE), then (if
        `learn`) keep it for the next refit; `at` is when it was measured (op time)."""
        ape = abs(self.predict(raw) - seconds) / max(seconds, MIN_TIME_S)
        self.errors.append(ape)
        self.num_obs += 1
        if learn and seconds > 0:
            self.recent.append((tuple(raw), seconds, at))
            self._since += 1
            if self._since >= self.refit_every:
                self.num_refits += 1
                self.refit()
        return ape

    def refit(self) -> None:
        """The robust windowed fit (see the module docstring)."""
        self._since = 0
        self._expire()
        if not self.recent:
            self.theta, self.level, self.level_n = self.base.copy(), 1.0, 0
            self._publish()
            return
        raws = [r for r, _, _ in self.recent]
        ys = [y for _, y, _ in self.recent]
        a = self._rows(raws, ys)
        n = len(self._cols)
        if self.base.any():
            ratio = 1.0 / np.maximum(a @ self.base, 1e-12)  # measured / base prediction
            self.level, self.level_n = _median(ratio), len(ratio)
            prior, weight = self.level * self.base, self.prior_obs * self.base_info
        else:  # learning from nothing: the window alone (a tiny ridge keeps it solvable)
            prior, weight = np.zeros(n), 1e-9 * np.eye(n)
        # NOTE: the weights start from the prior's residuals (its level is a median, so an
        # outlier cannot drag it), not from a plain least-squares fit that outliers skew
        theta = prior if self.base.any() else _solve(a, np.ones(len(a)), weight, prior)
        for _ in range(IRLS_STEPS):
            r = np.abs(a @ theta - 1.0)
            sigma = max(1.4826 * _median(r), 1e-3)
            u = np.minimum(r / (TUKEY_C * sigma), 1.0)
            w = (1.0 - u * u) ** 2
            theta = _solve(a, w, weight, prior)
        self.theta = theta
        self._publish()

    def _expire(self) -> None:
        latest = max((t for _, _, t in self.recent if t is not None), default=None)
        if latest is None:
            return
        while self.recent and self.recent[0][2] is not None and \
                self.recent[0][2] < latest - self.max_age_s:
            self.recent.popleft()

    def mape(self) -> float | None:
        return sum(self.errors) / len(self.errors) if self.errors else None

    def median_seconds(self) -> float:
        """The median measured time in the online window (0 when it is empty)."""
        ys = sorted(y for _, y, _ in self.recent)
        return ys[len(ys) // 2] if ys else 0.0

    def drift(self) -> float | None:
        """The level (measured / base time, median) once a full window backs it, else None."""
        return self.level if self.level_n >= self.window else None

    # -- making ----------------------------------------------------------------------------
    @classmethod
    def fixed(cls, name: str, mask: Sequence[bool], scale: Sequence[float],
              coef: Sequence[float]) -> LinearEstimator:
        """An estimator with given coefficients (raw feature units); used for fallbacks."""
        e = cls(name, mask, scale)
        e.base = np.array([coef[i] * scale[i] for i in e._cols])
        e.theta = e.base.copy()
        e._publish()
        return e

    def clone(self, name: str, factor: float = 1.0) -> LinearEstimator:
        """A copy under another name, coefficients times `factor`, with no observations."""
        c = LinearEstimator(name, self.mask, self.scale, self.window, self.refit_every,
                            self.prior_obs, self.max_age_s)
        c.base, c.base_info = self.base * factor, self.base_info.copy()
        c.theta, c.sample_cov = self.theta * factor, self.sample_cov
        c._publish()
        return c

    def rebase(self, other: LinearEstimator) -> None:
        """Take `other`'s base fit (a re-profile), keeping this one's observations."""
        self.base, self.base_info = other.base.copy(), other.base_info.copy()
        self.sample_cov = other.sample_cov
        self.refit()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mask": self.mask, "scale": self.scale,
                "window": self.window, "refit_every": self.refit_every,
                "prior_obs": self.prior_obs, "max_age_s": self.max_age_s,
                "base": self.base.tolist(), "base_info": self.base_info.tolist(),
                "theta": self.theta.tolist(), "sample_cov": self.sample_cov,
                "num_obs": self.num_obs, "errors": list(self.errors)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LinearEstimator:
        e = cls(d["name"], d["mask"], d["scale"], d["window"], d["refit_every"],
                d["prior_obs"], d["max_age_s"])
        e.base = np.array(d["base"], dtype=float)
        e.base_info = np.array(d["base_info"], dtype=float)
        e.theta = np.array(d["theta"], dtype=float)
        e.sample_cov, e.num_obs = d["sample_cov"], d["num_obs"]
        e.errors.extend(d["errors"])
        e._publish()
        return e


def _median(x: np.ndarray) -> float:
    """`np.median` of a 1-D array, the same value at a third of its cost (a refit takes
    four, on the event loop: scheduler.scheduler books ops there)."""
    n = len(x)
    h = n // 2
    if n % 2:
        return float(np.partition(x, h)[h])
    part = np.partition(x, (h - 1, h))
    return float((part[h - 1] + part[h]) / 2)


def _solve(a: np.ndarray, w: np.ndarray, weight: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """argmin sum_i w_i (a_i·θ - 1)² + (θ - prior)ᵀ weight (θ - prior), every θ ≥ 0: a
    feature whose coefficient would be negative is dropped (0), the most negative first,
    so the model stays monotone in every feature."""
    keep = list(range(a.shape[1]))
    theta = np.zeros(a.shape[1])
    sub, wk, pk = a, weight, prior  # NOTE: every feature kept: no copies (the usual case)
    while keep:
        info = sub.T @ (sub * w[:, None]) + wk
        rhs = sub.T @ w + wk @ pk
        try:
            sol = np.linalg.solve(info, rhs)
        except np.linalg.LinAlgError:  # a window of one shape over several features
            sol = np.linalg.lstsq(info, rhs, rcond=None)[0]
        if (sol >= 0).all() or len(keep) == 1:
            theta[keep] = np.maximum(sol, 0.0)
            return theta
        keep.pop(int(np.argmin(sol)))
        sub, wk, pk = a[:, keep], weight[np.ix_(keep, keep)], prior[keep]
    return theta
