"""The cache over shared tiers: read-through with promotion, write-through, isolation, faults."""

from __future__ import annotations

from tests.support.optional import skip_without

skip_without("redis", "redis")

import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import encode_image, random_image
from tests.support.memory_tier import MemoryTier
from visioncache import VisionEmbeddingCache
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.redis import RedisTier


class CountingEncoder:
    def __init__(self, rows: int = 3) -> None:
        self.encoded = 0
        self.rows = rows

    def __call__(self, images: list[bytes]) -> list[dict[str, Any]]:
        self.encoded += len(images)
        return [
            {"embeds": np.full((self.rows, 4), len(image), np.float32), "grid": np.array([1, 2, 6])}
            for image in images
        ]


def images(count: int) -> list[bytes]:
    return [encode_image(random_image(seed)) for seed in range(count)]


def test_second_cache_on_the_same_disk_hits_without_encoding(tmp_path: Path) -> None:
    batch = images(3)
    first, encoder = VisionEmbeddingCache(tiers=[DiskTier(tmp_path)]), CountingEncoder()
    expected = first.encode_images(batch, encoder)
    assert first.tiers is not None and first.tiers.flush(timeout=30)  # writes go down in the background
    second, fresh = VisionEmbeddingCache(tiers=[DiskTier(tmp_path)]), CountingEncoder()
    got = second.encode_images(batch, fresh)
    assert fresh.encoded == 0 and encoder.encoded == 3
    for a, b in zip(expected, got, strict=True):
        assert np.array_equal(a["embeds"], b["embeds"]) and np.array_equal(a["grid"], b["grid"])
    stats = second.get_stats()
    assert stats["embedding_cache_hits"] == 3 and stats["embedding_cache_misses"] == 0
    assert stats["tiers"]["disk"]["hits"] == 3
    assert stats["embedding_time_saved"] > 0  # the recorded encode cost travels with the entry
    # promoted: the next lookup is served from memory
    second.get_image_embeddings(batch)
    assert second.get_stats()["tiers"]["disk"]["hits"] == 3


def test_process_one_fills_the_disk_and_process_two_hits_without_encoding(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import numpy as np
        from tests.conftest import encode_image, random_image
        from visioncache import VisionEmbeddingCache
        from visioncache.tiers.disk import DiskTier
        cache = VisionEmbeddingCache(tiers=[DiskTier({str(tmp_path)!r})])
        batch = [encode_image(random_image(seed)) for seed in range(3)]
        cache.encode_images(batch, lambda ims: [np.full((3, 4), len(i), np.float32) for i in ims])
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(__file__).parents[2])
    cache, encoder = VisionEmbeddingCache(tiers=[DiskTier(tmp_path)]), CountingEncoder()
    values = cache.encode_images(images(3), encoder)
    assert encoder.encoded == 0
    assert [v[0, 0] for v in values] == [len(image) for image in images(3)]


def test_pixel_levels_use_the_tiers_too(tmp_path: Path) -> None:
    image = images(1)
    first = VisionEmbeddingCache(tiers=[DiskTier(tmp_path)])
    first.set_pixel_cache(image, "prompt", np.ones((4, 3), np.float32), np.arange(5), processing_time=0.2)
    first.set_pixel_values(image, np.zeros((4, 3), np.float32), image_grid_thw=np.array([[1, 2, 2]]))
    assert first.tiers is not None and first.tiers.flush(timeout=30)
    second = VisionEmbeddingCache(tiers=[DiskTier(tmp_path)])
    entry = second.get_pixel_cache(image, "prompt")
    assert entry is not None and np.array_equal(entry.input_ids, np.arange(5))
    assert second.get_pixel_values(image) is not None
    stats = second.get_stats()
    assert stats["pixel_cache_hits"] == 1 and stats["pixel_cache_misses"] == 0
    assert stats["total_time_saved"] == pytest.approx(0.2)


def test_corrupt_disk_entry_gives_no_wrong_result(tmp_path: Path) -> None:
    batch = images(2)
    # 64 KiB values: diskcache keeps values this large in files of their own.
    writer = VisionEmbeddingCache(tiers=[DiskTier(tmp_path)])
    writer.encode_images(batch, CountingEncoder(rows=4096))
    assert writer.tiers is not None and writer.tiers.flush(timeout=30)
    blobs = list(tmp_path.rglob("*.val"))
    assert len(blobs) == 2
    for blob in blobs:
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
    cache, encoder = VisionEmbeddingCache(tiers=[DiskTier(tmp_path)]), CountingEncoder(rows=4096)
    values = cache.encode_images(batch, encoder)
    assert cache.get_stats()["tiers"]["disk"]["corrupt"] == 2 and encoder.encoded == 2
    assert [v["embeds"][0, 0] for v in values] == [len(image) for image in batch]


def test_namespaces_sharing_a_redis_server_never_see_each_other(redis_server: Any, redis_prefix: str) -> None:
    batch = images(2)

    def cache(namespace: str, salt: str | None = None) -> VisionEmbeddingCache:
        tier = RedisTier(redis_server.url, key_prefix=redis_prefix)
        return VisionEmbeddingCache(namespace=namespace, salt=salt, tiers=[tier])

    first = cache("model-a")
    first.encode_images(batch, CountingEncoder())
    assert first.tiers is not None and first.tiers.flush(timeout=30)
    for other in (cache("model-b"), cache("model-a", salt="tenant-2")):
        encoder = CountingEncoder()
        other.encode_images(batch, encoder)
        assert encoder.encoded == 2
    same, encoder = cache("model-a"), CountingEncoder()
    same.encode_images(batch, encoder)
    assert encoder.encoded == 0


def test_redis_killed_mid_run_fails_no_request(redis_process_factory: Any) -> None:
    server = redis_process_factory()
    tier = RedisTier(server.url, key_prefix="kill:")
    cache = VisionEmbeddingCache(tiers=TierChain([tier], retry_interval=60.0), max_embedding_entries=1)
    batch = images(6)
    failures = 0
    for step, image in enumerate(batch * 3):
        if step == 4:
            server.stop()
        try:
            value = cache.encode_images([image], CountingEncoder())[0]
            assert value["embeds"][0, 0] == len(image)
        except Exception:  # pragma: no cover - counted and asserted below
            failures += 1
    assert failures == 0
    assert cache.get_stats()["tiers"]["redis"]["errors"] >= 1


def test_tiers_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VISIONCACHE_DISK_DIR", str(tmp_path))
    monkeypatch.setenv("VISIONCACHE_DISK_MAX_BYTES", "64MiB")
    assert VisionEmbeddingCache().tiers is None  # the environment is read only when asked
    cache = VisionEmbeddingCache.from_env()
    assert cache.tiers is not None and [tier.name for tier in cache.tiers.tiers] == ["disk"]
    monkeypatch.delenv("VISIONCACHE_DISK_DIR")
    assert VisionEmbeddingCache.from_env().tiers is None
    assert VisionEmbeddingCache(tiers=None).tiers is None


def test_unknown_tiers_setting_is_a_configuration_error() -> None:
    from visioncache import ConfigurationError

    with pytest.raises(ConfigurationError, match="tiers must be"):
        VisionEmbeddingCache(tiers="redis")


class BlockingTier(MemoryTier):
    """A tier whose writes wait until the test lets them through."""

    def __init__(self) -> None:
        super().__init__(max_bytes=None, name="blocking")
        self.release = threading.Event()

    def put(self, key: str, blob: bytes) -> None:
        self.release.wait(timeout=30)
        super().put(key, blob)


def test_a_slow_tier_does_not_hold_up_the_request() -> None:
    tier = BlockingTier()
    cache = VisionEmbeddingCache(tiers=[tier])
    values = cache.encode_images(images(2), CountingEncoder())  # returns while the tier's put waits
    assert len(values) == 2 and cache.tiers is not None
    assert cache.get_stats()["tiers"]["chain"]["writes_pending"] >= 1
    tier.release.set()
    assert cache.tiers.flush(timeout=30)
    assert cache.get_stats()["tiers"]["blocking"]["writes"] == 2


def test_a_full_write_queue_drops_and_counts_writes() -> None:
    tier = BlockingTier()
    value_bytes = 3 * 4 * 4 + 3 * 8  # CountingEncoder's two arrays
    cache = VisionEmbeddingCache(tiers=TierChain([tier], max_pending_write_bytes=3 * value_bytes))
    cache.encode_images(images(6), CountingEncoder())
    stats = cache.snapshot().tiers
    assert stats is not None and stats.writes_dropped == 3  # three fit the byte budget, three do not
    assert stats.writes_pending_bytes <= 3 * value_bytes
    tier.release.set()
    assert cache.tiers is not None and cache.tiers.flush(timeout=30)
    assert cache.get_stats()["embedding_cache_size"] == 6  # memory kept every value
