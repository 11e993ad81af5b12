"""The connector's counters: per logging interval (for vLLM's stats hooks) and since start-up.

Besides what the connector counts itself, the tiers' own failure counts (errors, corrupt and
unverified entries, breaker skips) are folded in as deltas, read at most once a second: a disk
tier answers its stats with SQLite queries, and this runs on the engine's step path.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from visioncache.tiers import ChainStats

__all__ = ["TIER_COUNTERS", "ConnectorCounters"]

TIER_COUNTERS = ("errors", "corrupt", "unverified", "skipped")


class ConnectorCounters:
    """Counters of one half of the connector (not thread-safe: each half runs on one thread)."""

    def __init__(self, chain_stats: Callable[[], ChainStats], *, tier_read_seconds: float = 1.0) -> None:
        self._chain_stats = chain_stats
        self._tier_read_seconds = tier_read_seconds
        self._interval: dict[str, float] = {}
        self._totals: dict[str, float] = {}
        self._tier_totals: dict[str, int] = {}
        self._tier_read_at = -tier_read_seconds

    def add(self, name: str, value: float) -> None:
        self._interval[name] = self._interval.get(name, 0) + value
        self._totals[name] = self._totals.get(name, 0) + value

    def get(self, name: str) -> float:
        return self._totals.get(name, 0)

    def _tier_sums(self) -> dict[str, int]:
        rows = self._chain_stats().tiers
        return {f"tier_{name}": sum(int(getattr(row, name)) for row in rows) for name in TIER_COUNTERS}

    def tier_deltas(self) -> dict[str, int]:
        """The tiers' counts since the last call; empty if the last read was under a second ago."""
        now = time.monotonic()
        if now - self._tier_read_at < self._tier_read_seconds:
            return {}
        self._tier_read_at = now
        deltas = {}
        for name, total in self._tier_sums().items():
            deltas[name] = total - self._tier_totals.get(name, 0)
            self._tier_totals[name] = total
        return deltas

    def take_interval(self) -> dict[str, float] | None:
        """This interval's counters, tiers' deltas included, then a new interval; None if idle."""
        for name, delta in self.tier_deltas().items():
            if delta:
                self._interval[name] = self._interval.get(name, 0) + delta
        if not any(self._interval.values()):
            return None
        interval, self._interval = self._interval, {}
        return interval

    def totals(self) -> dict[str, float]:
        """Every counter since start-up: this half's tiers' counts plus those reported to it."""
        totals = dict(self._totals)
        for name, value in self._tier_sums().items():
            totals[name] = totals.get(name, 0) + value
        return totals
