"""Per-projection route counters, read by benchmarks and the server's /metrics."""

from __future__ import annotations

import collections
import threading
from typing import Optional


class RouteCounters:
    """Counts calls per (projection, route, reason) and the largest M seen per route."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._rows: collections.Counter[tuple[str, str, int]] = collections.Counter()

    def record(self, projection: str, route: str, rows: int, reason: Optional[str] = None, calls: int = 1) -> None:
        with self._lock:
            self._calls[(projection, route, reason or "")] += calls
            self._rows[(projection, route, rows)] += calls

    def record_bulk(self, calls: dict[tuple[str, str, str], int], rows: dict[tuple[str, str, int], int]) -> None:
        """Many records at once: calls per (projection, route, reason) and per (projection,
        route, rows), as `record` keys them."""
        with self._lock:
            self._calls.update(calls)
            self._rows.update(rows)

    def calls(self, projection: Optional[str] = None, route: Optional[str] = None,
              reason: Optional[str] = None) -> int:
        with self._lock:
            return sum(n for (p, r, why), n in self._calls.items()
                       if (projection is None or p == projection) and (route is None or r == route)
                       and (reason is None or why == reason))

    def rows_seen(self, projection: Optional[str] = None, route: Optional[str] = None) -> dict[int, int]:
        """Calls per M (rows before bucketing)."""
        out: dict[int, int] = collections.Counter()
        with self._lock:
            for (p, r, m), n in self._rows.items():
                if (projection is None or p == projection) and (route is None or r == route):
                    out[m] += n
        return dict(out)

    def snapshot(self) -> list[dict[str, object]]:
        with self._lock:
            return [{"projection": p, "route": r, "reason": why, "calls": n}
                    for (p, r, why), n in sorted(self._calls.items())]

    def reset(self) -> None:
        with self._lock:
            self._calls.clear()
            self._rows.clear()
