"""Memo of file digests keyed by every stat field that changes when a file's bytes can change.

The key is (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns). An edited file changes its
modification time; a file deleted and written anew at the same path may get the old inode back
(ext4 reuses it) and its size and modification time set back by any tool (``touch -d``,
``rsync -t``, ``tar -x``, ``os.utime``), but not its status-change time: the kernel sets
``st_ctime`` to the current time at every write, truncation, rename, link, chmod and utime, and no
call sets it back. To close the "racy" window of coarse timestamps (a second change within the
same clock tick as the first leaves both times unchanged), a digest is remembered only for a file
whose modification and status-change times are both at least ``settle_seconds`` in the past when
it is read — the approach git takes for its index — so any later change carries a newer ctime.

What remains: bytes changed with every stat field restored, ctime included, which takes setting
the system clock back (or writing the block device under the filesystem); and filesystems that do
not keep ctime (some network and FUSE filesystems report a constant). Call ``clear()`` after such
tools, or pass bytes instead of the path.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict

from visioncache import forking
from visioncache.runtime import require_gil

__all__ = ["SETTLE_SECONDS", "PathDigestMemo"]

SETTLE_SECONDS = 2.0  # a file changed more recently than this is hashed, never remembered

_StatKey = tuple[int, int, int, int, int]


def _stat_key(status: os.stat_result) -> _StatKey:
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


class PathDigestMemo:
    """A bounded, thread-safe LRU of path -> (stat key, digest)."""

    def __init__(self, max_entries: int = 4096, settle_seconds: float = SETTLE_SECONDS):
        require_gil("visioncache's path memo")  # its lock-free lookup is atomic under the GIL only
        self.max_entries = max_entries
        self.settle_seconds = settle_seconds
        self._entries: OrderedDict[str, tuple[_StatKey, bytes]] = OrderedDict()
        self._lock = forking.lock()

    def lookup(self, path: str, status: os.stat_result) -> bytes | None:
        """The remembered digest if the file's stat key is unchanged, else None.

        Takes no lock (a hit must not convoy threads): the read and the LRU touch are each one
        atomic dict operation, and an entry is replaced whole, never mutated.
        """
        found = self._entries.get(path)
        if found is None or found[0] != _stat_key(status):
            return None
        try:  # noqa: SIM105 - a try costs less than contextlib.suppress on the hit path
            self._entries.move_to_end(path)
        except KeyError:  # dropped from the memo meanwhile: the digest is still right
            pass
        return found[1]

    def remember(self, path: str, status: os.stat_result, digest: bytes) -> None:
        """Remember ``digest`` for ``path`` if the file has settled (see module docstring)."""
        settled_before = time.time_ns() - self.settle_seconds * 1e9
        if self.max_entries <= 0 or max(status.st_mtime_ns, status.st_ctime_ns) > settled_before:
            return
        with self._lock:
            self._entries[path] = (_stat_key(status), digest)
            self._entries.move_to_end(path)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
