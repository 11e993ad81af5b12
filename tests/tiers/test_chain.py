"""TierChain: batched read-through with promotion, write-down, failures, corruption and secrets."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from tests.support.memory_tier import MemoryTier
from tests.support.tier_reads import contains, load
from visioncache.errors import ConfigurationError
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.namespaces import NAMESPACE_PREFIX, namespace_name
from visioncache.tiers.serialization import dumps
from visioncache.tiers.stats import TierSizes

KEY = "0123456789abcdef/embedding/" + "cd" * 32
VALUE = np.arange(12, dtype=np.float32).reshape(3, 4)


class BrokenTier:
    """A tier whose every operation raises, as a full disk or a dropped connection would."""

    name = "broken"
    network = False

    def __init__(self) -> None:
        self.calls = 0

    def _fail(self) -> None:
        self.calls += 1
        raise OSError("disk on fire")

    def get(self, key: str) -> bytes | None:
        self._fail()
        return None

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        self._fail()
        return []

    def put(self, key: str, blob: bytes) -> None:
        self._fail()

    def delete(self, key: str) -> None:
        self._fail()

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        self._fail()
        return []

    def sizes(self) -> TierSizes:
        raise OSError("disk on fire")

    def close(self) -> None:
        raise OSError("disk on fire")


class CountingTier(MemoryTier):
    """A memory tier that counts batched reads (round trips)."""

    def __init__(self, name: str = "memory") -> None:
        super().__init__(2**24, name=name)
        self.batches: list[int] = []

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        self.batches.append(len(keys))
        return super().get_many(keys)


def test_lower_hit_is_promoted_into_tiers_that_missed(tmp_path: Path) -> None:
    upper, lower = MemoryTier(2**20, name="upper"), DiskTier(tmp_path / "disk", 2**24)
    chain = TierChain([upper, lower])
    assert chain.save(KEY, VALUE)
    upper.delete(KEY)
    assert np.array_equal(load(chain, KEY), VALUE)
    assert chain.flush(timeout=30)  # promotions go through the background writer
    stats = chain.stats()
    assert (stats.tier("upper").misses, stats.tier("disk").hits, stats.tier("upper").promotions) == (1, 1, 1)
    assert contains(upper, KEY)
    assert np.array_equal(load(chain, KEY), VALUE)
    assert chain.stats().tier("upper").hits == 1


def test_a_batch_is_one_read_per_tier_and_only_the_missing_go_lower() -> None:
    upper, lower = CountingTier("upper"), CountingTier("lower")
    chain = TierChain([upper, lower], max_pending_write_bytes=0)
    keys = [KEY[:-2] + f"{index:02x}" for index in range(32)]
    for key in keys[:20]:
        chain.save(key, VALUE)
    for key in keys[:10]:
        upper.delete(key)
    found = chain.load_many(keys)
    assert [value is not None for value in found] == [True] * 20 + [False] * 12
    assert upper.batches == [32] and lower.batches == [22]  # one round trip each


def test_failing_tier_never_fails_a_call_and_costs_one_call_per_interval() -> None:
    healthy, broken = MemoryTier(2**20), BrokenTier()
    chain = TierChain([broken, healthy], max_pending_write_bytes=0)
    assert chain.save(KEY, VALUE)  # stored in the healthy tier; the broken one fails once
    assert np.array_equal(load(chain, KEY), VALUE)
    assert load(chain, KEY + "0") is None
    assert chain.delete(KEY + "1") == 0  # a purge of a missing key: the broken tier skipped again
    stats = chain.stats()
    assert broken.calls == 1  # then its breaker skipped it: no call, no wait
    assert (stats.tier("broken").errors, stats.tier("broken").skipped) == (1, 3)
    assert stats.tier("broken").breaker_open and stats.tier("memory").hits == 1
    chain.close()


def test_corrupt_upper_entry_is_deleted_and_lower_copy_served() -> None:
    upper, lower = MemoryTier(2**20, name="upper"), MemoryTier(2**20, name="lower")
    chain = TierChain([upper, lower])
    chain.save(KEY, VALUE)
    blob = upper.get(KEY)
    assert blob is not None
    upper.put(KEY, blob[:-1] + bytes([blob[-1] ^ 1]))
    assert np.array_equal(load(chain, KEY), VALUE)
    assert chain.flush(timeout=30)
    stats = chain.stats()
    assert stats.tier("upper").corrupt == 1 and stats.tier("upper").promotions == 1
    assert upper.get(KEY) == blob  # the intact copy replaced the corrupt one


def test_blob_moved_to_another_key_is_not_served() -> None:
    tier = MemoryTier(2**20)
    chain = TierChain([tier], max_pending_write_bytes=0)
    chain.save(KEY, VALUE)
    other = KEY[:-1] + "0"
    tier.put(other, tier.get(KEY) or b"")
    assert load(chain, other) is None
    assert chain.stats().tier("memory").corrupt == 1 and not contains(tier, other)


def test_signed_chain_keys_its_tier_keys_so_listing_reveals_no_digest() -> None:
    tier = MemoryTier(2**20)
    chain = TierChain([tier], secrets=[b"ours"], max_pending_write_bytes=0)
    assert chain.save(KEY, VALUE)
    (stored,) = chain.tier_keys(KEY)
    assert stored.startswith("0123456789abcdef/embedding/") and KEY.rsplit("/", 1)[1] not in stored
    assert contains(tier, stored) and not contains(tier, KEY)
    assert np.array_equal(load(chain, KEY), VALUE)


def test_hmac_rejects_unsigned_and_foreign_signed_blobs_without_deleting_them() -> None:
    """Defect: a reader that cannot verify an entry deleted it, so two fleets rotating
    secrets evicted each other. Now it is a miss, counted as unverified, and left in place."""
    tier = MemoryTier(2**20)
    chain = TierChain([tier], secrets=[b"ours"], max_pending_write_bytes=0)
    (name,) = chain.tier_keys(KEY)
    tier.put(name, dumps(VALUE, context=KEY))  # written by someone without the secret
    assert load(chain, KEY) is None
    tier.put(name, dumps(VALUE, secret=b"theirs", context=KEY))
    assert load(chain, KEY) is None
    assert chain.stats().tier("memory").unverified == 2 and chain.stats().tier("memory").corrupt == 0
    assert contains(tier, name)  # not deleted
    chain.save(KEY, VALUE)
    assert np.array_equal(load(chain, KEY), VALUE)


def test_regression_secret_rotation_reads_old_entries_and_writes_new_ones() -> None:
    tier = MemoryTier(2**22)
    old_fleet = TierChain([tier], secrets=[b"old"], max_pending_write_bytes=0)
    new_fleet = TierChain([tier], secrets=[b"new", b"old"], max_pending_write_bytes=0)
    old_fleet.save(KEY, VALUE)
    assert np.array_equal(load(new_fleet, KEY), VALUE)  # accepted: the old secret is still listed
    other = KEY[:-1] + "1"
    new_fleet.save(other, VALUE)  # signed (and keyed) with the first secret
    assert load(old_fleet, other) is None  # the old fleet cannot verify it, and nothing is deleted
    assert np.array_equal(load(new_fleet, other), VALUE)
    assert np.array_equal(load(old_fleet, KEY), VALUE)  # the new fleet deleted nothing of the old
    for chain in (old_fleet, new_fleet):
        assert chain.stats().tier("memory").corrupt == 0


def test_unserializable_value_is_counted_not_raised() -> None:
    chain = TierChain([MemoryTier(2**20)])
    assert chain.save(KEY, {"handle": object()}) is False
    assert chain.stats().unserializable == 1
    assert load(chain, KEY) is None


def test_namespace_record_is_written_with_the_first_save_once_per_process() -> None:
    tier = MemoryTier(2**20)
    chain = TierChain([tier], max_pending_write_bytes=0)
    chain.register_namespace("0123456789abcdef", "qwen2-vl-2b/processor-v1")
    assert not contains(tier, NAMESPACE_PREFIX + "0123456789abcdef")  # registering writes nothing
    chain.save(KEY, VALUE)
    record = tier.get(NAMESPACE_PREFIX + "0123456789abcdef")
    assert record is not None and namespace_name(record) == "qwen2-vl-2b/processor-v1"
    tier.delete(NAMESPACE_PREFIX + "0123456789abcdef")
    chain.save(KEY, VALUE)
    assert not contains(tier, NAMESPACE_PREFIX + "0123456789abcdef")  # once per process
    assert namespace_name(b"not json") is None


def test_duplicate_or_missing_tiers_and_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError):
        TierChain([MemoryTier(1), MemoryTier(1)])
    with pytest.raises(ConfigurationError):
        TierChain([])
    with pytest.raises(ConfigurationError):
        TierChain([MemoryTier(1)], secrets=[b""])
    with pytest.raises(ConfigurationError):
        TierChain([MemoryTier(1)], retry_interval=float("nan"))
    with pytest.raises(ConfigurationError):
        TierChain([MemoryTier(1)], max_pending_write_bytes=-1)


class SlowTier(MemoryTier):
    """A memory tier whose every write takes ``seconds``: a tier slower than a shutdown's deadline."""

    def __init__(self, seconds: float) -> None:
        super().__init__(None, name="slow")
        self.seconds = seconds

        self.written: list[str] = []

    def put(self, key: str, blob: bytes) -> None:
        time.sleep(self.seconds)
        super().put(key, blob)
        self.written.append(key)


def test_close_with_a_deadline_drops_and_counts_what_it_could_not_write() -> None:
    tier = SlowTier(0.2)
    chain = TierChain([tier], max_pending_write_bytes=2**20)
    keys = [KEY[:-2] + f"{index:02x}" for index in range(10)]
    for key in keys:
        assert chain.save_entry(key, VALUE, 1.0)
    closed = chain.close(timeout=0.5)
    time.sleep(0.3)  # a write still running at the deadline may land
    written = [key for key in tier.written if key in keys]
    assert 0 < closed.dropped < len(keys) and closed.unfinished <= 1
    # Each save written or counted, none lost uncounted.
    assert len(keys) - closed.dropped - closed.unfinished <= len(written) <= len(keys) - closed.dropped
    assert chain.stats().writes_dropped == closed.dropped
