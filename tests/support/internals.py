"""White-box access for tests: a cache level's store, and the store's counted one-key read.

The library reads its stores through its levels (`visioncache.level.Level`) and counts lookups
where it makes them; tests that inspect a store's contents or drive it one key at a time use these
instead of test-only methods on the library's classes.
"""

from __future__ import annotations

from typing import Any

from visioncache import Store, VisionEmbeddingCache

__all__ = ["get", "level_store"]


def level_store(cache: VisionEmbeddingCache, level: str) -> Store:
    """The memory store of a level of ``cache`` (pixel, pixel_only, encoding or embedding)."""
    return cache._levels[level].store


def get(store: Store, key: str) -> Any | None:
    """The value of ``key`` (now recently used), or None, counted as a hit or a miss."""
    entry = store.lookup(key)
    if entry is None:
        store.record(misses=1)
        return None
    store.record(hits=1, time_saved=entry.cost)
    return entry.value
