"""The tier contract, run against every tier: MemoryTier, DiskTier, RedisTier (standalone and cluster), and
FourMethodTier (the four methods `BaseTier` asks for, every other one the base's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.four_method_tier import FourMethodTier
from tests.support.memory_tier import MemoryTier
from tests.support.tier_reads import contains
from visioncache.tiers.base import Tier
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.stats import TierSizes

KEY = "0123456789abcdef/embedding/" + "ab" * 32


@pytest.fixture(
    params=[
        "memory",
        "four-method",
        "disk",
        "redis",
        "redis-budget",
        pytest.param("redis-cluster", marks=pytest.mark.slow),
    ]
)
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tier]:
    made: Tier
    if request.param == "memory":
        made = MemoryTier(max_bytes=64 * 2**20)
    elif request.param == "four-method":
        made = FourMethodTier()
    elif request.param == "disk":
        made = DiskTier(tmp_path / "disk", max_bytes=64 * 2**20)
    else:
        pytest.importorskip("redis", reason="needs redis-py: pip install 'visioncache[redis]'")
        from visioncache.tiers.redis import RedisTier

        cluster = request.param == "redis-cluster"
        server: Any = request.getfixturevalue("redis_cluster" if cluster else "redis_server")
        prefix: str = request.getfixturevalue("redis_prefix")
        budget = 64 * 2**20 if request.param == "redis-budget" else None  # RedisBudget's scripts
        made = RedisTier(server.url, key_prefix=prefix, socket_timeout=2.0, cluster=cluster, max_bytes=budget)
    yield made
    made.close()


def test_is_a_tier(tier: Tier) -> None:
    assert isinstance(tier, Tier)
    assert isinstance(tier.name, str) and tier.name


def test_missing_key_is_none(tier: Tier) -> None:
    assert tier.get(KEY) is None
    assert not contains(tier, KEY)


def test_put_then_get_returns_the_same_bytes(tier: Tier) -> None:
    blob = bytes(range(256)) * 4
    tier.put(KEY, blob)
    assert tier.get(KEY) == blob
    assert contains(tier, KEY)


def test_large_and_empty_blobs(tier: Tier) -> None:
    large = bytes(range(256)) * (5 * 2**12)  # 5 MiB: stored in a file by the disk tier
    tier.put(KEY, large)
    tier.put(KEY + "0", b"")
    assert tier.get(KEY) == large
    assert tier.get(KEY + "0") == b""


def test_put_replaces(tier: Tier) -> None:
    tier.put(KEY, b"old")
    tier.put(KEY, b"new")
    assert tier.get(KEY) == b"new"


def test_delete(tier: Tier) -> None:
    tier.put(KEY, b"value")
    tier.delete(KEY)
    assert tier.get(KEY) is None
    assert not contains(tier, KEY)
    tier.delete(KEY)  # deleting a missing key is not an error


def test_keys_are_exact(tier: Tier) -> None:
    """No truncation or normalisation: keys differing in their last character stay apart."""
    other = KEY[:-1] + "c"
    tier.put(KEY, b"first")
    tier.put(other, b"second")
    tier.put("ns/é/ü", b"unicode")
    assert (tier.get(KEY), tier.get(other), tier.get("ns/é/ü")) == (b"first", b"second", b"unicode")
    assert tier.get(KEY[:-1]) is None


def test_sizes_are_what_the_tier_knows_or_none(tier: Tier) -> None:
    tier.put(KEY, b"value")
    sizes = tier.sizes()
    assert isinstance(sizes, TierSizes) and sizes.rejections == 0
    assert sizes.entries is None or sizes.entries == 1
    assert sizes.bytes is None or sizes.bytes >= len(b"value")


def test_batched_reads_answer_in_order(tier: Tier) -> None:
    names = [KEY[:-1] + str(index) for index in range(10)]
    for index, name in enumerate(names[::2]):
        tier.put(name, bytes([index]) * 3)
    assert tier.get_many(names) == [
        bytes([index // 2]) * 3 if index % 2 == 0 else None for index in range(10)
    ]
    assert tier.contains_many(names) == [index % 2 == 0 for index in range(10)]
    assert tier.get_many([]) == [] and tier.contains_many([]) == []
