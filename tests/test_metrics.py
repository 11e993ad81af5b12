"""The Prometheus collector reads the cache's stats at scrape time: exact, never double counted."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from visioncache.metrics import register_metrics


class FakeCache:
    def __init__(self) -> None:
        self.stats: dict[str, Any] = {
            "pixel_cache_hits": 3, "pixel_cache_misses": 1, "pixel_cache_size": 2,
            "pixel_cache_bytes": 4096, "pixel_cache_evictions": 5, "pixel_cache_rejections": 1,
            "embedding_cache_hits": 7, "embedding_time_saved": 1.5, "total_time_saved": 2.25,
            "pixel_hit_rate": 0.75,
            "tiers": {"disk": {"hits": 4, "misses": 2, "errors": 0, "corrupt": 1, "bytes": 99},
                      "redis": {"errors": 3}},
        }  # fmt: skip

    def get_stats(self) -> dict[str, Any]:
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
    assert sample("visioncache_time_saved_seconds_total", {"level": "embedding"}) == 1.5
    assert sample("visioncache_total_time_saved_seconds_total") == 2.25
    assert sample("visioncache_tier_corrupt_total", {"tier": "disk"}) == 1
    assert sample("visioncache_tier_errors_total", {"tier": "redis"}) == 3
    assert sample("visioncache_tier_bytes", {"tier": "disk"}) == 99
    assert sample("visioncache_cache_hits_total", {"level": "encoding"}) is None  # missing: skipped


def test_each_scrape_reads_current_values_without_accumulating() -> None:
    cache, registry = FakeCache(), CollectorRegistry()
    register_metrics(cache, registry)
    generate_latest(registry)
    generate_latest(registry)
    assert registry.get_sample_value("visioncache_cache_hits_total", {"level": "pixel"}) == 3
    cache.stats["pixel_cache_hits"] = 10
    assert registry.get_sample_value("visioncache_cache_hits_total", {"level": "pixel"}) == 10


def test_empty_stats_scrape_cleanly() -> None:
    class Empty:
        def get_stats(self) -> dict[str, Any]:
            return {}

    registry = CollectorRegistry()
    register_metrics(Empty(), registry)
    assert b"visioncache_cache_hits" in generate_latest(registry)


def test_real_cache_scrapes() -> None:
    from visioncache import VisionEmbeddingCache

    cache = VisionEmbeddingCache()
    registry = CollectorRegistry()
    register_metrics(cache, registry)
    assert registry.get_sample_value("visioncache_cache_misses_total", {"level": "pixel"}) == 0


def test_write_path_metrics_from_a_real_cache() -> None:
    import numpy as np

    from tests.conftest import encode_image, random_image
    from visioncache import VisionEmbeddingCache
    from visioncache.tiers.memory import MemoryTier

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
