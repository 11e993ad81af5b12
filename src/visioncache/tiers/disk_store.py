"""diskcache, adapted for the disk tier: bytes only, bounded waits, no file left by a failed write.

`BytesOnlyDisk` stores only ``bytes`` values under ``str`` keys, and refuses to decode anything else
it finds (a value some other program pickled into the directory reads as a corrupt entry, not as
an object): nothing read from the directory is ever unpickled. It writes a large value's file
itself, and removes it when the write fails (EFBIG, ENOSPC, any error) or when the database row
that would have pointed to it is not committed (`BoundedCache.set_bytes`): a failed write never
leaves bytes on disk outside what the database counts against ``size_limit``.

Fork-safe connections: SQLite's VFS keeps process-wide mutexes that closing a connection takes
(with the GIL released), so a close on another thread while the process forks leaves the child a
mutex held by no thread, and the child's first open waits forever. diskcache closes a thread's
connection when the thread ends, or when the cache is collected, wherever that happens. Here a
connection is never closed there: its holder hands it to `_ABANDONED` instead, and the tier closes
abandoned connections inside its `visioncache.forking.Gate` (`close_abandoned`), which a fork
waits for. Connections are made with ``check_same_thread=False`` so another thread may close them.

`BoundedCache` is a diskcache `Cache` whose internal retry loop (used while opening) gives up after
the connection timeout instead of 60 s, and which keeps its directory within ``size_limit`` itself
(`BoundedCache.cull_to_limit`): diskcache's own cull, run inside every write, deletes up to
``cull_limit`` (10) least-recently-used rows at once once its estimate passes the limit — with a
small limit, the entry just written among them, until the directory empties itself — and leaves
SQLite's write-ahead log outside the bound. So diskcache's cull is off (``cull_limit=0``), the WAL
is checkpointed every `WAL_CHECKPOINT_PAGES` pages and truncated to `WAL_BYTES`, and after each
write the tier deletes least-recently-used entries one at a time, never the one just written
unless it alone exceeds the limit, until the estimate (database pages + value files) is within it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import diskcache
from typing_extensions import override

from visioncache.errors import CorruptEntryError

__all__ = ["BoundedCache", "BytesOnlyDisk", "close_abandoned"]

_OPEN_ATTEMPTS = 10  # as diskcache: another process may remove an empty sub-directory meanwhile
WAL_CHECKPOINT_PAGES = 128  # SQLite pages (4 KiB) of write-ahead log before a checkpoint
WAL_BYTES = 512 * 1024  # what a checkpointed log is truncated to
# What every connection applies (diskcache stores the settings in the directory and applies
# each ``sqlite_*`` one as a PRAGMA on every connection it opens).
SETTINGS = {
    "eviction_policy": "least-recently-used",
    "cull_limit": 0,
    "sqlite_wal_autocheckpoint": WAL_CHECKPOINT_PAGES,
    "sqlite_journal_size_limit": WAL_BYTES,
}


_ABANDONED: list[sqlite3.Connection] = []  # whose thread ended or whose cache went: to close in a gate


class _Holder:
    """A thread's connection, in diskcache's thread-local: when the thread ends or the cache is
    collected, the connection goes to `_ABANDONED`, unclosed (appending takes no lock)."""

    __slots__ = ("connection",)

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection: sqlite3.Connection | None = connection

    def __del__(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(Exception):  # at interpreter exit the list may be gone
                _ABANDONED.append(self.connection)


def close_abandoned() -> None:
    """Close the connections whose thread ended or whose cache was collected; call it only
    inside a disk tier's `Gate` (a fork waits for it, so no close runs while the process forks)."""
    while _ABANDONED:
        try:
            connection = _ABANDONED.pop()
        except IndexError:  # another thread took the last one
            return
        with contextlib.suppress(sqlite3.Error):
            connection.close()


class BytesOnlyDisk(diskcache.Disk):  # type: ignore[misc]  # diskcache ships no type hints
    """A diskcache `Disk` for ``str`` keys and ``bytes`` values only: it never pickles or unpickles."""

    def __init__(self, directory: str, **kwargs: Any) -> None:
        super().__init__(directory, **kwargs)
        self._written = threading.local()  # the value file this thread's last `store` wrote

    @override
    def put(self, key: Any) -> tuple[Any, bool]:
        if type(key) is not str:
            raise TypeError(f"DiskTier keys are str, got {type(key).__name__}")
        result: tuple[Any, bool] = super().put(key)
        return result

    @override
    def get(self, key: Any, raw: bool) -> Any:
        if not raw:
            raise CorruptEntryError("refusing to unpickle a key found in the disk tier")
        return super().get(key, raw)

    @override
    def store(self, value: Any, read: bool, key: Any = diskcache.UNKNOWN) -> Any:
        if type(value) is not bytes:
            raise TypeError(f"DiskTier values are bytes, got {type(value).__name__}")
        self._written.filename = None
        if len(value) < self.min_file_size:
            return super().store(value, read, key=key)  # inside the database row
        filename, full_path = self.filename(key, value)
        self._write_file(full_path, value)
        self._written.filename = filename
        return len(value), diskcache.core.MODE_BINARY, filename, None

    @staticmethod
    def _write_file(full_path: str, value: bytes) -> None:
        """Write a new value file; on any failure remove what was written, and raise."""
        for attempt in range(1, _OPEN_ATTEMPTS + 1):
            os.makedirs(os.path.dirname(full_path), exist_ok=True)
            try:
                file = open(full_path, "xb")  # noqa: SIM115 - closed below, inside the cleanup
            except FileNotFoundError:  # its sub-directory was removed since makedirs
                if attempt == _OPEN_ATTEMPTS:
                    raise
                continue
            try:
                with file:
                    file.write(value)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.remove(full_path)
                raise
            return

    def discard_written(self) -> None:
        """Remove the value file this thread's last `store` wrote (its row was not committed)."""
        filename = getattr(self._written, "filename", None)
        self._written.filename = None
        if filename is not None:
            self.remove(filename)

    @override
    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode not in (diskcache.core.MODE_RAW, diskcache.core.MODE_BINARY) or read:
            raise CorruptEntryError(f"refusing to decode a disk-tier value stored in mode {mode}")
        result = super().fetch(mode, filename, value, read)
        if type(result) is not bytes:
            raise CorruptEntryError(f"disk-tier value is {type(result).__name__}, not bytes")
        return result


class BoundedCache(diskcache.Cache):  # type: ignore[misc]  # diskcache ships no type hints
    """A diskcache `Cache` that waits at most ``open_timeout`` while opening, and stores bytes
    without leaving a file behind when the write fails."""

    def __init__(self, directory: str, *, open_timeout: float, **kwargs: Any) -> None:
        self._open_timeout = open_timeout  # read by _sql_retry inside diskcache's __init__
        super().__init__(directory, disk=BytesOnlyDisk, **kwargs)

    @override
    @property
    def _con(self) -> sqlite3.Connection:
        """This thread's connection (diskcache's, held by a `_Holder`); a forked child makes its
        own (the parent's goes to `_ABANDONED`, as diskcache would close it)."""
        local = self._local
        holder: _Holder | None = getattr(local, "holder", None)
        if holder is not None and holder.connection is not None and local.pid == os.getpid():
            return holder.connection
        connection = sqlite3.connect(
            os.path.join(self._directory, diskcache.core.DBNAME),
            timeout=self._timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        local.holder, local.pid = _Holder(connection), os.getpid()  # the old holder hands its own on
        try:  # per-connection pragmas, as diskcache applies them (the table may not exist yet)
            settings = connection.execute("SELECT key, value FROM Settings").fetchall()
        except sqlite3.OperationalError:
            return connection
        for key, value in settings:
            if key.startswith("sqlite_"):
                self.reset(key, value, update=False)
        return connection

    @override
    def close(self) -> None:
        """Close this thread's connection (call it inside the tier's gate)."""
        holder: _Holder | None = getattr(self._local, "holder", None)
        if holder is not None and holder.connection is not None:
            connection, holder.connection = holder.connection, None
            connection.close()

    def set_bytes(self, key: str, blob: bytes) -> None:
        """``set(key, blob)`` without retries; if it raises, the value file it wrote is removed."""
        disk: BytesOnlyDisk = self.disk
        try:
            self.set(key, blob, retry=False)
        except BaseException:
            disk.discard_written()  # the row was rolled back, or never begun
            raise

    def cull_to_limit(self, written: str) -> bool:
        """Delete least-recently-used entries other than ``written`` until the estimated volume
        is within ``size_limit``; if ``written`` is all that is left and still too large, delete
        it too and return False (not stored)."""
        while self.volume() > self.size_limit:
            rows = self._sql(
                "SELECT key FROM Cache WHERE key != ? ORDER BY access_time LIMIT 1", (written,)
            ).fetchall()
            victim = rows[0][0] if rows else written
            self.delete(victim, retry=False)
            if victim == written:
                return False
        return True

    @override
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
