"""Regression tests of the shared tiers (docs/guarantees.md): forks, wrong-type keys, start-up errors,
keys that reveal nothing, unsigned tiers, rotation, crafted blobs.

Each test is named after the defect it pins; ``#11.N`` in a docstring is the item of the project's
issue tracker that reported it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import safetensors.numpy
import torch

from tests.conftest import encode_image, random_image
from tests.support.memory_tier import MemoryTier
from tests.support.tier_reads import contains
from visioncache import PixelOnlyCacheEntry, VisionEmbeddingCache, compute_image_hash
from visioncache.errors import CorruptEntryError
from visioncache.identity.keys import DEFAULT_NAMESPACE, KeyBuilder
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.redis import RedisTier
from visioncache.tiers.serialization import FORMAT, FORMAT_VERSION, loads

REPOSITORY = Path(__file__).parents[2]
JOIN_SECONDS = 60.0


def image(seed: int) -> bytes:
    return encode_image(random_image(seed))


def value_of(item: bytes) -> np.ndarray:
    """The value a correct encoder gives ``item``: its digest's bytes (so it names the image)."""
    return np.frombuffer(bytes.fromhex(compute_image_hash(item)), np.uint8).astype(np.float32).reshape(4, 8)


class Encoder:
    def __init__(self) -> None:
        self.encoded = 0

    def __call__(self, images: list[bytes]) -> list[np.ndarray]:
        self.encoded += len(images)
        return [value_of(item) for item in images]


def must_not_encode(images: list[bytes]) -> list[np.ndarray]:
    raise AssertionError(f"encoded {len(images)} images that a shared tier holds")


def preprocess(images: list[bytes]) -> list[PixelOnlyCacheEntry]:
    return [PixelOnlyCacheEntry(value_of(item), (1, 2, 2)) for item in images]


def all_correct(values: list[Any], images: list[bytes]) -> bool:
    return len(values) == len(images) and all(
        value is not None and np.array_equal(value, value_of(item))
        for value, item in zip(values, images, strict=True)
    )


# ---- #11.4: write-behind dies in a forked child -------------------------------------------------
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


# ---- #11.6: one wrong-type Redis key switches the tier off --------------------------------------
@pytest.fixture(params=["redis", pytest.param("cluster", marks=pytest.mark.slow)])
def redis_url(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """(URL, cluster?) of a real standalone server or a real 3-node cluster."""
    if request.param == "redis":
        return request.getfixturevalue("redis_server").url, False
    return request.getfixturevalue("redis_cluster").url, True


def test_regression_wrongtype_redis_key_is_one_bad_entry_not_an_outage(
    redis_url: tuple[str, bool], redis_prefix: str
) -> None:
    """#11.6: a key of another type (WRONGTYPE) at one image's name made GET raise, which opened
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


# ---- #11.8: start-up and tier errors that escape -------------------------------------------------
def test_regression_garbage_cache_db_is_a_failing_tier_not_a_start_up_error(tmp_path: Path) -> None:
    """#11.8: a garbage ``cache.db`` made ``DiskTier(...)`` raise sqlite3.DatabaseError, so a
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
    """#11.8: with synchronous tier writes, only `UnserializableValueError` was caught, so any other
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


# ---- #11.9: tier keys reveal which images were processed ----------------------------------------
@pytest.mark.parametrize("tenancy", ["salt", "secret"])
def test_regression_tier_keys_reveal_which_images_were_processed(
    tenancy: str, redis_server: Any, redis_prefix: str, tmp_path: Path
) -> None:
    """#11.9: tier keys held the plain image digest, so anyone who can list a shared tier's keys
    could test whether any tenant processed a known image. With a salt or an HMAC secret, the
    digest part is keyed: unlinkable across tenants and unguessable without the salt/secret."""
    known = image(700)
    digest = bytes.fromhex(compute_image_hash(known))

    def tenant(name: str) -> VisionEmbeddingCache:
        tiers = [DiskTier(tmp_path / "disk"), RedisTier(redis_server.url, key_prefix=redis_prefix)]
        if tenancy == "salt":
            return VisionEmbeddingCache(salt=name, tiers=tiers)
        return VisionEmbeddingCache(tiers=TierChain(tiers, secret=name.encode()))

    for name in ("tenant-a", "tenant-b"):
        cache = tenant(name)
        cache.encode_images([known], Encoder())
        cache.preprocess_images([known], preprocess)
        cache.set_pixel_cache([known], "describe it", value_of(known), np.arange(4))
        cache.close()

    plain = KeyBuilder(DEFAULT_NAMESPACE)  # what an observer without the salt or secret can compute
    guessable = {plain.image_key(level, digest) for level in ("embedding", "pixel_only")}
    guessable.add(plain.key("pixel", [digest], "describe it"))
    for listed in (
        DiskTier(tmp_path / "disk").keys(),
        RedisTier(redis_server.url, key_prefix=redis_prefix).keys(),
    ):
        keys = [key for key in listed if not key.startswith("__namespaces__/")]
        assert len(keys) == 6  # two tenants x three levels, none shared
        assert not any(digest.hex() in key for key in keys), keys
        assert not guessable & set(keys)
        embedding_digests = {key.rsplit("/", 1)[1] for key in keys if "/embedding/" in key}
        assert len(embedding_digests) == 2  # even the digest parts differ between tenants


# ---- #11.10: unsigned shared tiers trust every writer -------------------------------------------
def test_regression_unsigned_network_tier_warns_once_per_process(tmp_path: Path) -> None:
    """#11.10: a shared network tier without an HMAC secret lets anyone who can write to it plant
    values, silently. Now an `UnsignedTierWarning`, once per process; none with a secret, none for
    a host-local disk tier."""
    script = textwrap.dedent(f"""
        import json, warnings
        warnings.simplefilter("always")
        from visioncache import VisionEmbeddingCache
        from visioncache.tiers.chain import TierChain
        from visioncache.tiers.disk import DiskTier
        from visioncache.tiers.redis import RedisTier

        url = "redis://127.0.0.1:1/0"  # never contacted: constructing opens nothing
        counts = {{}}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            TierChain([DiskTier({str(tmp_path)!r})])
            VisionEmbeddingCache(tiers=[DiskTier({str(tmp_path)!r})])
            counts["disk"] = len(caught)
            TierChain([RedisTier(url)], secret=b"s")
            TierChain([DiskTier({str(tmp_path)!r}), RedisTier(url)], secrets=[b"new", b"old"])
            counts["signed"] = len(caught)
            TierChain([RedisTier(url)])
            VisionEmbeddingCache(tiers=[RedisTier(url)])
            TierChain([RedisTier(url, cluster=True)])
            counts["unsigned"] = len(caught)
            counts["categories"] = sorted({{warning.category.__name__ for warning in caught}})
        print(json.dumps(counts))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPOSITORY
    )
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    assert counts == {"disk": 0, "signed": 0, "unsigned": 1, "categories": ["UnsignedTierWarning"]}


# ---- #11.11: secret rotation ---------------------------------------------------------------------
def test_regression_rotating_fleets_share_a_server_without_evicting_each_other(
    redis_server: Any, redis_prefix: str
) -> None:
    """#11.11: a reader holding another secret deleted (and overwrote) every signed entry it read,
    so two fleets mid-rotation evicted each other. Now the new fleet (``[new, old]``) reads the old
    fleet's entries, and neither fleet's reads remove the other's."""

    def host(*secrets: str) -> VisionEmbeddingCache:
        tier = RedisTier(redis_server.url, key_prefix=redis_prefix)
        return VisionEmbeddingCache(tiers=TierChain([tier], secrets=[item.encode() for item in secrets]))

    old_batch, new_batch = (
        [image(seed) for seed in range(800, 803)],
        [image(seed) for seed in range(803, 806)],
    )
    old_host = host("old")
    old_host.encode_images(old_batch, Encoder())
    old_host.close()
    new_host = host("new", "old")
    assert all_correct(new_host.encode_images(old_batch, must_not_encode), old_batch)  # accepted
    new_host.encode_images(new_batch, Encoder())  # signed with "new"
    new_host.close()

    old_again, encoder = host("old"), Encoder()
    assert all_correct(old_again.encode_images(new_batch, encoder), new_batch)
    assert encoder.encoded == 3  # the old fleet cannot verify "new" entries: it encodes them ...
    old_again.close()
    for fresh in (host("new", "old"), host("old")):  # ... and removed nothing of either fleet's
        assert all_correct(fresh.encode_images(old_batch, must_not_encode), old_batch)
    assert all_correct(host("new", "old").encode_images(new_batch, must_not_encode), new_batch)
    listed = list(RedisTier(redis_server.url, key_prefix=redis_prefix).keys())
    stored = [key for key in listed if "/embedding/" in key]
    assert len(stored) == 9  # old: 3 old + 3 new batch; new: 3 new batch; nothing deleted


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
    """#11: a crafted blob whose digest is not ASCII made `hmac.compare_digest` raise TypeError,
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
