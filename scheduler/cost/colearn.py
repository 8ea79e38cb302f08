"""Co-location slowdowns learnt online from the ops a live run measures.

The start-up profile times each op class beside a thread looping one other class
(`scheduler.cost.colocation`); a live run's ops meet other neighbours (the other
device's own chain, its hand-offs, the server's thread), and on every machine
measured a layer group beside another ran 5–17% over its solo estimate where the
profile said 1.0–1.08×. This learns the factors from the run itself.

Each op resolved on a shared host (`scheduler.cost.overlap.Resolved`) comes with its
measured seconds `m`, the seconds it overlapped each class, and its predicted solo
seconds `p` (the profiled fit's, not the online refit's). Ops that overlapped
nothing give the solo level `L` of their class: the median of `m / p` over a
window (1.0 until `MIN_SAMPLES` of them: on devices never idle at once, the
profile is all there is to go by). An op whose overlap was mostly with one class
`b` (`DOMINANT` of it, and at least `MIN_FRACTION` of its time) gives that pair's
slowdown by the fluid model (`executors.interference`): its solo seconds `L * p`
are its time outside overlaps plus each overlap divided by its factor, solved for
`b`'s factor with the others' current ones. Taking `p` from the profile, and the
level from solo ops, keeps the factors apart from the online refit, which learns
solo times converted with these same factors: a factor too low would otherwise be
confirmed by estimates it had inflated itself. A pair's factor is the median over its window,
clamped to [1, `CAP`]; pairs without `MIN_SAMPLES` keep the profile's.

Ops whose thread ran less than `MIN_CPU_SHARE` of their wall time (where the executor
measured it) teach nothing, solo or overlapped: co-location slows an op that keeps its
core (memory bandwidth, shared caches, the server's own threads), while an op descheduled
for most of its time waited for a core that other work on the machine held. On a 2-core
machine shared with other work, ops ran at 0.25-0.35 of their wall time and the factors
learnt from them reached 2.5-2.8x, which the simulator then applied after the load had
gone (`python -m benchmarks.scheduler simulator --parts accuracy`: 1.71 s run, 2.40 s
predicted).
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Mapping, Sequence

from executors.interference import OP_CLASSES, Interference
from scheduler.cost.learnlog import LearningLog

WINDOW = 64  # ops kept per class (solo) and per pair (overlapped)
MIN_SAMPLES = 8  # a pair's factor (and a class's solo level) needs this many ops
DOMINANT = 0.8  # of an op's overlap with one class, for that pair to learn from it
MIN_FRACTION = 0.3  # of an op's own time overlapped, for it to teach a factor
CAP = 4.0  # a larger factor is clamped (a stall, not co-location)
MIN_CPU_SHARE = 0.7  # an op whose thread ran less of its wall time waited for a core
UPDATE_EVERY = 16  # overlapped ops between re-estimates
CHANGE = 0.01  # a learnt factor that moves less keeps the one in use
LOG_CHANGE = 0.1  # a learnt factor is logged when it moves this much since last logged
logger = logging.getLogger(__name__)


class ColocationLearner:
    """Windows of solo ratios per class and of overlapped ops per (class, other class)."""

    def __init__(self, classes: Sequence[str] = OP_CLASSES, window: int = WINDOW,
                 min_samples: int = MIN_SAMPLES, learning: LearningLog | None = None) -> None:
        self.classes = tuple(classes)
        self.learning = learning or LearningLog()  # where changes are noted for the summary
        self.min_samples = min_samples
        self._solo: list[deque[float]] = [deque(maxlen=window) for _ in self.classes]
        # (victim, other) -> (measured, predicted, overlap per class) of ops it dominated
        self._pairs: dict[tuple[int, int], deque[tuple[float, float, tuple[float, ...]]]] = {}
        self._window = window
        self._new = 0  # overlapped ops since the last re-estimate
        self._logged: dict[tuple[str, str], float] = {}  # factors last logged

    def add(self, cls: int, measured: float, predicted: float,
            overlap_s: Sequence[float], cpu_s: float | None = None) -> None:
        """One op of class index `cls`: measured and predicted solo seconds, its overlaps,
        and its thread's CPU seconds over `measured` (None: not measured)."""
        if cls < 0 or measured <= 0 or predicted <= 0:
            return
        if cpu_s is not None and cpu_s < MIN_CPU_SHARE * measured:
            return  # NOTE: waited for a core (see the module docstring), not for a neighbour
        total = sum(overlap_s)
        if total <= 0:
            self._solo[cls].append(measured / predicted)
            return
        other = max(range(len(overlap_s)), key=overlap_s.__getitem__)
        if overlap_s[other] < DOMINANT * total or total < MIN_FRACTION * measured:
            return
        pair = self._pairs.setdefault((cls, other), deque(maxlen=self._window))
        pair.append((measured, predicted, tuple(overlap_s)))
        self._new += 1

    def due(self) -> bool:
        """Whether `UPDATE_EVERY` overlapped ops came since the last `slowdowns`."""
        return self._new >= UPDATE_EVERY

    def relearn(self, inter: Interference) -> Interference | None:
        """`inter` with the learnt factors, if any moved by `CHANGE` (else None); a factor
        that moved by `LOG_CHANGE` since it was last logged (or since the profile) is logged
        at DEBUG and noted for the periodic summary (`scheduler.cost.learnlog`)."""
        learnt = self.slowdowns(inter.slowdown)
        moved = {k: v for k, v in learnt.items()
                 if abs(v / inter.slowdown.get(k, 1.0) - 1.0) >= CHANGE}
        if not moved:
            return None
        was = {k: self._logged.get(k, inter.slowdown.get(k, 1.0)) for k in moved}
        news = {k: v for k, v in moved.items() if abs(v / was[k] - 1.0) >= LOG_CHANGE}
        if news:
            change = ", ".join(f"{a}|{b} {was[(a, b)]:.3f}->{v:.3f}"
                               for (a, b), v in sorted(news.items()))
            logger.debug("co-location slowdowns learnt from the run: %s", change)
            self.learning.note("co-location slowdowns", change)
            self._logged.update(news)
        return Interference(inter.hosts, {**inter.slowdown, **learnt})

    def slowdowns(self, current: Mapping[tuple[str, str], float]
                  ) -> dict[tuple[str, str], float]:
        """The learnt factor of every pair with enough ops (against its class's solo level,
        1.0 without enough solo ops), the others' overlaps counted at `current` (absent:
        1.0)."""
        self._new = 0
        out = {}
        for (a, b), ops in self._pairs.items():
            if len(ops) < self.min_samples:
                continue
            solo = self._solo[a]
            level = statistics.median(solo) if len(solo) >= self.min_samples else 1.0
            implied = [self._implied(a, b, level, op, current) for op in ops]
            factor = statistics.median(implied)
            out[(self.classes[a], self.classes[b])] = min(CAP, max(1.0, factor))
        return out

    def _implied(self, a: int, b: int, level: float,
                 op: tuple[float, float, tuple[float, ...]],
                 current: Mapping[tuple[str, str], float]) -> float:
        """`b`'s factor that makes `op`'s measured time its solo time `level * predicted`."""
        measured, predicted, overlap = op
        name = self.classes[a]
        progress = level * predicted - (measured - sum(overlap))  # solo seconds in overlaps
        for c, ov in enumerate(overlap):
            if c != b and ov > 0:
                progress -= ov / current.get((name, self.classes[c]), 1.0)
        return overlap[b] / progress if progress > 0 else float("inf")
