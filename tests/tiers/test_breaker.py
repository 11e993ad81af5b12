"""CircuitBreaker and GuardedTier: a success closes the breaker only if no failure came after its
call was admitted; an open breaker skips calls until the interval passes, then lets one probe."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from tests.tiers.conftest import FakeClock
from visioncache.tiers.breaker import CircuitBreaker
from visioncache.tiers.guard import GuardedTier

INTERVAL = 10.0


def test_open_breaker_skips_then_lets_one_probe_which_closes_it_on_success() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(INTERVAL, clock=clock)
    breaker.record_failure()
    assert breaker.admit() is None and breaker.skipped == 1
    clock.now += INTERVAL
    probe = breaker.admit()
    assert probe is not None and breaker.admit() is None  # one probe per interval
    breaker.record_success(probe)
    assert not breaker.is_open and breaker.admit() is not None


def test_regression_a_success_admitted_before_a_failure_does_not_close_the_breaker() -> None:
    """CI (tests/tiers/test_faults.py, Redis Cluster with one node stalled): a call to a healthy
    node, admitted before another thread's call timed out and ending after it, closed the breaker,
    and a request paid a second timeout to the stalled node."""
    breaker = CircuitBreaker(INTERVAL, clock=FakeClock())
    healthy = breaker.admit()
    stalled = breaker.admit()
    assert healthy is not None and stalled is not None
    breaker.record_failure()  # the stalled call times out
    breaker.record_success(healthy)  # the healthy call ends after it
    assert breaker.is_open and breaker.admit() is None


def test_regression_guarded_tier_stays_open_when_an_earlier_call_succeeds_after_a_failure() -> None:
    clock = FakeClock()
    tier: Any = SimpleNamespace(name="stub")  # GuardedTier.call runs the operation it is given
    guarded = GuardedTier(tier, CircuitBreaker(INTERVAL, clock=clock))
    started, failed = threading.Event(), threading.Event()

    def healthy() -> str:
        started.set()
        assert failed.wait(10)
        return "ok"

    def stalled() -> None:
        raise TimeoutError("the stalled node")

    results: list[tuple[bool, object]] = []
    worker = threading.Thread(target=lambda: results.append(guarded.call(healthy)))
    worker.start()
    assert started.wait(10)  # admitted while the breaker was closed
    assert guarded.call(stalled) == (False, None)
    failed.set()
    worker.join(10)
    assert results == [(True, "ok")]
    calls: list[int] = []
    assert guarded.call(lambda: calls.append(1)) == (False, None)  # still open: skipped
    assert calls == [] and guarded.breaker.is_open


@pytest.mark.parametrize("ticket_after", [0, 1])
def test_a_probe_that_fails_keeps_it_open_for_another_interval(ticket_after: int) -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(INTERVAL, clock=clock)
    for _ in range(1 + ticket_after):
        breaker.record_failure()
    clock.now += INTERVAL
    assert breaker.admit() is not None
    breaker.record_failure()
    assert breaker.admit() is None
    clock.now += INTERVAL
    assert breaker.admit() is not None
