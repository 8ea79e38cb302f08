"""Recent requests as the admin views need them: who owns a scheduler request id, and TTFTs.

The scheduler's op timeline names request ids only; `/admin/timeline` maps
them to tenants here and adds the TTFT of every request that finished since
the caller's last poll, with its tenant's SLO. Both records are bounded.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """One finished scheduler request (one choice of an HTTP request or batch line)."""

    request_id: str
    tenant: str
    priority: str  # class label
    end: float  # monotonic s
    ttft_s: float | None  # None: no token came
    slo_s: float | None  # the TTFT SLO it ran under; None: best effort


class RecentRequests:
    """Owners of the last `max_owners` request ids and the last `max_finished` finishes."""

    def __init__(self, max_owners: int = 1 << 16, max_finished: int = 1 << 13) -> None:
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._max_owners = max_owners
        self._finished: deque[FinishedRequest] = deque(maxlen=max_finished)

    def started(self, request_ids: Iterable[str], tenant: str) -> None:
        for request_id in request_ids:
            self._owners[request_id] = tenant
        while len(self._owners) > self._max_owners:
            self._owners.popitem(last=False)

    def owner(self, request_id: str) -> str | None:
        return self._owners.get(request_id)

    def finished(self, record: FinishedRequest) -> None:
        self._finished.append(record)

    def finished_since(self, since: float) -> list[dict[str, Any]]:
        return [asdict(r) for r in self._finished if r.end >= since]
