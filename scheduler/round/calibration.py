"""How far the simulation's first-token predictions miss, per kind of placement, as measured.

`slice` chooses among candidate placements by their predicted first token. The
cost model can miss by an amount that depends on the placement and the machine: a
prompt split over two devices of one host keeps both computing at once (on a host
of two cores, beside the server's own thread), and pays hand-offs between them
that a plan on one device does not. Each plan issued with a prediction is paired
with the first token it produces: the ratio of the measured wait (issue to first
token) to the predicted one is kept per kind of placement, and the policy scales a
candidate's predicted wait by its kind's median ratio over the last `WINDOW` such
plans (1.0 until `MIN_SAMPLES` of them ended). On the machine of the figures in
docs/benchmarks/http.md every kind ran over its prediction by about as much (interactive
alone), so there the scaling changes few choices.
"""

from __future__ import annotations

import logging
import statistics
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.cost.learnlog import LearningLog
from scheduler.round.plan import Plan
from scheduler.round.requestview import Placement

logger = logging.getLogger(__name__)

ONE_DEVICE, SPLIT, PIPELINE, WIDE = "one device", "split", "pipeline", "wide"
KINDS = (ONE_DEVICE, SPLIT, PIPELINE, WIDE)
WINDOW = 32  # plans per kind whose ratios are kept
MIN_SAMPLES = 4  # ratios a kind needs before its median is used
MIN_WAIT_S = 0.005  # shorter predicted waits are not scored (a ratio of noise)
MAX_PENDING = 4096  # predictions awaiting their first token (oldest dropped beyond)
FACTOR_RANGE = (0.25, 4.0)  # a median outside is clamped (a stall is not the model's error)
LOG_CHANGE = 0.1  # a factor is logged (DEBUG) when first used and when it moves this much since


def kind_of(placement: Placement, num_chunks: int, wide: bool = False) -> str:
    """One device; one device with another's cores lent to it (`executors.wide`); a split
    over several; or a chunked pipeline over several."""
    if len(set(placement)) == 1:
        return WIDE if wide else ONE_DEVICE
    return PIPELINE if num_chunks > 1 else SPLIT


@dataclass(frozen=True, slots=True)
class _Pending:
    kind: str
    issued_s: float
    predicted_s: float  # predicted seconds from issue to first token


class FirstTokenCalibration:
    """Measured / predicted first-token waits per placement kind (see the module docstring)."""

    def __init__(self, window: int = WINDOW, min_samples: int = MIN_SAMPLES,
                 learning: LearningLog | None = None) -> None:
        self.min_samples = min_samples
        self.learning = learning or LearningLog()  # where changes are noted for the summary
        self._ratios: dict[str, deque[float]] = {k: deque(maxlen=window) for k in KINDS}
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._logged: dict[str, float] = {}  # kind -> factor last logged
        self._factors: Mapping[str, float] = {}  # NOTE: read every round, replaced per ratio

    def issued(self, plan: Plan, now: float) -> None:
        """Note `plan`'s prediction for its first request (the one the policy placed)."""
        predicted = plan.predicted_first_token_s
        if predicted is None or predicted - now < MIN_WAIT_S or not plan.chunks:
            return
        rid = plan.chunks[0][0].rid
        self._pending.pop(rid, None)
        kind = kind_of(plan.placement, len(plan.chunks), plan.wide is not None)
        self._pending[rid] = _Pending(kind, now, predicted - now)
        while len(self._pending) > MAX_PENDING:
            self._pending.popitem(last=False)

    def first_token(self, rid: str, now: float) -> None:
        """`rid` produced its first token at `now`: score its plan's prediction, if any."""
        p = self._pending.pop(rid, None)
        if p is None:
            return
        ratios = self._ratios[p.kind]
        ratios.append((now - p.issued_s) / p.predicted_s)
        if len(ratios) < self.min_samples:
            return
        lo, hi = FACTOR_RANGE
        factor = min(hi, max(lo, statistics.median(ratios)))
        self._factors = {**self._factors, p.kind: factor}  # NOTE: views keep the old one
        last = self._logged.get(p.kind)
        if last is None or abs(factor / last - 1) >= LOG_CHANGE:
            self._logged[p.kind] = factor
            logger.debug("first tokens of %s plans take %.2fx their predicted wait "
                         "(median of the last %d)", p.kind, factor, len(ratios))
            self.learning.note("first-token calibration", f"{p.kind} plans {factor:.2f}x")

    def forget(self, rid: str) -> None:
        """`rid` ended before its first token: its prediction is void. (A preempted request's
        is replaced when its next plan is issued.)"""
        self._pending.pop(rid, None)

    def factors(self) -> Mapping[str, float]:
        """Per kind with enough plans scored: the median ratio, clamped to `FACTOR_RANGE`."""
        return self._factors

    def samples(self) -> Mapping[str, int]:
        return {k: len(v) for k, v in self._ratios.items()}
