"""`DiskTier`: blobs in a local directory, shared by every process on the host, kept across restarts.

Built on diskcache (SQLite index + one file per large value), which is thread-safe and
process-safe. Fork-safe: a fork waits until no thread of this process is inside an operation of
the tier (`visioncache.forking.Gate`: a child copied while a thread is inside SQLite inherits
SQLite's mutexes held, and hangs), and a child reopens the directory with its own connections at
its first operation. The directory is bounded by ``max_bytes``
with least-recently-used eviction; a directory under ``/dev/shm`` makes it a shared-memory tier.

Bounded waits: every operation waits at most ``timeout`` seconds for SQLite's lock held by another
process, then raises ``diskcache.Timeout`` (never diskcache's retry loops: its constructor alone
would otherwise retry a locked database for 60 s). The directory is opened at the first operation,
not by the constructor; a directory that cannot be opened (e.g. a garbage ``cache.db``) makes that
operation raise, which the chain counts as a tier failure.

Nothing read from the directory is ever unpickled: `BytesOnlyDisk` stores only ``bytes`` values
under ``str`` keys, and refuses to decode anything else it finds (a value some other program
pickled into the directory reads as a corrupt entry, not as an object). A truncated or altered
blob is returned as stored; `visioncache.tiers.serialization.loads` detects it and the chain deletes it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import diskcache

from visioncache import forking
from visioncache.errors import ConfigurationError, CorruptEntryError
from visioncache.tiers import defaults
from visioncache.tiers.stats import TierSizes

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


class _BoundedCache(diskcache.Cache):  # type: ignore[misc]  # diskcache ships no type hints
    """A diskcache `Cache` whose internal retry loop (used while opening) gives up after the
    connection timeout instead of 60 s."""

    def __init__(self, directory: str, *, open_timeout: float, **kwargs: Any) -> None:
        self._open_timeout = open_timeout  # read by _sql_retry inside diskcache's __init__
        super().__init__(directory, **kwargs)

    @property
    def _sql_retry(self) -> Callable[..., Any]:
        sql = self._sql
        budget = self._open_timeout

        def execute(statement: str, *args: Any, **kwargs: Any) -> Any:
            deadline = time.monotonic() + budget
            while True:
                try:
                    return sql(statement, *args, **kwargs)
                except sqlite3.OperationalError as error:
                    if str(error) != "database is locked":
                        raise  # diskcache's own fallbacks catch these (e.g. "no such table")
                    if time.monotonic() > deadline:
                        raise diskcache.Timeout(f"disk tier locked for {budget} s") from error
                    time.sleep(0.001)

        return execute


class DiskTier:
    """A diskcache-backed tier. ``max_bytes=None`` keeps the directory's existing limit.

    ``timeout`` bounds how long any operation waits for SQLite's lock held by another process.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int | None = None,
        *,
        name: str = "disk",
        timeout: float = defaults.DISK_TIMEOUT,
    ) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ConfigurationError(f"DiskTier max_bytes must be > 0, got {max_bytes}")
        if not timeout > 0:
            raise ConfigurationError(f"DiskTier timeout must be > 0 seconds, got {timeout}")
        self.name = name
        self.network = False  # shared by the processes of one host only
        self.directory = os.fspath(directory)
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise ConfigurationError(f"DiskTier directory {self.directory!r} exists and is not a directory")
        self.max_bytes = max_bytes
        self.timeout = timeout
        self._opened: Any = None
        self._gate = forking.Gate()  # every operation below runs inside it
        self._open_lock = threading.Lock()  # taken inside the gate only: a fork finds it free
        self._rejections = 0
        forking.track(self)

    # ---- fork safety (`visioncache.forking`) -----------------------------------------------------
    def before_fork(self) -> None:
        """Nothing to take: the gate makes the fork wait for operations in progress."""

    def after_fork_in_parent(self) -> None:
        """The parent keeps its connections."""

    def after_fork_in_child(self) -> None:
        # The parent's connections are not this process's to use: open anew at first use.
        self._opened = None
        self._open_lock = threading.Lock()

    @property
    def _cache(self) -> Any:
        """The diskcache, opened at first use (which creates the directory and its database)."""
        if self._opened is None:
            with self._open_lock:
                if self._opened is None:
                    settings: dict[str, Any] = {"eviction_policy": "least-recently-used"}
                    if self.max_bytes is not None:
                        # diskcache persists settings in the directory: pass the limit only when
                        # one is given, so a reader does not overwrite the writers' limit.
                        settings["size_limit"] = self.max_bytes
                    self._opened = _BoundedCache(
                        self.directory,
                        open_timeout=self.timeout,
                        timeout=self.timeout,
                        disk=BytesOnlyDisk,
                        **settings,
                    )
        return self._opened

    def get(self, key: str) -> bytes | None:
        with self._gate.entered():
            blob: bytes | None = self._cache.get(key, default=None, retry=False)
        return blob

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """One transaction (one lock wait at most). An entry that cannot be read as bytes (e.g.
        pickled by another program) answers ``b""``, which the chain treats as corrupt."""
        with self._gate.entered():
            cache = self._cache
            with cache.transact(retry=False):
                return [self._read(cache, key) for key in keys]

    @staticmethod
    def _read(cache: Any, key: str) -> bytes | None:
        try:
            blob: bytes | None = cache.get(key, default=None, retry=False)
        except CorruptEntryError:
            return b""
        return blob

    def put(self, key: str, blob: bytes) -> None:
        with self._gate.entered():
            cache = self._cache
            if len(blob) > cache.size_limit:
                # Storing it would only evict everything else and then itself.
                self._rejections += 1
                cache.delete(key, retry=False)
                return
            cache.set(key, blob, retry=False)

    def delete(self, key: str) -> None:
        with self._gate.entered():
            self._cache.delete(key, retry=False)

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        with self._gate.entered():
            cache = self._cache
            return [key in cache for key in keys]

    def keys(self) -> Iterator[str]:
        """Every stored key (for `visioncache stats`); iterating does not touch LRU order. Read
        whole before the first is yielded: a fork must never wait for a paused iteration."""
        with self._gate.entered():
            keys = [str(key) for key in self._cache.iterkeys()]
        yield from keys

    def sizes(self) -> TierSizes:
        with self._gate.entered():
            if self._opened is None and not os.path.isdir(self.directory):
                return TierSizes(rejections=self._rejections)  # opening it now would create the directory
            cache = self._cache
            return TierSizes(
                entries=len(cache),
                bytes=int(cache.volume()),
                max_bytes=int(cache.size_limit),
                rejections=self._rejections,
            )

    def stored_bytes(self, keys: Sequence[str]) -> int:
        """The directory's volume (database and value files): every key's share, records included."""
        with self._gate.entered():
            return int(self._cache.volume())

    def close(self) -> None:
        with self._gate.entered():
            if self._opened is not None:
                self._opened.close()

    def __repr__(self) -> str:
        return f"DiskTier({self.directory!r}, max_bytes={self.max_bytes})"
