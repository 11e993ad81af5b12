"""`MemoryTier`: blobs held in this process, bounded in bytes, least-recently-used first out.

It is the in-memory `visioncache.store.store.Store` behind the tier interface, so the contract suite
checks that the byte-level tiers behave like the store the cache itself uses, and tests and
single-process setups can run a chain without disk or network.
"""

from __future__ import annotations

from collections.abc import Sequence

from visioncache.store.store import Store

__all__ = ["MemoryTier"]


class MemoryTier:
    """A `Store` of blobs sized by their length; a blob larger than ``max_bytes`` is not kept."""

    def __init__(self, max_bytes: int | None, *, name: str = "memory") -> None:
        self.name = name
        self._store = Store(max_entries=None, max_bytes=max_bytes, sizeof=len)

    def get(self, key: str) -> bytes | None:
        blob: bytes | None = self._store.get(key)
        return blob

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self.get(key) for key in keys]

    def put(self, key: str, blob: bytes) -> None:
        # A rejected (too large) blob also drops the key's older blob: nothing stale stays.
        self._store.put(key, blob)

    def delete(self, key: str) -> None:
        self._store.discard(key)

    def contains(self, key: str) -> bool:
        return key in self._store

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        return [key in self._store for key in keys]

    def stats(self) -> dict[str, int | float]:
        counts = self._store.stats()
        return {
            "entries": counts.entries,
            "bytes": counts.bytes,
            "evictions": counts.evictions,
            "rejections": counts.rejections,
        }

    def close(self) -> None:
        self._store.clear()
