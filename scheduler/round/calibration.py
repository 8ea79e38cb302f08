"""How far the simulation's first-token predictions miss, per kind of placement, as measured.

`slice` chooses among candidate placements by their predicted first token. The
cost model can miss by an amount that depends on the placement and the machine: a
prompt split over two devices of one host keeps both computing at once (on a host
of two cores, beside the server's own thread), and pays hand-offs between them
that a plan on one device does not. Each plan issued with a prediction is paired
with the first token it produces, and the last `WINDOW` pairs of each kind of
placement give a `WaitScale`: measured wait = offset + slope x predicted wait, a
robust line (Theil-Sen: the median slope over pairs of plans, then the median
offset), used by the policy once `MIN_SAMPLES` plans of the kind ended (as is
until then).

NOTE: a line, not one ratio: a short wait carries fixed costs (a round, a hand-off,
the token's way out) that a long prefill's wait does not. Measured alone in the
saturating recipe (docs/benchmarks/http.md), one-device plans of under 200 prompt
tokens took 1.17x their predicted wait (median) and those of 300-465 tokens
1.01-1.02x; 465-token pipelines, predicted at 0.44-0.45 s, measured 0.47-0.50 s, and
the pipelines' median ratio of 1.16 in one of those runs put them at 0.52 s, past a
500 ms deadline.
"""

from __future__ import annotations

import itertools
import logging
import statistics
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.cost.learnlog import LearningLog
from scheduler.round.plan import Plan
from scheduler.round.requestview import Placement

logger = logging.getLogger(__name__)

ONE_DEVICE, SPLIT, PIPELINE = "one device", "split", "pipeline"
KINDS = (ONE_DEVICE, SPLIT, PIPELINE)
WINDOW = 32  # plans per kind whose (predicted, measured) waits are kept
MIN_SAMPLES = 4  # plans a kind needs before its line is used
MIN_WAIT_S = 0.005  # shorter predicted waits are not scored (a ratio of noise)
MAX_PENDING = 4096  # predictions awaiting their first token (oldest dropped beyond)
FACTOR_RANGE = (0.25, 4.0)  # a slope outside is clamped (a stall is not the model's error)
OFFSET_RANGE_S = (-0.05, 0.25)  # and an offset
MIN_SPREAD = 0.2  # two plans give a slope where one's predicted wait is this much above the other's
LOG_CHANGE = 0.1  # a line is logged (DEBUG) when first used and when it moves this much since


def kind_of(placement: Placement, num_chunks: int) -> str:
    """One device; a split over several; or a chunked pipeline over several."""
    if len(set(placement)) == 1:
        return ONE_DEVICE
    return PIPELINE if num_chunks > 1 else SPLIT


@dataclass(frozen=True, slots=True)
class WaitScale:
    """Measured wait = `offset_s` + `slope` x predicted wait, for plans of one kind."""

    slope: float = 1.0
    offset_s: float = 0.0

    def __call__(self, wait_s: float) -> float:
        return self.offset_s + self.slope * wait_s

    @classmethod
    def fit(cls, pairs: Sequence[tuple[float, float]]) -> WaitScale:
        """The Theil-Sen line through (predicted, measured) `pairs`, clamped; the median
        ratio through the origin where too few pairs differ in their predicted wait (a
        slope between two alike predictions is noise)."""
        slopes = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.combinations(
            sorted(pairs), 2) if b[0] >= a[0] * (1 + MIN_SPREAD)]
        if len(slopes) < len(pairs):
            slope = statistics.median(m / p for p, m in pairs)
            return cls(_clamp(slope, FACTOR_RANGE), 0.0)
        slope = _clamp(statistics.median(slopes), FACTOR_RANGE)
        offset = statistics.median(m - slope * p for p, m in pairs)
        return cls(slope, _clamp(offset, OFFSET_RANGE_S))


def _clamp(x: float, bounds: tuple[float, float]) -> float:
    return min(bounds[1], max(bounds[0], x))


@dataclass(frozen=True, slots=True)
class _Pending:
    kind: str
    issued_s: float
    predicted_s: float  # predicted seconds from issue to first token


class FirstTokenCalibration:
    """Measured against predicted first-token waits per placement kind (module docstring)."""

    def __init__(self, window: int = WINDOW, min_samples: int = MIN_SAMPLES,
                 learning: LearningLog | None = None) -> None:
        self.min_samples = min_samples
        self.learning = learning or LearningLog()  # where changes are noted for the summary
        # kind -> (predicted, measured) waits of its last plans
        self._pairs: dict[str, deque[tuple[float, float]]] = {
            k: deque(maxlen=window) for k in KINDS}
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._logged: dict[str, WaitScale] = {}  # kind -> line last logged
        self._scales: Mapping[str, WaitScale] = {}  # NOTE: read every round, replaced per plan

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
        pairs = self._pairs[p.kind]
        pairs.append((p.predicted_s, now - p.issued_s))
        if len(pairs) < self.min_samples:
            return
        scale = WaitScale.fit(pairs)
        self._scales = {**self._scales, p.kind: scale}  # NOTE: views keep the old one
        last = self._logged.get(p.kind)
        if last is None or _moved(last, scale):
            self._logged[p.kind] = scale
            logger.debug("first tokens of %s plans take %.2fx their predicted wait %+.0f ms "
                         "(the last %d)", p.kind, scale.slope, 1000 * scale.offset_s,
                         len(pairs))
            self.learning.note("first-token calibration",
                               f"{p.kind} plans {scale.slope:.2f}x "
                               f"{1000 * scale.offset_s:+.0f} ms")

    def forget(self, rid: str) -> None:
        """`rid` ended before its first token: its prediction is void. (A preempted request's
        is replaced when its next plan is issued.)"""
        self._pending.pop(rid, None)

    def scales(self) -> Mapping[str, WaitScale]:
        """Per kind with enough plans scored: its line (`WaitScale.fit`)."""
        return self._scales

    def samples(self) -> Mapping[str, int]:
        return {k: len(v) for k, v in self._pairs.items()}


def _moved(last: WaitScale, now: WaitScale) -> bool:
    """Whether a line moved enough since it was last logged: its slope by `LOG_CHANGE`, or
    its offset by 10 ms."""
    return abs(now.slope / last.slope - 1) >= LOG_CHANGE or abs(
        now.offset_s - last.offset_s) >= 0.01
