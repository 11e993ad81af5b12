"""The Prometheus collector reads the cache's typed snapshot at scrape time: exact, never double counted."""

from __future__ import annotations

from tests.support.optional import skip_without

skip_without("prometheus_client", "metrics")

from dataclasses import replace

from prometheus_client import CollectorRegistry, generate_latest

from visioncache.metrics import register_metrics
from visioncache.stats import LEVELS, CacheStats
from visioncache.store.store import StoreStats
from visioncache.tiers.stats import ChainStats, TierStats


class FakeCache:
    def __init__(self) -> None:
        levels = dict.fromkeys(LEVELS, StoreStats())
        levels["pixel"] = StoreStats(hits=3, misses=1, entries=2, bytes=4096, evictions=5, rejections=1)
        levels["embedding"] = StoreStats(
            hits=7, time_saved=1.5, singleflight_waits=2, computed=4, device_bytes=640, spills=6, restores=2
        )
        tiers = ChainStats(
            tiers=(
                TierStats(name="disk", hits=4, misses=2, corrupt=1, bytes=99, entries=3),
                TierStats(name="redis", errors=3, skipped=8, breaker_open=True),
            ),
            writes_dropped=2,
        )
        self.stats = CacheStats(levels=levels, tiers=tiers)

    def snapshot(self) -> CacheStats:
        return self.stats


def test_scrape_shows_the_cache_stats() -> None:
    cache, registry = FakeCache(), CollectorRegistry()
    register_metrics(cache, registry)
    sample = registry.get_sample_value
    assert sample("visioncache_cache_hits_total", {"level": "pixel"}) == 3
    assert sample("visioncache_cache_misses_total", {"level": "pixel"}) == 1
    assert sample("visioncache_cache_entries", {"level": "pixel"}) == 2
    assert sample("visioncache_cache_bytes", {"level": "pixel"}) == 4096
    assert sample("visioncache_cache_evictions_total", {"level": "pixel"}) == 5
    assert sample("visioncache_cache_rejections_total", {"level": "pixel"}) == 1
    assert sample("visioncache_cache_hits_total", {"level": "embedding"}) == 7
    assert sample("visioncache_cache_singleflight_waits_total", {"level": "embedding"}) == 2
    assert sample("visioncache_cache_computed_total", {"level": "embedding"}) == 4
    assert sample("visioncache_time_saved_seconds_total", {"level": "embedding"}) == 1.5
    assert sample("visioncache_cache_device_bytes", {"level": "embedding"}) == 640
    assert sample("visioncache_cache_spills_total", {"level": "embedding"}) == 6
    assert sample("visioncache_cache_restores_total", {"level": "embedding"}) == 2
    assert sample("visioncache_cache_hits_total", {"level": "encoding"}) == 0
    assert sample("visioncache_tier_corrupt_total", {"tier": "disk"}) == 1
    assert sample("visioncache_tier_errors_total", {"tier": "redis"}) == 3
    assert sample("visioncache_tier_skipped_total", {"tier": "redis"}) == 8
    assert sample("visioncache_tier_breaker_open", {"tier": "redis"}) == 1
    assert sample("visioncache_tier_bytes", {"tier": "disk"}) == 99
    assert sample("visioncache_tier_bytes", {"tier": "redis"}) is None  # Redis does not know: no sample
    assert sample("visioncache_tier_writes_dropped_total") == 2


def test_each_scrape_reads_current_values_without_accumulating() -> None:
    cache, registry = FakeCache(), CollectorRegistry()
    register_metrics(cache, registry)
    generate_latest(registry)
    generate_latest(registry)
    assert registry.get_sample_value("visioncache_cache_hits_total", {"level": "pixel"}) == 3
    levels = dict(cache.stats.levels, pixel=StoreStats(hits=10))
    cache.stats = replace(cache.stats, levels=levels)
    assert registry.get_sample_value("visioncache_cache_hits_total", {"level": "pixel"}) == 10


def test_a_cache_without_tiers_scrapes_cleanly() -> None:
    cache = FakeCache()
    cache.stats = replace(cache.stats, tiers=None)
    registry = CollectorRegistry()
    register_metrics(cache, registry)
    text = generate_latest(registry)
    assert b"visioncache_cache_hits" in text and b"visioncache_tier_" not in text


def test_real_cache_scrapes() -> None:
    from visioncache import VisionEmbeddingCache

    cache = VisionEmbeddingCache()
    registry = CollectorRegistry()
    register_metrics(cache, registry)
    assert registry.get_sample_value("visioncache_cache_misses_total", {"level": "pixel"}) == 0


def test_write_path_metrics_from_a_real_cache() -> None:
    import numpy as np

    from tests.conftest import encode_image, random_image
    from tests.support.memory_tier import MemoryTier
    from visioncache import VisionEmbeddingCache

    cache, registry = VisionEmbeddingCache(tiers=[MemoryTier(None)]), CollectorRegistry()
    register_metrics(cache, registry)
    cache.encode_images([encode_image(random_image(1))], lambda images: [{"handle": object()}])
    cache.encode_images([encode_image(random_image(2))], lambda images: [np.zeros(3)])
    assert cache.tiers is not None and cache.tiers.flush(timeout=30)
    sample = registry.get_sample_value
    assert sample("visioncache_tier_unserializable_total") == 1  # an object() cannot be stored
    assert sample("visioncache_tier_writes_pending") == 0
    assert sample("visioncache_tier_writes_total", {"tier": "memory"}) == 1
    assert sample("visioncache_cache_entries", {"level": "embedding"}) == 2
    assert sample("visioncache_tier_writes_dropped_total") == 0
