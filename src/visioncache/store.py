"""The one store: a thread-safe LRU bounded by entries and bytes, with pins and single-flight.

Every cache level is an instance of `Store` (DESIGN.md principle 2). Guarantees:

- never more than ``max_entries`` entries nor ``max_bytes`` bytes (the sum of each value's
  ``tree_nbytes``); a value larger than the budget is not stored (a *rejection*), nothing else is
  disturbed, and the caller still has its value;
- re-putting a key replaces its value and makes it most-recently-used; it evicts another entry only
  if the new value needs more room than the old one left;
- a pinned key is never evicted: pins are counted per key, may be taken before the value exists,
  and last until released. When pinned entries fill the budget, new values are rejected rather than
  evicting what running requests use;
- single-flight: `claim` tells exactly one caller per missing key to compute it (the *owner*); every
  other caller gets the owner's `Future` and waits for the same result or exception;
- hits take no lock: dict reads and the LRU touch are single atomic operations under the GIL, and
  counters are per-thread tallies (`ThreadCounters`), exact under concurrency; a lookup that
  finds nothing takes the lock and looks again before it counts a miss. Writes, evictions, pins
  and claims of missing keys are serialised by one lock. ``max_entries=0`` disables the store:
  nothing is stored or counted as rejected.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Any

from visioncache.counters import ThreadCounters
from visioncache.values import tree_nbytes

__all__ = ["Claim", "PutResult", "Store"]


class PutResult(Enum):
    INSERTED = "inserted"
    REPLACED = "replaced"
    REJECTED = "rejected"
    DISABLED = "disabled"


@dataclass(slots=True)
class _Entry:
    value: Any
    nbytes: int
    cost: float  # seconds it took to compute: added to time_saved on each hit


@dataclass(slots=True)
class Claim:
    """The outcome of `Store.claim`: a hit (``value``), a wait (``future``), or ownership."""

    value: Any = None
    cost: float = 0.0
    future: Future[Any] | None = None
    owner: bool = False

    @property
    def hit(self) -> bool:
        return self.future is None


_COUNTERS = ("hits", "misses", "evictions", "rejections", "singleflight_waits",
             "validation_failures", "computed", "time_saved")  # fmt: skip


class Store:
    """A bounded, thread-safe LRU of array trees (see the module docstring for its guarantees)."""

    def __init__(
        self,
        max_entries: int | None = None,
        max_bytes: int | None = None,
        *,
        sizeof: Callable[[Any], int] = tree_nbytes,
    ):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._sizeof = sizeof
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, _Entry] = OrderedDict()  # unpinned entries, LRU first
        self._pinned: dict[str, _Entry] = {}  # entries whose key holds pins
        self._pins: dict[str, int] = {}
        self._flights: dict[str, Future[Any]] = {}
        self._nbytes = 0
        self._pinned_nbytes = 0
        self._counters = ThreadCounters(_COUNTERS)

    @property
    def enabled(self) -> bool:
        return self.max_entries != 0

    # ---- lookups -------------------------------------------------------------------------------
    def _find(self, key: str) -> _Entry | None:
        """The entry of ``key``, touched as most-recently-used. Safe without the lock: each dict
        operation is atomic; a miss here may be a move between the two dicts, so callers that
        need certainty look again under the lock."""
        entry = self._lru.get(key) or self._pinned.get(key)
        if entry is not None:
            try:  # noqa: SIM105 - a try costs less than contextlib.suppress on the hit path
                self._lru.move_to_end(key)
            except KeyError:  # pinned, or evicted since the read: nothing to reorder
                pass
        return entry

    def get(self, key: str) -> Any | None:
        """The value for ``key`` (now most-recently-used), or None; counts a hit or a miss."""
        entry = self._find(key)
        if entry is None:
            with self._lock:
                entry = self._find(key)
        tally = self._counters.local()
        if entry is None:
            tally["misses"] += 1
            return None
        tally["hits"] += 1
        tally["time_saved"] += entry.cost
        return entry.value

    def claim(self, key: str) -> Claim:
        """Look ``key`` up for a computation: a hit, a wait on its owner, or ownership of it.

        Counts nothing (the caller records what it did with `record`). An owner must end its
        claim with `fulfil` or `abandon`, or waiters wait forever.
        """
        entry = self._find(key)
        if entry is not None:
            return Claim(value=entry.value, cost=entry.cost)
        with self._lock:
            entry = self._find(key)
            if entry is not None:
                return Claim(value=entry.value, cost=entry.cost)
            future = self._flights.get(key)
            if future is not None:
                return Claim(future=future)
            future = Future()
            self._flights[key] = future
            return Claim(future=future, owner=True)

    def fulfil(self, key: str, value: Any, cost: float = 0.0) -> PutResult:
        """End an owned claim: store ``value`` (within the budget) and wake the waiters."""
        result = self.put(key, value, cost=cost)
        with self._lock:
            future = self._flights.pop(key, None)
        if future is not None:
            future.set_result(value)
        return result

    def abandon(self, key: str, error: BaseException) -> None:
        """End an owned claim without a value: waiters get ``error``; a later claim retries."""
        with self._lock:
            future = self._flights.pop(key, None)
        if future is not None:
            future.set_exception(error)

    def record(self, *, time_saved: float = 0.0, **counts: int) -> None:
        """Add to the counters (names as in `stats`)."""
        tally = self._counters.local()
        for name, count in counts.items():
            tally[name] += count
        tally["time_saved"] += time_saved

    # ---- writes --------------------------------------------------------------------------------
    def put(self, key: str, value: Any, *, cost: float = 0.0) -> PutResult:
        """Store ``value`` under ``key`` as most-recently-used, evicting LRU entries as needed."""
        if not self.enabled:
            return PutResult.DISABLED
        nbytes = self._sizeof(value)  # outside the lock: walking a tree can take a while
        with self._lock:
            old = self._remove(key)
            pinned = self._pins.get(key, 0) > 0
            if not self._can_fit(nbytes, pinned):
                self._counters.local()["rejections"] += 1
                return PutResult.REJECTED
            self._evict_for(nbytes)
            entry = _Entry(value, nbytes, cost)
            if pinned:
                self._pinned[key] = entry
                self._pinned_nbytes += nbytes
            else:
                self._lru[key] = entry
            self._nbytes += nbytes
            return PutResult.INSERTED if old is None else PutResult.REPLACED

    def _can_fit(self, nbytes: int, pinned: bool) -> bool:
        # Only unpinned entries can be evicted, so pinned ones plus the new value must fit.
        fixed_entries = len(self._pinned) + 1
        fixed_bytes = self._pinned_nbytes + nbytes
        if self.max_entries is not None and fixed_entries > self.max_entries:
            return False
        return self.max_bytes is None or fixed_bytes <= self.max_bytes

    def _evict_for(self, nbytes: int) -> None:
        while self._lru and (
            (self.max_entries is not None and len(self._lru) + len(self._pinned) >= self.max_entries)
            or (self.max_bytes is not None and self._nbytes + nbytes > self.max_bytes)
        ):
            _, entry = self._lru.popitem(last=False)
            self._nbytes -= entry.nbytes
            self._counters.local()["evictions"] += 1

    def _remove(self, key: str) -> _Entry | None:
        entry = self._lru.pop(key, None)
        if entry is None:
            entry = self._pinned.pop(key, None)
            if entry is not None:
                self._pinned_nbytes -= entry.nbytes
        if entry is not None:
            self._nbytes -= entry.nbytes
        return entry

    def discard(self, key: str, value: Any = None) -> bool:
        """Remove ``key`` (only if it still holds ``value``, when one is given)."""
        with self._lock:
            entry = self._find(key)
            if entry is None or (value is not None and entry.value is not value):
                return False
            self._remove(key)
            return True

    # ---- pins ----------------------------------------------------------------------------------
    def pin(self, key: str) -> None:
        """Keep ``key`` from eviction until a matching `unpin` (the value may arrive later)."""
        with self._lock:
            self._pins[key] = self._pins.get(key, 0) + 1
            entry = self._lru.pop(key, None)
            if entry is not None:
                self._pinned[key] = entry
                self._pinned_nbytes += entry.nbytes

    def unpin(self, key: str) -> None:
        """Release one pin; at zero the entry becomes evictable again, as most-recently-used."""
        with self._lock:
            count = self._pins.get(key, 0) - 1
            if count < 0:
                raise RuntimeError(f"unpin without a matching pin for key {key!r}")
            if count > 0:
                self._pins[key] = count
                return
            del self._pins[key]
            entry = self._pinned.pop(key, None)
            if entry is not None:
                self._pinned_nbytes -= entry.nbytes
                self._lru[key] = entry

    # ---- inspection ----------------------------------------------------------------------------
    def clear(self) -> None:
        """Drop every entry and reset the counters; pins and in-flight claims stay valid."""
        with self._lock:
            self._lru.clear()
            self._pinned.clear()
            self._nbytes = self._pinned_nbytes = 0
        self._counters.reset()

    def stats(self) -> dict[str, int | float]:
        """A consistent snapshot of the counters, sizes and time saved."""
        counts = self._counters.snapshot()
        with self._lock:
            sizes = {"size": len(self._lru) + len(self._pinned), "bytes": self._nbytes,
                     "pinned": len(self._pinned)}  # fmt: skip
        return {**{name: int(counts[name]) for name in _COUNTERS[:-1]}, **sizes,
                "time_saved": counts["time_saved"]}  # fmt: skip

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._lru) + len(self._pinned)

    def __contains__(self, key: object) -> bool:
        return key in self._lru or key in self._pinned

    def __repr__(self) -> str:
        return f"<Store {len(self)}/{self.max_entries} entries, {self._nbytes}/{self.max_bytes} bytes>"
