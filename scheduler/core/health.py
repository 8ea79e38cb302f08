"""Whether the scheduler is working: its task alive, its rounds succeeding, its executors up."""

from __future__ import annotations

from dataclasses import dataclass

RETRY_MIN_S = 0.05  # a failed round is retried after this, doubling up to RETRY_MAX_S
RETRY_MAX_S = 1.0


@dataclass(slots=True)
class RoundHealth:
    """Round failures: the cumulative count for /metrics, the current streak for /health."""

    errors_total: int = 0  # every exception caught in a round or a completion handler
    failing_rounds: int = 0  # consecutive rounds that raised outside any request's decision
    last_error: str | None = None
    task_error: str | None = None  # why the scheduler task ended, once it did

    def round_ok(self) -> None:
        self.failing_rounds = 0

    def round_failed(self, error: str) -> float:
        """Count a failed round; returns how long to wait before the retry round."""
        self.errors_total += 1
        self.failing_rounds += 1
        self.last_error = error
        return min(RETRY_MAX_S, RETRY_MIN_S * 2 ** (self.failing_rounds - 1))

    def request_error(self, error: str) -> None:
        """A decision or completion for some requests raised; those requests failed."""
        self.errors_total += 1
        self.last_error = error

    def problem(self, executors_alive: bool) -> str | None:
        """Why the scheduler is unhealthy now, or None."""
        if self.task_error is not None:
            return f"the scheduler task ended: {self.task_error}"
        if self.failing_rounds:
            return (f"scheduling rounds are failing ({self.failing_rounds} in a row): "
                    f"{self.last_error}")
        if not executors_alive:
            return "an executor died"
        return None
