"""TierChain: read-through with promotion, write-through, failures and corruption contained."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from visioncache.errors import ConfigurationError
from visioncache.serialization import dumps
from visioncache.tiers.chain import NAMESPACE_PREFIX, TierChain, namespace_name
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.memory import MemoryTier

KEY = "0123456789abcdef/embedding/" + "cd" * 32
VALUE = np.arange(12, dtype=np.float32).reshape(3, 4)


class BrokenTier:
    """A tier whose every operation raises, as a full disk or a dropped connection would."""

    name = "broken"

    def get(self, key: str) -> bytes | None:
        raise OSError("disk on fire")

    def put(self, key: str, blob: bytes) -> None:
        raise OSError("disk on fire")

    def delete(self, key: str) -> None:
        raise OSError("disk on fire")

    def contains(self, key: str) -> bool:
        raise OSError("disk on fire")

    def stats(self) -> dict[str, int | float]:
        raise OSError("disk on fire")

    def close(self) -> None:
        raise OSError("disk on fire")


def test_lower_hit_is_promoted_into_tiers_that_missed(tmp_path: Path) -> None:
    upper, lower = MemoryTier(2**20, name="upper"), DiskTier(tmp_path / "disk", 2**24)
    chain = TierChain([upper, lower])
    assert chain.save(KEY, VALUE)
    upper.delete(KEY)
    assert np.array_equal(chain.load(KEY), VALUE)
    stats = chain.stats()
    assert (stats["upper"]["misses"], stats["disk"]["hits"], stats["upper"]["promotions"]) == (1, 1, 1)
    assert upper.contains(KEY)
    assert np.array_equal(chain.load(KEY), VALUE)
    assert chain.stats()["upper"]["hits"] == 1


def test_failing_tier_never_fails_a_call() -> None:
    healthy = MemoryTier(2**20)
    chain = TierChain([BrokenTier(), healthy])
    assert chain.save(KEY, VALUE)  # stored in the healthy tier
    assert np.array_equal(chain.load(KEY), VALUE)
    assert chain.load(KEY + "0") is None
    stats = chain.stats()
    assert stats["broken"]["errors"] == 3  # put, get, get (a failed tier gets no promotion)
    assert stats["memory"]["hits"] == 1
    chain.close()


def test_corrupt_upper_entry_is_deleted_and_lower_copy_served() -> None:
    upper, lower = MemoryTier(2**20, name="upper"), MemoryTier(2**20, name="lower")
    chain = TierChain([upper, lower])
    chain.save(KEY, VALUE)
    blob = upper.get(KEY)
    assert blob is not None
    upper.put(KEY, blob[:-1] + bytes([blob[-1] ^ 1]))
    assert np.array_equal(chain.load(KEY), VALUE)
    stats = chain.stats()
    assert stats["upper"]["corrupt"] == 1 and stats["upper"]["promotions"] == 1
    assert upper.get(KEY) == blob  # the intact copy replaced the corrupt one


def test_blob_moved_to_another_key_is_not_served() -> None:
    tier = MemoryTier(2**20)
    chain = TierChain([tier], secret=b"s3cret")
    chain.save(KEY, VALUE)
    other = KEY[:-1] + "0"
    tier.put(other, tier.get(KEY) or b"")
    assert chain.load(other) is None
    assert chain.stats()["memory"]["corrupt"] == 1 and not tier.contains(other)


def test_hmac_rejects_unsigned_and_foreign_signed_blobs() -> None:
    tier = MemoryTier(2**20)
    chain = TierChain([tier], secret=b"ours")
    tier.put(KEY, dumps(VALUE, context=KEY))  # written by someone without the secret
    assert chain.load(KEY) is None
    tier.put(KEY, dumps(VALUE, secret=b"theirs", context=KEY))
    assert chain.load(KEY) is None
    assert chain.stats()["memory"]["corrupt"] == 2
    chain.save(KEY, VALUE)
    assert np.array_equal(chain.load(KEY), VALUE)


def test_unserializable_value_is_counted_not_raised() -> None:
    chain = TierChain([MemoryTier(2**20)])
    assert chain.save(KEY, {"handle": object()}) is False
    assert chain.stats()["chain"]["unserializable"] == 1
    assert chain.load(KEY) is None


def test_register_namespace_writes_a_readable_record_once() -> None:
    tier = MemoryTier(2**20)
    chain = TierChain([tier])
    chain.register_namespace("0123456789abcdef", "qwen2-vl-2b/processor-v1")
    assert chain.flush(timeout=30)  # written in the background
    record = tier.get(NAMESPACE_PREFIX + "0123456789abcdef")
    assert record is not None and namespace_name(record) == "qwen2-vl-2b/processor-v1"
    tier.delete(NAMESPACE_PREFIX + "0123456789abcdef")
    chain.register_namespace("0123456789abcdef", "qwen2-vl-2b/processor-v1")
    assert chain.flush(timeout=30)
    assert not tier.contains(NAMESPACE_PREFIX + "0123456789abcdef")  # once per process
    assert namespace_name(b"not json") is None


def test_duplicate_tier_names_are_refused() -> None:
    with pytest.raises(ConfigurationError):
        TierChain([MemoryTier(1), MemoryTier(1)])


def test_from_env(tmp_path: Path) -> None:
    assert TierChain.from_env(environ={}) is None
    env = {
        "VISIONCACHE_DISK_DIR": str(tmp_path / "disk"),
        "VISIONCACHE_DISK_MAX_BYTES": "3MiB",
        "VISIONCACHE_REDIS_URL": "redis://127.0.0.1:1/0",
        "VISIONCACHE_REDIS_PREFIX": "vc-test:",
        "VISIONCACHE_REDIS_TTL": "60",
        "VISIONCACHE_REDIS_TIMEOUT": "0.1",
        "VISIONCACHE_HMAC_SECRET": "k",
    }
    chain = TierChain.from_env(environ=env)
    assert chain is not None
    disk, remote = chain.tiers
    assert disk.stats()["max_bytes"] == 3 * 2**20
    assert (remote.name, remote.key_prefix, remote.ttl_seconds) == ("redis", "vc-test:", 60)  # type: ignore[attr-defined]
    assert chain.save(KEY, VALUE)  # nothing listens on port 1: Redis fails, disk stores
    assert np.array_equal(chain.load(KEY), VALUE)
    assert chain.stats()["redis"]["errors"] == 1  # then its breaker skips it
    chain.close()
    for name, bad in (("VISIONCACHE_DISK_MAX_BYTES", "2 parsecs"), ("VISIONCACHE_REDIS_TTL", "soon")):
        with pytest.raises(ConfigurationError, match=name):
            TierChain.from_env(environ={**env, name: bad})
