"""A scheduler step's missing images are read from Redis in one round trip per node.

Round trips are counted where they happen: every request redis-py sends on a connection is one
``send_packed_command`` (a pipeline sends all its commands in one). Only the calling thread's
requests to the servers under test are counted (background writes are left out), and a new
connection's handshake is setup, not a read.
"""

from __future__ import annotations

from tests.support.optional import skip_without

skip_without("redis", "redis")

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import redis
import redis.connection

from tests.conftest import encode_image, random_image
from visioncache import VisionEmbeddingCache
from visioncache.tiers.redis import RedisTier

STEP = 32  # images in one scheduler step
# A new connection's handshake (HELLO, CLIENT SETINFO ...) is setup, not the step's reads.
SETUP = re.compile(rb"\*\d+\r\n\$\d+\r\n(HELLO|CLIENT|AUTH|SELECT)\r\n", re.IGNORECASE)


class RoundTrips:
    """Requests sent to ``ports`` by the thread that created this counter."""

    def __init__(self, ports: set[int]) -> None:
        self.ports = ports
        self.thread = threading.get_ident()
        self.sent: list[int] = []  # the port of each request

    @contextmanager
    def counting(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[RoundTrips]:
        original = redis.connection.AbstractConnection.send_packed_command
        counter = self

        def send_packed_command(connection: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
            packed = command if isinstance(command, bytes | bytearray) else b"".join(command)
            ours = (
                threading.get_ident() == counter.thread and getattr(connection, "port", None) in counter.ports
            )
            if ours and not SETUP.match(packed):
                counter.sent.append(connection.port)
            return original(connection, command, *args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(redis.connection.AbstractConnection, "send_packed_command", send_packed_command)
            yield self


def images(first: int, count: int) -> list[bytes]:
    return [encode_image(random_image(seed)) for seed in range(first, first + count)]


def encode(batch: list[bytes]) -> list[np.ndarray]:
    return [np.full((2, 4), len(item), np.float32) for item in batch]


def step_requests(batch: list[bytes]) -> list[list[bytes]]:
    """A scheduler step: the images spread over requests of 1 to 5 images."""
    requests, start = [], 0
    for size in [1, 5, 3, 4, 2] * 10:
        if start >= len(batch):
            break
        requests.append(batch[start : start + size])
        start += size
    return requests


def command_calls(client: redis.Redis, command: str) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_thirty_two_missing_images_are_one_mget(
    redis_process_factory: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = redis_process_factory()  # a server of its own: its command counts are this test's
    client = redis.Redis.from_url(server.url)
    cache = VisionEmbeddingCache(tiers=[RedisTier(server.url)])
    cache.get_image_embeddings(images(0, 1))  # connect first: the connection is not the step's
    mget, get = command_calls(client, "mget"), command_calls(client, "get")
    with RoundTrips({server.port}).counting(monkeypatch) as trips:
        results = cache.encode_batch(step_requests(images(1000, STEP)), encode)
    assert sum(len(result) for result in results) == STEP
    assert len(trips.sent) == 1  # one round trip for 32 misses, not 32
    assert (command_calls(client, "mget") - mget, command_calls(client, "get") - get) == (1, 0)
    assert cache.tiers is not None and cache.tiers.flush(timeout=30)
    reader = VisionEmbeddingCache(tiers=[RedisTier(server.url)])
    reader.get_image_embeddings(images(0, 1))
    with RoundTrips({server.port}).counting(monkeypatch) as trips:
        hits = reader.encode_batch(step_requests(images(1000, STEP)), encode)  # all from Redis now
    assert len(trips.sent) == 1 and reader.get_stats()["tiers"]["redis"]["hits"] == STEP
    assert [value[0, 0] for result in hits for value in result] == [len(item) for item in images(1000, STEP)]
    client.close()


@pytest.mark.slow
def test_thirty_two_missing_images_are_one_pipeline_per_cluster_node(
    redis_cluster: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = RedisTier(redis_cluster.url, cluster=True, key_prefix=redis_prefix)
    cache = VisionEmbeddingCache(tiers=[tier])
    # A first step reads the slot map and opens a connection to each node (handshakes are round
    # trips too, once per connection); the step measured is the next one.
    cache.encode_batch(step_requests(images(3000, STEP)), encode)
    assert cache.tiers is not None and cache.tiers.flush(timeout=30)
    with RoundTrips(set(redis_cluster.ports)).counting(monkeypatch) as trips:
        cache.encode_batch(step_requests(images(2000, STEP)), encode)
    # 32 keys hash to (almost surely) every node; each node is asked once, whatever its key count.
    assert sorted(trips.sent) == sorted(set(trips.sent)) and 1 <= len(trips.sent) <= len(redis_cluster.ports)
    assert len(trips.sent) == len(redis_cluster.ports)
