"""`DiskTier`: blobs in a local directory, shared by every process on the host, kept across restarts.

Built on diskcache (SQLite index + one file per large value), which is thread-safe and
process-safe, and reopens its connections after a fork. The directory is bounded by ``max_bytes``
with least-recently-used eviction; a directory under ``/dev/shm`` makes it a shared-memory tier.

Nothing read from the directory is ever unpickled: `BytesOnlyDisk` stores only ``bytes`` values
under ``str`` keys, and refuses to decode anything else it finds (a value some other program
pickled into the directory reads as a corrupt entry, not as an object). A truncated or altered
blob is returned as stored; `visioncache.serialization.loads` detects it and the chain deletes it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import diskcache

from visioncache.errors import ConfigurationError, CorruptEntryError

__all__ = ["BytesOnlyDisk", "DiskTier"]


class BytesOnlyDisk(diskcache.Disk):  # type: ignore[misc]  # diskcache ships no type hints
    """A diskcache `Disk` for ``str`` keys and ``bytes`` values only: it never pickles or unpickles."""

    def put(self, key: Any) -> tuple[Any, bool]:
        if type(key) is not str:
            raise TypeError(f"DiskTier keys are str, got {type(key).__name__}")
        result: tuple[Any, bool] = super().put(key)
        return result

    def get(self, key: Any, raw: bool) -> Any:
        if not raw:
            raise CorruptEntryError("refusing to unpickle a key found in the disk tier")
        return super().get(key, raw)

    def store(self, value: Any, read: bool, key: Any = diskcache.UNKNOWN) -> Any:
        if type(value) is not bytes:
            raise TypeError(f"DiskTier values are bytes, got {type(value).__name__}")
        return super().store(value, read, key=key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode not in (diskcache.core.MODE_RAW, diskcache.core.MODE_BINARY) or read:
            raise CorruptEntryError(f"refusing to decode a disk-tier value stored in mode {mode}")
        result = super().fetch(mode, filename, value, read)
        if type(result) is not bytes:
            raise CorruptEntryError(f"disk-tier value is {type(result).__name__}, not bytes")
        return result


class DiskTier:
    """A diskcache-backed tier. ``max_bytes=None`` keeps the directory's existing limit.

    ``timeout`` bounds how long an operation waits for SQLite's lock held by another process;
    on expiry diskcache raises ``diskcache.Timeout``, which the chain counts as an error.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int | None = None,
        *,
        name: str = "disk",
        timeout: float = 1.0,
    ) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ConfigurationError(f"DiskTier max_bytes must be > 0, got {max_bytes}")
        self.name = name
        self.directory = os.fspath(directory)
        self.max_bytes = max_bytes
        settings: dict[str, Any] = {"eviction_policy": "least-recently-used"}
        if max_bytes is not None:
            # diskcache persists settings in the directory: pass the limit only when one is given,
            # so a reader (e.g. `visioncache stats`) does not overwrite the writers' limit.
            settings["size_limit"] = max_bytes
        self._cache = diskcache.Cache(self.directory, timeout=timeout, disk=BytesOnlyDisk, **settings)
        self._rejections = 0

    def get(self, key: str) -> bytes | None:
        blob: bytes | None = self._cache.get(key, default=None, retry=True)
        return blob

    def put(self, key: str, blob: bytes) -> None:
        limit = self._cache.size_limit
        if len(blob) > limit:
            # Storing it would only evict everything else and then itself.
            self._rejections += 1
            self._cache.delete(key, retry=True)
            return
        self._cache.set(key, blob, retry=True)

    def delete(self, key: str) -> None:
        self._cache.delete(key, retry=True)

    def contains(self, key: str) -> bool:
        return key in self._cache

    def keys(self) -> Iterator[str]:
        """Every stored key (for `visioncache stats`); iterating does not touch LRU order."""
        for key in self._cache.iterkeys():
            yield str(key)

    def stats(self) -> dict[str, int | float]:
        return {
            "entries": len(self._cache),
            "bytes": int(self._cache.volume()),
            "max_bytes": int(self._cache.size_limit),
            "rejections": self._rejections,
        }

    def close(self) -> None:
        self._cache.close()

    def __repr__(self) -> str:
        return f"DiskTier({self.directory!r}, max_bytes={self._cache.size_limit})"
