"""RedisTier against a real redis-server: faults, breaker, recovery, TTL, namespace isolation."""

from __future__ import annotations

from tests.support.optional import skip_without

skip_without("redis", "redis")

import os
import signal
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import redis

from tests.support.tier_reads import load
from tests.tiers.conftest import VALUE, FakeClock, key
from visioncache.identity.keys import KeyBuilder
from visioncache.tiers.chain import TierChain
from visioncache.tiers.redis import RedisTier


@pytest.mark.slow
def test_killed_server_costs_nothing_and_restart_brings_the_tier_back(
    redis_process_factory: Callable[[], Any],
) -> None:
    server = redis_process_factory()
    clock = FakeClock()
    tier = RedisTier(server.url, socket_timeout=0.25)
    chain = TierChain([tier], retry_interval=5.0, clock=clock, max_pending_write_bytes=0)
    assert chain.save(key(0), VALUE)
    assert np.array_equal(load(chain, key(0)), VALUE)

    server.stop()  # kill -9 in the middle of the run
    results = [load(chain, key(index % 3)) for index in range(50)]
    for index in range(50):
        chain.save(key(index), VALUE)  # never raises
    assert results == [None] * 50
    stats = chain.stats().tier("redis")
    assert stats.errors == 1  # one failed call; the breaker skipped the other 99
    assert stats.breaker_open == 1 and stats.skipped == 99

    clock.now += 5.0  # one probe per interval, and it fails again
    assert load(chain, key(0)) is None and load(chain, key(0)) is None
    assert chain.stats().tier("redis").errors == 2

    server.start()  # same port, empty
    clock.now += 5.0
    assert chain.save(key(1), VALUE)
    assert np.array_equal(load(chain, key(1)), VALUE)
    stats = chain.stats().tier("redis")
    assert stats.breaker_open == 0 and stats.errors == 2 and stats.hits == 2
    tier.close()


@pytest.mark.slow
def test_stalled_server_costs_one_timeout_per_interval(
    redis_process_factory: Callable[[], Any],
) -> None:
    server = redis_process_factory()
    clock = FakeClock()
    tier = RedisTier(server.url, socket_timeout=0.25)
    chain = TierChain([tier], retry_interval=5.0, clock=clock, max_pending_write_bytes=0)
    chain.save(key(0), VALUE)
    os.kill(server.process.pid, signal.SIGSTOP)  # alive but answering nothing
    try:
        assert all(load(chain, key(0)) is None for _ in range(20))
        clock.now += 5.0
        assert all(load(chain, key(0)) is None for _ in range(20))
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    # One call per interval reached the server and timed out; the other 38 never touched the
    # network (counted, not timed: wall-clock asserts would flake on a loaded machine).
    stats = chain.stats().tier("redis")
    assert (stats.errors, stats.skipped) == (2, 38)
    clock.now += 5.0
    assert np.array_equal(load(chain, key(0)), VALUE)  # used again once it answers
    tier.close()


def test_two_namespaces_sharing_a_server_never_see_each_other(redis_server: Any, redis_prefix: str) -> None:
    digest = bytes(32)
    keys_a, keys_b = KeyBuilder("model-a"), KeyBuilder("model-a", salt="tenant-2")
    chain_a = TierChain([RedisTier(redis_server.url, key_prefix=redis_prefix)])
    chain_b = TierChain([RedisTier(redis_server.url, key_prefix=redis_prefix)])
    chain_a.save(keys_a.key("embedding", [digest]), VALUE)
    assert load(chain_b, keys_b.key("embedding", [digest])) is None
    assert np.array_equal(load(chain_a, keys_a.key("embedding", [digest])), VALUE)
    # and a different key prefix separates deployments even for the same key
    other = TierChain([RedisTier(redis_server.url, key_prefix=redis_prefix + "other:")])
    assert load(other, keys_a.key("embedding", [digest])) is None


def test_ttl_is_set(redis_server: Any, redis_prefix: str) -> None:
    tier = RedisTier(redis_server.url, key_prefix=redis_prefix, ttl_seconds=30)
    tier.put(key(7), b"blob")
    client = redis.Redis.from_url(redis_server.url)
    assert 0 < client.ttl(redis_prefix + key(7)) <= 30
    client.close()


def test_keys_lists_only_this_prefix(redis_server: Any, redis_prefix: str) -> None:
    mine = RedisTier(redis_server.url, key_prefix=redis_prefix + "[glob]*:")
    theirs = RedisTier(redis_server.url, key_prefix=redis_prefix + "[glob]x:")
    mine.put(key(1), b"a")
    theirs.put(key(2), b"b")
    assert list(mine.keys()) == [key(1)]
    assert mine.stored_bytes([key(1)]) > 0


def test_writes_skipped_by_an_open_breaker_are_not_counted_as_stored() -> None:
    # Regression: a put skipped by the open breaker used to count as a write and report success.
    from tests.tiers.conftest import free_port

    tier = RedisTier(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens
    chain = TierChain([tier], retry_interval=60.0)
    assert chain.save("tag/embedding/" + "00" * 32, np.zeros(4)) is False  # fails, opens the breaker
    assert chain.save("tag/embedding/" + "11" * 32, np.zeros(4)) is False  # skipped, not tried
    stats = chain.stats().tier("redis")
    assert (stats.writes, stats.errors, stats.skipped) == (0, 1, 1)
