"""`CircuitBreaker`: after a failure, skip a remote tier for a while instead of waiting on it again.

Guarantee: after a failure, `admit` answers None (no network call) until ``retry_interval``
seconds have passed; then it lets exactly one caller through as a probe, even with many threads,
and closes again only when that probe succeeds. So a dead, locked or stalled tier costs at most one
timeout per interval, and a server that is back is used again within one interval.

A success closes the breaker only if no failure was recorded after its call was admitted (`admit`
hands out the failure count as a ticket): a call that began before a failure says nothing about
the server after it. Without this, on a Redis Cluster with one node stalled, a call to a healthy
node that ended after another thread's timeout closed the breaker again, and a request paid a
second timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from visioncache import forking
from visioncache.tiers import defaults
from visioncache.tiers import setting_kinds as kinds

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    """Closed (calls go through), open (calls skipped) or probing; ``clock`` is injectable for tests."""

    def __init__(
        self, retry_interval: float = defaults.RETRY_INTERVAL, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        kinds.seconds(retry_interval, "retry_interval", False)
        self.retry_interval = retry_interval
        self._clock = clock
        self._lock = forking.lock()  # free in a forked child (see `visioncache.forking`)
        self._open_until: float | None = None  # None: closed
        self._failures = 0  # failures recorded so far: the tickets `admit` hands out
        self.opens = 0  # times it went from closed to open
        self.skipped = 0  # calls answered False

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    def admit(self) -> int | None:
        """None if a call must be skipped now; else a ticket for `record_success` (the call is a
        probe if the breaker is open)."""
        with self._lock:
            if self._open_until is not None:
                now = self._clock()
                if now < self._open_until:
                    self.skipped += 1
                    return None
                # Push the deadline on before letting this caller probe: concurrent callers keep
                # skipping, so the probe is the only call that can wait on a timeout this interval.
                self._open_until = now + self.retry_interval
            return self._failures

    def record_success(self, ticket: int) -> None:
        """Close, unless a failure was recorded since the call holding ``ticket`` was admitted."""
        with self._lock:
            if ticket == self._failures:
                self._open_until = None

    def record_failure(self) -> None:
        with self._lock:
            self._failures += 1
            if self._open_until is None:
                self.opens += 1
            self._open_until = self._clock() + self.retry_interval
