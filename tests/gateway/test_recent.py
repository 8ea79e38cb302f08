"""RecentRequests: bounded owner map and finished-request records."""

from __future__ import annotations

from gateway.recent import FinishedRequest, RecentRequests


def test_owners_and_finishes_are_bounded() -> None:
    recent = RecentRequests(max_owners=2, max_finished=2)
    recent.started(["a", "b"], "t1")
    recent.started(["c"], "t2")
    assert (recent.owner("a"), recent.owner("b"), recent.owner("c")) == (None, "t1", "t2")
    for i in range(3):
        recent.finished(FinishedRequest(f"r{i}", "t1", "high", float(i), 0.1, 0.5))
    assert [r["request_id"] for r in recent.finished_since(0.0)] == ["r1", "r2"]
    assert [r["request_id"] for r in recent.finished_since(1.5)] == ["r2"]
