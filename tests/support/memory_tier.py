"""`MemoryTier`: blobs held in this process, bounded in bytes, least-recently-used first out.

It is the in-memory `visioncache.store.store.Store` behind the tier interface, so the contract suite
checks that the byte-level tiers behave like the store the cache itself uses, and tests and
single-process setups can run a chain without disk or network.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from typing_extensions import override

from visioncache.store import Store
from visioncache.tiers.base import BaseTier
from visioncache.tiers.stats import TierSizes

__all__ = ["MemoryTier"]


class MemoryTier(BaseTier):
    """A `Store` of blobs sized by their length; a blob larger than ``max_bytes`` is not kept.

    ``keys`` lists what the store still holds of the keys put (the store evicts on its own).
    """

    def __init__(self, max_bytes: int | None, *, name: str = "memory") -> None:
        self.name = name
        self.network = False
        self._store = Store(max_entries=None, max_bytes=max_bytes, sizeof=len)
        self._put: dict[str, None] = {}  # keys put, in order; some may have been evicted since
        self._lock = threading.Lock()

    @override
    def get(self, key: str) -> bytes | None:
        entry = self._store.lookup(key)
        blob: bytes | None = None if entry is None else entry.value
        return blob

    @override
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self.get(key) for key in keys]

    @override
    def put(self, key: str, blob: bytes) -> None:
        # A rejected (too large) blob also drops the key's older blob: nothing stale stays.
        self._store.put(key, blob)
        with self._lock:
            self._put[key] = None

    @override
    def delete(self, key: str) -> None:
        self._store.discard(key)
        with self._lock:
            self._put.pop(key, None)

    @override
    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        return [key in self._store for key in keys]

    @override
    def keys(self) -> Iterator[str]:
        with self._lock:
            self._put = {key: None for key in self._put if key in self._store}
            held = list(self._put)
        yield from held

    @override
    def stored_bytes(self, keys: Sequence[str]) -> int:
        return sum(len(blob) for blob in self.get_many(keys) if blob is not None)

    @override
    def sizes(self) -> TierSizes:
        counts = self._store.stats()
        return TierSizes(
            entries=counts.entries,
            bytes=counts.bytes,
            max_bytes=self._store.max_bytes,
            rejections=counts.rejections,
        )

    @override
    def close(self) -> None:
        self._store.clear()
