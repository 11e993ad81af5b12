"""`FourMethodTier`: the smallest tier the base allows, blobs in a dict, four methods written."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from typing_extensions import override

from visioncache.tiers import BaseTier

__all__ = ["FourMethodTier"]


class FourMethodTier(BaseTier):
    """`get`, `put`, `delete` and `keys`; every batched and optional method is the base's."""

    def __init__(self, name: str = "dict") -> None:
        self.name = name
        self._blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()

    @override
    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._blobs.get(key)

    @override
    def put(self, key: str, blob: bytes) -> None:
        with self._lock:
            self._blobs[key] = bytes(blob)

    @override
    def delete(self, key: str) -> None:
        with self._lock:
            self._blobs.pop(key, None)

    @override
    def keys(self) -> Iterator[str]:
        with self._lock:
            keys = list(self._blobs)
        yield from keys
