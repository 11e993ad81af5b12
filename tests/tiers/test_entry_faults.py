"""One bad entry, or one broken tier, is one miss, never an outage: a wrong-type Redis key, a garbage
database, a value that cannot be serialised, a crafted blob; and forked children's writes behind
reach the tier (docs/guarantees.md: faults in a shared tier never fail a request)."""

from __future__ import annotations

from tests.support.optional import skip_without

skip_without("redis", "redis")

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import safetensors.numpy
import torch

from tests.support.memory_tier import MemoryTier
from tests.support.tier_reads import contains
from tests.support.tier_values import (
    JOIN_SECONDS,
    Encoder,
    all_correct,
    image,
    must_not_encode,
)
from visioncache import VisionEmbeddingCache
from visioncache.errors import CorruptEntryError
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.redis import RedisTier
from visioncache.tiers.serialization import FORMAT, FORMAT_VERSION, loads


# ---- write-behind dies in a forked child -------------------------------------------------
def _child_encodes_and_closes(cache: VisionEmbeddingCache, seeds: list[int]) -> None:
    values = cache.encode_images([image(seed) for seed in seeds], Encoder())
    assert all_correct(values, [image(seed) for seed in seeds])
    cache.close()  # flushes this child's writes


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_regression_forked_children_write_behind_reaches_the_disk_tier(tmp_path: Path) -> None:
    """#11.4 (pre-fork servers): a child inherited a "started" writer with no thread, so nothing it
    wrote reached the tier and its exit waited 10 s. Children's writes must reach the disk."""
    directory = tmp_path / "disk"
    cache = VisionEmbeddingCache(tiers=[DiskTier(directory)])
    parent_images = [image(seed) for seed in range(3)]
    cache.encode_images(parent_images, Encoder())  # the parent's writer thread is running
    assert cache.tiers is not None and cache.tiers.flush(timeout=30)

    context = multiprocessing.get_context("fork")
    children_seeds = [[100, 101, 102], [200, 201, 202]]
    children = [
        context.Process(target=_child_encodes_and_closes, args=(cache, seeds)) for seeds in children_seeds
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(JOIN_SECONDS)
        assert child.exitcode == 0, f"child exit code {child.exitcode}"

    cache.encode_images([image(300)], Encoder())  # the parent's own writer still works after the fork
    assert cache.tiers.flush(timeout=30)
    reader = VisionEmbeddingCache(tiers=[DiskTier(directory)])
    expected = [image(seed) for seeds in children_seeds for seed in seeds] + [image(300)] + parent_images
    assert all_correct(reader.get_image_embeddings(expected), expected)


# ---- one wrong-type Redis key switches the tier off --------------------------------------
@pytest.fixture(params=["redis", pytest.param("cluster", marks=pytest.mark.slow)])
def redis_url(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """(URL, cluster?) of a real standalone server or a real 3-node cluster."""
    if request.param == "redis":
        return request.getfixturevalue("redis_server").url, False
    return request.getfixturevalue("redis_cluster").url, True


def test_regression_wrongtype_redis_key_is_one_bad_entry_not_an_outage(
    redis_url: tuple[str, bool], redis_prefix: str
) -> None:
    """A key of another type (WRONGTYPE) at one image's name made GET raise, which opened
    the breaker for every key, and the key was never replaced. Now it is a miss for that key only,
    overwritten by the next write, and the tier stays up for the others."""
    url, cluster = redis_url
    client: Any = redis.RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    bad, *good = [image(seed) for seed in range(400, 404)]
    cache = VisionEmbeddingCache(tiers=[RedisTier(url, key_prefix=redis_prefix, cluster=cluster)])
    name = redis_prefix + str(cache.key("embedding", [bad]))
    client.hset(name, "planted", "a hash where a blob belongs")

    assert all_correct(cache.encode_images([bad, *good], Encoder()), [bad, *good])
    assert cache.tiers is not None and cache.tiers.flush(timeout=30)
    stats = cache.get_stats()["tiers"]["redis"]
    assert stats["errors"] == 0 and not stats["breaker_open"] and stats["misses"] == 4
    assert client.type(name) == b"string"  # the next write replaced the foreign key
    reader = VisionEmbeddingCache(tiers=[RedisTier(url, key_prefix=redis_prefix, cluster=cluster)])
    assert all_correct(reader.encode_images([bad, *good], must_not_encode), [bad, *good])

    # The tier itself: a batched read answers per key; a single GET names the key as corrupt.
    client.delete(name)
    client.hset(name, "planted", "again")
    tier = RedisTier(url, key_prefix=redis_prefix, cluster=cluster)
    good_name = str(cache.key("embedding", [good[0]]))
    blobs = tier.get_many([name.removeprefix(redis_prefix), good_name])
    assert blobs[0] is None and blobs[1] is not None
    with pytest.raises(CorruptEntryError):
        tier.get(name.removeprefix(redis_prefix))
    client.close()
    tier.close()


# ---- start-up and tier errors that escape -------------------------------------------------
def test_regression_garbage_cache_db_is_a_failing_tier_not_a_start_up_error(tmp_path: Path) -> None:
    """A garbage ``cache.db`` made ``DiskTier(...)`` raise sqlite3.DatabaseError, so a
    cache could not start. Now the first operation fails inside the chain, the breaker opens,
    requests succeed uncached, and the stats say so."""
    (tmp_path / "cache.db").write_bytes(np.random.default_rng(0).bytes(16384))
    tier = DiskTier(tmp_path)  # must not raise
    cache = VisionEmbeddingCache(tiers=[tier])
    batches = [[image(seed) for seed in range(500, 503)], [image(seed) for seed in range(503, 506)]]
    for batch in batches:
        assert all_correct(cache.encode_images(batch, Encoder()), batch)
    assert cache.tiers is not None and cache.tiers.flush(timeout=30)
    stats = cache.get_stats()
    assert stats["tiers"]["disk"]["errors"] == 1 and stats["tiers"]["disk"]["breaker_open"]
    assert stats["embedding_cache_size"] == 6  # memory works as without tiers
    cache.close()


def test_regression_serialisation_error_in_a_synchronous_write_does_not_fail_the_request() -> None:
    """With synchronous tier writes, only `UnserializableValueError` was caught, so any other
    exception while serialising (here: a meta tensor, which has no data to copy) failed a request
    whose value was already computed and in memory."""
    tier = MemoryTier(2**20)
    cache = VisionEmbeddingCache(tiers=TierChain([tier], max_pending_write_bytes=0))
    values = cache.encode_images(
        [image(600)], lambda images: [torch.zeros(3, 4, device="meta") for _ in images]
    )
    assert values[0].device.type == "meta" and values[0].shape == (3, 4)
    assert cache.get_image_embeddings([image(600)])[0] is values[0]  # kept in memory
    stats = cache.snapshot().tiers
    assert stats is not None and stats.unserializable == 1 and stats.tier("memory").errors == 0


# ---- crafted blobs -------------------------------------------------------------------------------
def crafted_blob(digest: str) -> bytes:
    metadata = {
        "format": FORMAT,
        "version": str(FORMAT_VERSION),
        "skeleton": json.dumps({"t": "array", "kind": "numpy", "dtype": "float32", "tensor": "0"}),
        "auth": "none",
        "digest": digest,
    }
    return bytes(safetensors.numpy.save({"0": np.zeros(4, np.float32)}, metadata=metadata))


def test_regression_blob_with_a_non_ascii_digest_is_a_corrupt_entry() -> None:
    """A crafted blob whose digest is not ASCII made `hmac.compare_digest` raise TypeError,
    counted as a tier failure (breaker open) instead of one corrupt entry."""
    blob = crafted_blob("é" * 64)
    with pytest.raises(CorruptEntryError):
        loads(blob, context="key")
    tier = MemoryTier(2**20)
    cache = VisionEmbeddingCache(tiers=TierChain([tier]))
    planted, other = image(900), image(901)
    tier.put(str(cache.key("embedding", [planted])), blob)
    assert cache.get_image_embeddings([planted]) == [None]
    assert cache.tiers is not None and cache.tiers.flush(timeout=30)
    stats = cache.get_stats()["tiers"]["memory"]
    assert stats["corrupt"] == 1 and stats["errors"] == 0 and not stats["breaker_open"]
    assert not contains(tier, str(cache.key("embedding", [planted])))  # deleted
    cache.encode_images([other], Encoder())  # the tier still works for everyone
    assert cache.tiers.flush(timeout=30) and contains(tier, str(cache.key("embedding", [other])))
