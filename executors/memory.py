"""Per-device memory budget: weights, KV blocks and activations are reserved before use."""

from __future__ import annotations

import threading


class MemoryLedger:
    """Bytes reserved on one device against its budget. Thread-safe; pure check beside commit."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._used: dict[str, int] = {}  # category ("weights", "kv", "activations") -> bytes
        # NOTE: reentrant, because try_reserve reads free_bytes while holding it
        self._lock = threading.RLock()

    @property
    def used_bytes(self) -> int:
        with self._lock:  # another thread may add a category while we sum
            return sum(self._used.values())

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def used(self, category: str) -> int:
        return self._used.get(category, 0)

    def can_reserve(self, num_bytes: int) -> bool:
        return num_bytes <= self.free_bytes

    def try_reserve(self, category: str, num_bytes: int) -> bool:
        with self._lock:
            if num_bytes > self.free_bytes:
                return False
            self._used[category] = self._used.get(category, 0) + num_bytes
            return True

    def reserve(self, category: str, num_bytes: int) -> None:
        if not self.try_reserve(category, num_bytes):
            raise MemoryError(f"cannot reserve {num_bytes} bytes of {category}: "
                              f"{self.free_bytes} of {self.capacity_bytes} free")

    def release(self, category: str, num_bytes: int) -> None:
        with self._lock:
            left = self._used.get(category, 0) - num_bytes
            if left < 0:
                raise ValueError(f"released more {category} bytes than reserved")
            self._used[category] = left

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._used)
