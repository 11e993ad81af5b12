"""RedisTier with ``cluster=True`` against a real 3-master Redis Cluster on loopback."""

from __future__ import annotations

from tests.support.optional import skip_without

skip_without("redis", "redis")

import os
import signal
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import redis

from tests.conftest import encode_image, random_image
from tests.support.tier_reads import contains, load
from tests.tiers.conftest import VALUE, FakeClock, free_port, key
from visioncache import VisionEmbeddingCache
from visioncache.cli import main
from visioncache.identity.keys import KeyBuilder
from visioncache.tiers.chain import TierChain
from visioncache.tiers.redis import RedisTier


def unique_prefix() -> str:
    """A prefix without glob characters, so a plain per-node SCAN can match it literally."""
    return f"cluster-test:{uuid.uuid4().hex}:"


def keys_per_node(cluster: Any, prefix: str) -> dict[int, int]:
    """How many keys under ``prefix`` each node holds, read with a plain (non-cluster) client per node."""
    counts = {}
    for port in cluster.ports:
        node = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2.0)
        counts[port] = sum(1 for _ in node.scan_iter(match=prefix + "*", count=1000))
        node.close()
    return counts


@pytest.mark.slow
def test_keys_spread_over_every_node_round_trip(redis_cluster: Any) -> None:
    prefix = unique_prefix()
    tier = RedisTier(redis_cluster.url, cluster=True, key_prefix=prefix, socket_timeout=2.0)
    blobs = {key(index): index.to_bytes(2, "big") * 100 for index in range(50)}
    for name, blob in blobs.items():
        tier.put(name, blob)
    assert {name: tier.get(name) for name in blobs} == blobs
    assert all(contains(tier, name) for name in blobs)
    counts = keys_per_node(redis_cluster, prefix)
    assert sum(counts.values()) == 50 and all(count > 0 for count in counts.values()), counts
    tier.close()


@pytest.mark.slow
def test_keys_and_stored_bytes_read_every_node(redis_cluster: Any) -> None:
    prefix = unique_prefix()
    tier = RedisTier(redis_cluster.url, cluster=True, key_prefix=prefix, socket_timeout=2.0)
    other = RedisTier(redis_cluster.url, cluster=True, key_prefix=unique_prefix(), socket_timeout=2.0)
    names = [key(index) for index in range(30)]
    for name in names:
        tier.put(name, bytes(1000))
    other.put(key(99), bytes(1000))  # another prefix: neither listed nor counted
    assert min(keys_per_node(redis_cluster, prefix).values()) > 0  # so a one-node read would miss some
    listed = list(tier.keys())
    assert sorted(listed) == sorted(names)  # each key once, prefix removed, from every node
    nbytes = tier.stored_bytes(listed)
    assert 30 * 1000 <= nbytes < 30 * 2000
    assert tier.stored_bytes([]) == 0
    tier.close()
    other.close()


@pytest.mark.slow
def test_stats_command_reads_the_whole_cluster(
    redis_cluster: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix = unique_prefix()
    tier = RedisTier(redis_cluster.url, cluster=True, key_prefix=prefix, socket_timeout=2.0)
    first, second = KeyBuilder("qwen2-vl/a"), KeyBuilder("qwen2-vl/b")
    chain = TierChain([tier])
    for builder in (first, second):
        chain.register_namespace(builder.tag, builder.namespace)
    for index in range(20):
        assert chain.save(first.key("embedding", [bytes([index]) * 32]), np.zeros(1000, np.float32))
    assert chain.save(second.key("pixel_only", [bytes(32)]), np.zeros(10, np.float32))
    assert chain.flush(timeout=30)  # namespace records are written in the background
    assert min(keys_per_node(redis_cluster, prefix).values()) > 0
    tier.close()

    assert main(["stats", "--redis", redis_cluster.url, "--prefix", prefix, "--cluster"]) == 0
    output = capsys.readouterr().out
    assert "redis cluster tier" in output and "21 entries" in output.splitlines()[0]
    assert "namespaces: 2" in output
    assert f"{first.tag}  qwen2-vl/a  20 entries  embedding=20" in output
    assert f"{second.tag}  qwen2-vl/b  1 entries  pixel_only=1" in output
    # Without --cluster, one node holds only some keys: the command refuses instead of undercounting.
    assert main(["stats", "--redis", redis_cluster.url, "--prefix", prefix]) == 2
    assert "add --cluster" in capsys.readouterr().err
    nbytes = int(output.splitlines()[0].split(" entries, ")[1].split(" bytes")[0])
    assert nbytes > 20 * 4000  # MEMORY USAGE summed over every node, not one


def test_a_cluster_that_is_down_at_start_fails_no_request() -> None:
    """RedisCluster connects in its constructor; the tier must not raise, and the breaker must open."""
    clock = FakeClock()
    tier = RedisTier(f"redis://127.0.0.1:{free_port()}/0", cluster=True)  # nothing listens
    chain = TierChain([tier], clock=clock, max_pending_write_bytes=0)
    assert [load(chain, key(index)) for index in range(20)] == [None] * 20
    chain.save(key(0), VALUE)  # skipped by the open breaker, no exception
    stats = chain.stats().tier("redis")
    assert stats.errors == 1 and stats.breaker_open == 1 and stats.skipped == 20
    tier.close()


@pytest.fixture(scope="module")
def spare_cluster(redis_cluster_factory: Callable[[], Any]) -> Iterator[Any]:
    """A cluster of its own, for tests that stall or kill it."""
    cluster = redis_cluster_factory()
    yield cluster
    cluster.stop()


@pytest.mark.slow
def test_stalled_cluster_costs_one_failure_per_interval(spare_cluster: Any) -> None:
    clock = FakeClock()
    tier = RedisTier(spare_cluster.url, cluster=True, key_prefix=unique_prefix())
    chain = TierChain([tier], clock=clock, max_pending_write_bytes=0)
    assert chain.save(key(0), VALUE)
    for process in spare_cluster.processes:
        os.kill(process.pid, signal.SIGSTOP)  # alive but answering nothing
    try:
        assert all(load(chain, key(0)) is None for _ in range(20))
    finally:
        for process in spare_cluster.processes:
            os.kill(process.pid, signal.SIGCONT)
    # One failed call reached the cluster (its timeout plus redis-py re-reading the slot map);
    # the other 19 never touched the network.
    stats = chain.stats().tier("redis")
    assert stats.errors == 1 and stats.skipped == 19
    clock.now += 5.0
    assert np.array_equal(load(chain, key(0)), VALUE)  # used again once it answers
    tier.close()


@pytest.mark.slow
def test_killed_cluster_costs_nothing_and_restart_brings_the_tier_back(spare_cluster: Any) -> None:
    clock = FakeClock()
    tier = RedisTier(spare_cluster.url, cluster=True, key_prefix=unique_prefix())
    chain = TierChain([tier], clock=clock, max_pending_write_bytes=0)
    assert chain.save(key(0), VALUE)
    assert np.array_equal(load(chain, key(0)), VALUE)

    spare_cluster.stop()  # kill -9 every node
    results = [load(chain, key(index % 3)) for index in range(50)]
    for index in range(50):
        chain.save(key(index), VALUE)
    assert results == [None] * 50
    stats = chain.stats().tier("redis")
    assert stats.errors == 1 and stats.breaker_open == 1 and stats.skipped == 99
    assert chain.stats().tier("redis").errors == 1
    clock.now += 5.0  # one probe per interval, and it fails again
    assert load(chain, key(0)) is None and load(chain, key(0)) is None
    assert chain.stats().tier("redis").errors == 2

    spare_cluster.start()  # same ports; nodes-P.conf rejoins the cluster, empty
    clock.now += 5.0
    assert chain.save(key(1), VALUE)
    assert np.array_equal(load(chain, key(1)), VALUE)
    assert chain.stats().tier("redis").breaker_open == 0
    tier.close()


@pytest.mark.slow
def test_second_cache_sharing_the_cluster_hits_without_encoding(redis_cluster: Any) -> None:
    prefix = unique_prefix()
    batch = [encode_image(random_image(seed)) for seed in range(6)]
    calls: list[int] = []

    def encode(images: list[bytes]) -> list[np.ndarray]:
        calls.append(len(images))
        return [np.full((3, 4), len(image), np.float32) for image in images]

    first = VisionEmbeddingCache(tiers=[RedisTier(redis_cluster.url, cluster=True, key_prefix=prefix)])
    expected = first.encode_images(batch, encode)
    assert sum(calls) == 6
    assert first.tiers is not None and first.tiers.flush(timeout=30)  # writes go out in the background
    assert sum(keys_per_node(redis_cluster, prefix).values()) >= 6  # written through to the cluster

    def must_not_encode(images: list[bytes]) -> list[np.ndarray]:
        raise AssertionError(f"encoded {len(images)} images despite the shared cluster")

    second = VisionEmbeddingCache(tiers=[RedisTier(redis_cluster.url, cluster=True, key_prefix=prefix)])
    got = second.encode_images(batch, must_not_encode)
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))
    stats = second.snapshot()
    assert stats.levels["embedding"].hits == 6 and stats.levels["embedding"].misses == 0
    assert stats.tiers is not None
    assert stats.tiers.tier("redis").hits == 6 and stats.tiers.tier("redis").errors == 0
