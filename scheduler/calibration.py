"""How far the simulation's first-token predictions miss, per kind of placement, as measured.

`slice` chooses among candidate placements by their predicted first token. The
cost model can miss by an amount that depends on the placement: on a host of two
cores, a prompt split over both devices keeps both computing at once, beside the
server's own thread, and on the machine of the README's figures such plans took
well over their prediction while plans on one device took about theirs (README,
interactive alone). Each plan issued with a prediction is paired with the first
token it produces: the ratio of the measured wait (issue to first token) to the
predicted one is kept per kind of placement, and the policy scales a candidate's
predicted wait by its kind's median ratio over the last `WINDOW` such plans (1.0
until `MIN_SAMPLES` of them ended).
"""

from __future__ import annotations

import logging
import statistics
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.plan import Plan
from scheduler.requestview import Placement

logger = logging.getLogger(__name__)

ONE_DEVICE, SPLIT, PIPELINE = "one device", "split", "pipeline"
KINDS = (ONE_DEVICE, SPLIT, PIPELINE)
WINDOW = 32  # plans per kind whose ratios are kept
MIN_SAMPLES = 4  # ratios a kind needs before its median is used
MIN_WAIT_S = 0.005  # shorter predicted waits are not scored (a ratio of noise)
MAX_PENDING = 4096  # predictions awaiting their first token (oldest dropped beyond)
FACTOR_RANGE = (0.25, 4.0)  # a median outside is clamped (a stall is not the model's error)
LOG_CHANGE = 0.1  # a factor is logged when first used and when it moves this much since


def kind_of(placement: Placement, num_chunks: int) -> str:
    """One device; a split over several; or a chunked pipeline over several."""
    if len(set(placement)) == 1:
        return ONE_DEVICE
    return PIPELINE if num_chunks > 1 else SPLIT


@dataclass(frozen=True, slots=True)
class _Pending:
    kind: str
    issued_s: float
    predicted_s: float  # predicted seconds from issue to first token


class FirstTokenCalibration:
    """Measured / predicted first-token waits per placement kind (see the module docstring)."""

    def __init__(self, window: int = WINDOW, min_samples: int = MIN_SAMPLES) -> None:
        self.min_samples = min_samples
        self._ratios: dict[str, deque[float]] = {k: deque(maxlen=window) for k in KINDS}
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._logged: dict[str, float] = {}  # kind -> factor last logged

    def issued(self, plan: Plan, now: float) -> None:
        """Note `plan`'s prediction for its first request (the one the policy placed)."""
        predicted = plan.predicted_first_token_s
        if predicted is None or predicted - now < MIN_WAIT_S or not plan.chunks:
            return
        rid = plan.chunks[0][0].rid
        self._pending.pop(rid, None)
        self._pending[rid] = _Pending(kind_of(plan.placement, len(plan.chunks)), now,
                                      predicted - now)
        while len(self._pending) > MAX_PENDING:
            self._pending.popitem(last=False)

    def first_token(self, rid: str, now: float) -> None:
        """`rid` produced its first token at `now`: score its plan's prediction, if any."""
        p = self._pending.pop(rid, None)
        if p is None:
            return
        self._ratios[p.kind].append((now - p.issued_s) / p.predicted_s)
        factor = self.factors().get(p.kind)
        last = self._logged.get(p.kind)
        if factor is not None and (last is None or abs(factor / last - 1) >= LOG_CHANGE):
            self._logged[p.kind] = factor
            logger.info("first tokens of %s plans take %.2fx their predicted wait "
                        "(median of the last %d)", p.kind, factor, len(self._ratios[p.kind]))

    def forget(self, rid: str) -> None:
        """`rid` ended or was preempted before its first token: its prediction is void."""
        self._pending.pop(rid, None)

    def factors(self) -> Mapping[str, float]:
        """Per kind with enough plans scored: the median ratio, clamped to `FACTOR_RANGE`."""
        lo, hi = FACTOR_RANGE
        return {k: min(hi, max(lo, statistics.median(v))) for k, v in self._ratios.items()
                if len(v) >= self.min_samples}

    def samples(self) -> Mapping[str, int]:
        return {k: len(v) for k, v in self._ratios.items()}
