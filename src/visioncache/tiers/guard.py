"""`GuardedTier`: one tier behind its own circuit breaker, with what the chain counted for it.

Every call the chain makes to a tier goes through `GuardedTier.call`: while the breaker is open
the call is skipped (no I/O, no wait); a call that raises is logged, counted and opens the
breaker; a `CorruptEntryError` (one key's problem) passes through without touching the breaker.
So a dead, locked or stalled tier costs at most one timeout per retry interval, then nothing —
for reads, writes and the stats read at every metrics scrape alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from visioncache import forking
from visioncache.errors import CorruptEntryError
from visioncache.tiers.base import Tier
from visioncache.tiers.breaker import CircuitBreaker
from visioncache.tiers.stats import TierCounts, TierSizes, TierStats, tier_stats

__all__ = ["GuardedTier"]

logger = logging.getLogger(__name__)


class GuardedTier:
    """A tier, its breaker and its counts (thread-safe)."""

    def __init__(self, tier: Tier, breaker: CircuitBreaker) -> None:
        self.tier = tier
        self.name = tier.name
        self.breaker = breaker
        self._counts = dict.fromkeys((field.name for field in fields(TierCounts)), 0)
        self._lock = forking.lock()  # a child forked while a thread counts must not inherit it held

    def call(self, operation: Callable[[], Any]) -> tuple[bool, Any]:
        """(True, result) of ``operation``, or (False, None) if the breaker skipped it or it failed."""
        ticket = self.breaker.admit()
        if ticket is None:
            return False, None
        try:
            result = operation()
        except CorruptEntryError:  # one key's problem, not the tier's: the caller handles it
            self.breaker.record_success(ticket)
            raise
        except Exception as error:  # a tier must never fail a request
            self.breaker.record_failure()
            logger.warning("tier %s failed: %r", self.name, error)
            self.add("errors")
            return False, None
        self.breaker.record_success(ticket)
        return True, result

    def add(self, counter: str, count: int = 1) -> None:
        """Add ``count`` to one of the `TierCounts` (a typo fails loudly: no such counter)."""
        if counter not in self._counts:
            raise KeyError(f"no tier counter {counter!r}")
        with self._lock:  # `+=` on a dict item is not atomic across threads
            self._counts[counter] += count

    def stats(self) -> TierStats:
        """The counts, the breaker, and the tier's own sizes — unless its breaker is open (then
        the sizes are left out); a tier whose stats raise counts as failing."""
        sizes = TierSizes()
        if not self.breaker.is_open:
            try:
                sizes = self.tier.sizes()
            except Exception as error:
                logger.warning("tier %s: sizes failed: %r", self.name, error)
                self.breaker.record_failure()
        with self._lock:
            counts = TierCounts(**self._counts)
        return tier_stats(self.name, counts, self.breaker, sizes)

    def close(self) -> None:
        try:
            self.tier.close()
        except Exception as error:
            logger.warning("tier %s: close failed: %r", self.name, error)
