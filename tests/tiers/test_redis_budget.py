"""RedisTier's byte budget (`RedisBudget`) against a real redis-server: the values under a prefix
stay within ``max_bytes`` whoever writes them, least recently used evicted first."""

from __future__ import annotations

from tests.support.optional import skip_without

skip_without("redis", "redis")

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis

from tests.support.threads import run_threads
from tests.support.tier_reads import load
from tests.tiers.conftest import key
from visioncache.errors import ConfigurationError
from visioncache.tiers import TierSettings
from visioncache.tiers.chain import TierChain
from visioncache.tiers.redis import RedisTier
from visioncache.tiers.redis_budget import INDEX_PREFIX

BLOB = 1000  # bytes per value below


@pytest.fixture
def client(redis_server: Any) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_server.url)
    yield connection
    connection.close()


def stored(client: redis.Redis, prefix: str) -> dict[str, int]:
    """The values under ``prefix`` as the server holds them: key -> length."""
    names = list(client.scan_iter(match=prefix + "*"))
    return {name.decode()[len(prefix) :]: int(client.strlen(name)) for name in names}


def test_values_stay_within_the_budget_and_the_least_recently_read_go_first(
    redis_server: Any, redis_prefix: str, client: redis.Redis
) -> None:
    tier = RedisTier(redis_server.url, key_prefix=redis_prefix, max_bytes=5 * BLOB)
    for index in range(5):
        tier.put(key(index), bytes([index]) * BLOB)
    assert tier.get(key(0)) == bytes([0]) * BLOB  # read: now the most recently used
    assert tier.get_many([key(1), key(99)]) == [bytes([1]) * BLOB, None]
    for index in range(5, 8):
        tier.put(key(index), bytes([index]) * BLOB)
        assert sum(stored(client, redis_prefix).values()) <= 5 * BLOB
    assert set(stored(client, redis_prefix)) == {key(index) for index in (0, 1, 5, 6, 7)}
    assert tier.budget_bytes() == 5 * BLOB
    tier.put(key(5), b"x" * 10)  # a smaller value under a kept key: counted once, by its new size
    assert tier.budget_bytes() == 4 * BLOB + 10
    tier.delete(key(6))
    assert tier.budget_bytes() == 3 * BLOB + 10 and tier.get(key(6)) is None
    tier.close()


def test_a_value_larger_than_the_budget_is_not_kept_and_drops_the_older_value_of_its_key(
    redis_server: Any, redis_prefix: str, client: redis.Redis
) -> None:
    tier = RedisTier(redis_server.url, key_prefix=redis_prefix, max_bytes=2 * BLOB)
    tier.put(key(1), b"a" * BLOB)
    tier.put(key(2), b"b" * BLOB)
    tier.put(key(1), b"c" * (3 * BLOB))  # over the whole budget: not stored, the old value is stale
    assert tier.get(key(1)) is None and tier.get(key(2)) == b"b" * BLOB
    assert stored(client, redis_prefix) == {key(2): BLOB} and tier.budget_bytes() == BLOB
    tier.close()


def test_hosts_sharing_a_prefix_share_one_budget_under_concurrent_writes(
    redis_server: Any, redis_prefix: str, client: redis.Redis
) -> None:
    budget = 20 * BLOB
    tiers = [RedisTier(redis_server.url, key_prefix=redis_prefix, max_bytes=budget) for _ in range(4)]
    errors: list[BaseException] = []

    def write(worker: int) -> None:
        try:
            for index in range(60):
                tiers[worker].put(key(worker * 1000 + index), bytes([worker]) * (BLOB + index))
                tiers[(worker + 1) % 4].get(key(worker * 1000 + index // 2))
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    run_threads(write, 4)
    assert not errors
    held = stored(client, redis_prefix)
    assert 0 < sum(held.values()) <= budget
    # The index agrees with the data: the total is the sum of what is held, each key recorded once.
    sizes = {
        name.decode()[len(redis_prefix) :]: int(size)
        for name, size in client.hgetall(INDEX_PREFIX + redis_prefix + "sizes").items()
    }
    assert sizes == held and tiers[0].budget_bytes() == sum(held.values())
    assert client.zcard(INDEX_PREFIX + redis_prefix + "uses") == len(held)
    assert not any(name.startswith(INDEX_PREFIX) for name in tiers[0].keys())  # noqa: SIM118 (a tier, not a dict)
    for tier in tiers:
        tier.close()


def test_a_budgeted_chain_round_trips_verified_values(redis_server: Any, redis_prefix: str) -> None:
    settings = TierSettings.from_env(
        {
            "VISIONCACHE_REDIS_URL": redis_server.url,
            "VISIONCACHE_REDIS_PREFIX": redis_prefix,
            "VISIONCACHE_REDIS_MAX_BYTES": "64KiB",
            "VISIONCACHE_HMAC_SECRET": "budget-test-secret",
        }
    )
    chain = settings.build_chain()
    assert isinstance(chain, TierChain)
    tier = chain.tiers[0]
    assert isinstance(tier, RedisTier) and tier.max_bytes == 64 * 1024
    value = np.arange(1000, dtype=np.float32)  # 4,000 bytes of data: 16 such blobs fit
    for index in range(40):
        assert chain.save(key(index), value + index)
    chain.flush()
    assert np.array_equal(load(chain, key(39)), value + 39)
    assert load(chain, key(0)) is None  # evicted by the budget
    assert 0 < (tier.budget_bytes() or 0) <= 64 * 1024
    chain.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_bytes": 2**20, "cluster": True}, "needs one server"),
        ({"max_bytes": 0}, "RedisTier max_bytes"),
        ({"max_bytes": "lots"}, "RedisTier max_bytes"),
    ],
)
def test_a_budget_that_cannot_hold_is_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RedisTier("redis://127.0.0.1:1/0", **options)
