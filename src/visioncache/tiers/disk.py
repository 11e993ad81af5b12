"""`DiskTier`: blobs in a local directory, shared by every process on the host, kept across restarts.

Built on diskcache (SQLite index + one file per large value), which is thread-safe and
process-safe. The directory is bounded by ``max_bytes`` with least-recently-used eviction; a
directory under ``/dev/shm`` makes it a shared-memory tier.

Bounded waits: every operation waits at most ``timeout`` seconds for SQLite's lock held by another
process, then raises ``diskcache.Timeout`` (never diskcache's retry loops: its constructor alone
would otherwise retry a locked database for 60 s). The directory is opened at the first operation,
not by the constructor; a directory that cannot be opened (e.g. a garbage ``cache.db``) makes that
operation raise, which the chain counts as a tier failure.

A directory deleted at run time, or deleted and recreated by another process, is detected: every
write first checks that the directory's ``cache.db`` is still the file the tier opened (one
``stat``) and reopens the directory if not (counted as a ``reopen``), and checks again once
written, so a write that landed in a replaced database raises (the chain counts a failure) and
leaves no value file behind; reads check at most once per ``check_interval`` seconds. A write that
fails for any other reason (EFBIG, ENOSPC, a database error) leaves no value file either
(`visioncache.tiers.disk_store`): the directory holds no bytes outside ``max_bytes``.

Fork-safe: a fork waits until no thread of this process is inside an operation of the tier
(`visioncache.forking.Gate`: a child copied while a thread is inside SQLite inherits SQLite's
mutexes held, and hangs), and a child reopens the directory with its own connections at its first
operation.

Nothing read from the directory is ever unpickled (`visioncache.tiers.disk_store.BytesOnlyDisk`).
A truncated or altered blob is returned as stored; `visioncache.tiers.serialization.loads`
detects it and the chain deletes it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from typing_extensions import override

from visioncache import forking
from visioncache.errors import CorruptEntryError
from visioncache.tiers import defaults
from visioncache.tiers import setting_kinds as kinds
from visioncache.tiers.base import BaseTier
from visioncache.tiers.disk_store import SETTINGS, BoundedCache, BytesOnlyDisk, close_abandoned
from visioncache.tiers.stats import TierSizes

__all__ = ["DISK_SLACK_BYTES", "BytesOnlyDisk", "DirectoryReplacedError", "DiskTier"]

logger = logging.getLogger(__name__)
_DATABASE = "cache.db"  # diskcache's index, in the directory
# What the directory may hold beyond ``max_bytes``: SQLite's write-ahead log (checkpointed every
# WAL_CHECKPOINT_PAGES pages, truncated to WAL_BYTES) and its 32 KiB shared-memory index.
DISK_SLACK_BYTES = 2**20


class DirectoryReplacedError(OSError):
    """The tier's directory was deleted or replaced while a write ran: the write is lost."""


class DiskTier(BaseTier):
    """A diskcache-backed tier. ``max_bytes=None`` keeps the directory's existing limit.

    ``timeout`` bounds how long any operation waits for SQLite's lock held by another process;
    reads check that the directory is still the one opened at most once per ``check_interval``
    seconds (writes check every time). ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int | None = None,
        *,
        name: str = "disk",
        timeout: float = defaults.DISK_TIMEOUT,
        check_interval: float = defaults.RETRY_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_bytes is not None:
            kinds.size(max_bytes, "DiskTier max_bytes", False)
        kinds.seconds(timeout, "DiskTier timeout", False)
        if check_interval != 0:  # 0: check at every read
            kinds.seconds(check_interval, "DiskTier check_interval", False)
        self.name = name
        self.network = False  # shared by the processes of one host only
        self.directory = kinds.directory(os.fspath(directory), "DiskTier directory", False)
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.check_interval = check_interval
        self._clock = clock
        self._database = os.path.join(self.directory, _DATABASE)
        self._rejections = 0
        self._reopens = 0
        self._gate = forking.Gate()  # every operation below runs inside it
        self._reset()
        forking.track(self)

    def _reset(self) -> None:
        self._opened: Any = None
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the database opened
        self._checked_at = 0.0
        self._open_lock = threading.Lock()  # taken inside the gate only: a fork finds it free

    # ---- fork safety (`visioncache.forking`) -----------------------------------------------------
    def before_fork(self) -> None:
        """Nothing to take: the gate makes the fork wait for operations in progress."""

    def after_fork_in_parent(self) -> None:
        """The parent keeps its connections."""

    def after_fork_in_child(self) -> None:
        self._reset()  # the parent's connections are not this process's: open anew at first use

    # ---- opening, and noticing a replaced directory --------------------------------------------
    def _cache(self, *, check: bool = False) -> Any:
        """The diskcache, opened at first use (which creates the directory and its database), and
        reopened if its database was deleted or replaced (checked now if ``check``, else at most
        once per ``check_interval``)."""
        close_abandoned()  # inside the gate, as every caller is: see `visioncache.tiers.disk_store`
        opened = self._opened
        if opened is not None and not check and self._clock() - self._checked_at < self.check_interval:
            return opened
        with self._open_lock:
            if self._opened is not None and self._identity != _identity(self._database):
                logger.warning(
                    "disk tier %s: %s was deleted or replaced; reopening", self.name, self._database
                )
                self._opened.close()
                self._opened = None
                self._reopens += 1
            if self._opened is None:
                self._opened = self._open()
                self._identity = _identity(self._database)
            self._checked_at = self._clock()
            return self._opened

    def _open(self) -> BoundedCache:
        settings: dict[str, Any] = dict(SETTINGS)
        if self.max_bytes is not None:
            # diskcache persists settings in the directory: pass the limit only when one is
            # given, so a reader does not overwrite the writers' limit.
            settings["size_limit"] = self.max_bytes
        return BoundedCache(self.directory, open_timeout=self.timeout, timeout=self.timeout, **settings)

    # ---- the tier interface ----------------------------------------------------------------------
    @override
    def get(self, key: str) -> bytes | None:
        with self._gate.entered():
            blob: bytes | None = self._cache().get(key, default=None, retry=False)
        return blob

    @override
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """One transaction (one lock wait at most). An entry that cannot be read as bytes (e.g.
        pickled by another program) answers ``b""``, which the chain treats as corrupt."""
        with self._gate.entered():
            cache = self._cache()
            with cache.transact(retry=False):
                return [self._read(cache, key) for key in keys]

    @staticmethod
    def _read(cache: Any, key: str) -> bytes | None:
        try:
            blob: bytes | None = cache.get(key, default=None, retry=False)
        except CorruptEntryError:
            return b""
        return blob

    @override
    def put(self, key: str, blob: bytes) -> None:
        """Store ``blob``; raises if the write failed, and leaves no file of it behind then."""
        with self._gate.entered():
            cache = self._cache(check=True)
            if len(blob) > cache.size_limit:
                # Storing it would only evict everything else and then itself.
                self._rejections += 1
                cache.delete(key, retry=False)
                return
            cache.set_bytes(key, blob)
            if _identity(self._database) != self._identity:  # replaced while it was written
                cache.disk.discard_written()
                raise DirectoryReplacedError(
                    f"disk tier {self.name}: {self.directory} replaced during a write"
                )
            if not cache.cull_to_limit(key):  # it alone, with the database, exceeds the bound
                self._rejections += 1

    @override
    def delete(self, key: str) -> None:
        with self._gate.entered():
            self._cache().delete(key, retry=False)

    @override
    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        with self._gate.entered():
            cache = self._cache()
            return [key in cache for key in keys]

    @override
    def keys(self) -> Iterator[str]:
        """Every stored key (for `visioncache stats`); iterating does not touch LRU order. Read
        whole before the first is yielded: a fork must never wait for a paused iteration."""
        with self._gate.entered():
            keys = [str(key) for key in self._cache().iterkeys()]
        yield from keys

    @override
    def sizes(self) -> TierSizes:
        with self._gate.entered():
            if self._opened is None and not os.path.isdir(self.directory):
                # opening it now would create the directory
                return TierSizes(rejections=self._rejections, reopens=self._reopens)
            cache = self._cache()
            return TierSizes(
                entries=len(cache),
                bytes=int(cache.volume()),
                max_bytes=int(cache.size_limit),
                rejections=self._rejections,
                reopens=self._reopens,
            )

    @override
    def stored_bytes(self, keys: Sequence[str]) -> int:
        """The directory's volume (database and value files): every key's share, records included."""
        with self._gate.entered():
            return int(self._cache().volume())

    @override
    def close(self) -> None:
        with self._gate.entered():
            if self._opened is not None:
                self._opened.close()

    def __repr__(self) -> str:
        return f"DiskTier({self.directory!r}, max_bytes={self.max_bytes})"


def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, or None if there is none."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino
