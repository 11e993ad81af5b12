"""The one store: a thread-safe cache bounded by entries and bytes, with pins and single-flight.

Every cache level holds one `Store` (docs/design.md, principle 2). Guarantees:

- never more than ``max_entries`` entries nor ``max_bytes`` bytes (the sum of each value's
  ``tree_nbytes``); a value larger than the budget is not stored (a *rejection*), nothing else is
  disturbed, and the caller still has its value. A numpy/torch leaf that views a larger buffer is
  copied when stored (`trees.compact`), so the budget bounds the memory entries keep alive;
- re-putting a key replaces its value; it evicts another entry only if the new value needs more
  room than the old one left. Which unpinned entry goes first is the policy's choice
  (`visioncache.store.eviction`: least-recently-used by default, or cost-aware);
- a pinned key is never evicted: pins are counted per key, may be taken before the value exists,
  and last until released. When pinned entries fill the budget, new values are rejected rather than
  evicting what running requests use;
- single-flight: `claim` tells exactly one caller per missing key to compute it (the *owner*); every
  other caller gets the owner's `Future`. `fulfil` stores the value and retires the claim under one
  lock (nobody can see the key neither stored nor in flight); an owner whose value cannot be sized
  has its claim abandoned, so no waiter is left waiting;
- hits take no lock, and are still exact for the eviction order: a hit reads two dicts and appends
  its key to a list of recent hits (each one atomic C operation under the GIL), and never touches
  the order itself. Everything that reads or changes the order (the policy's touch, admissions,
  evictions) runs under the one lock, which first applies the buffered hits in order; a hit also
  applies them once more than ``TOUCH_BUFFER`` wait, if the lock is free (a lock-free
  reorder raced an eviction iterating the order). Counters are per-thread tallies
  (`ThreadCounters`), exact under concurrency. Writes, evictions, pins and claims of missing keys
  are serialised by the lock. ``max_entries=0`` disables the store: nothing is stored or counted
  as rejected. Needs the GIL (`visioncache.runtime`);
- fork-safe: a fork waits until no thread is inside a store's lock, and a child starts with no
  claims in flight (their owners, the parent's threads, do not exist there): it computes them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from visioncache import forking
from visioncache.errors import EncoderOutputError, InvalidArgumentError, PinMismatchError, describe_input
from visioncache.runtime import require_gil
from visioncache.store.counters import ThreadCounters
from visioncache.store.eviction import EvictionPolicy, make_policy
from visioncache.store.types import Claim, Entry, PutResult, StoreStats
from visioncache.trees import compact, prepare, tree_nbytes

__all__ = ["TOUCH_BUFFER", "Claim", "Entry", "PutResult", "Store", "StoreStats"]

TOUCH_BUFFER = 128  # hits buffered before a hit applies them (if the lock is free)

_COUNTERS = tuple(name for name in StoreStats.__slots__ if name not in ("entries", "bytes", "pinned"))


class Store:
    """A bounded, thread-safe cache of array trees (see the module docstring for its guarantees)."""

    def __init__(
        self,
        max_entries: int | None = None,
        max_bytes: int | None = None,
        *,
        sizeof: Callable[[Any], int] = tree_nbytes,
        policy: str = "lru",
    ):
        require_gil("visioncache's Store")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.policy_name = policy
        self._policy: EvictionPolicy = make_policy(policy)
        self._sizeof = sizeof
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, Entry] = OrderedDict()  # unpinned entries, LRU first
        self._touches: list[str] = []  # keys hit since the order was last brought up to date
        self._pinned: dict[str, Entry] = {}  # entries whose key holds pins
        self._pins: dict[str, int] = {}
        self._flights: dict[str, Future[Any]] = {}
        self._nbytes = 0
        self._pinned_nbytes = 0
        self._counters = ThreadCounters(_COUNTERS)
        forking.track(self)

    @property
    def enabled(self) -> bool:
        return self.max_entries != 0

    # ---- lookups -------------------------------------------------------------------------------
    def find(self, key: str) -> Entry | None:
        """The entry of ``key``, touched as recently used; counts nothing. Takes no lock: a miss
        here may be a move between the two dicts, so callers that need certainty use `claim`."""
        entry = self._lru.get(key) or self._pinned.get(key)
        if entry is not None:
            touches = self._touches
            touches.append(key)
            # Non-blocking: a hit never waits for a writer (which applies the buffer itself), and
            # a caller already holding the lock (`lookup`, `claim`) is refused, not deadlocked.
            if len(touches) > TOUCH_BUFFER and self._lock.acquire(blocking=False):
                try:
                    self._apply_touches()
                finally:
                    self._lock.release()
        return entry

    def _apply_touches(self) -> None:
        """Hand the buffered hits to the policy, oldest first (under the lock)."""
        touches = self._touches
        if touches:
            # Two atomic list operations: hits append at the end meanwhile, and only the lock's
            # holder removes from the front, so the first `count` keys are these two calls' alone.
            count = len(touches)
            keys = touches[:count]
            del touches[:count]
            self._policy.touch(self._lru, keys)

    def lookup(self, key: str) -> Entry | None:
        """`find`, certain: a miss is confirmed under the lock. Counts nothing."""
        entry = self.find(key)
        if entry is None:
            with self._lock:
                entry = self.find(key)
        return entry

    def claim(self, key: str) -> Claim:
        """Look ``key`` up for a computation: a hit, a wait on its owner, or ownership of it.

        Counts nothing (the caller records what it did with `record`). An owner must end its
        claim with `fulfil` or `abandon`, or waiters wait forever.
        """
        entry = self.find(key)
        if entry is not None:
            return Claim(value=entry.value, cost=entry.cost)
        with self._lock:
            entry = self.find(key)
            if entry is not None:
                return Claim(value=entry.value, cost=entry.cost)
            future = self._flights.get(key)
            if future is not None:
                return Claim(future=future)
            future = Future()
            self._flights[key] = future
            return Claim(future=future, owner=True)

    def fulfil(self, key: str, value: Any, cost: float = 0.0, *, nbytes: int | None = None) -> Any:
        """End an owned claim: store ``value`` (within the budget) and wake the waiters with it.

        Returns the value as stored (a view is copied). A value that cannot be sized abandons the
        claim (waiters get the error) and raises `EncoderOutputError`. ``nbytes`` given: the caller
        prepared the value already (`visioncache.trees.prepare`), and it is stored as it is.
        """
        try:
            if nbytes is None:
                nbytes = 0
                if self.enabled:  # a disabled store keeps nothing, so there is nothing to size
                    value, nbytes = self._prepare(value)
        except InvalidArgumentError as error:
            failure = EncoderOutputError(str(error))
            self.abandon(key, failure)
            raise failure from error
        with self._lock:
            self._put_locked(key, value, nbytes, cost)
            future = self._flights.pop(key, None)
        if future is not None:
            future.set_result(value)
        return value

    def abandon(self, key: str, error: BaseException) -> None:
        """End an owned claim without a value: waiters get ``error``; a later claim retries."""
        with self._lock:
            future = self._flights.pop(key, None)
        if future is not None:
            future.set_exception(error)

    def record_hit(self, cost: float) -> None:
        """Count one hit of an entry that cost ``cost`` seconds (the hit path's `record`)."""
        tally = self._counters.local()
        tally["hits"] += 1
        tally["time_saved"] += cost

    def record(self, *, time_saved: float = 0.0, **counts: int) -> None:
        """Add to the counters (names as in `StoreStats`)."""
        tally = self._counters.local()
        for name, count in counts.items():
            tally[name] += count
        tally["time_saved"] += time_saved

    # ---- writes --------------------------------------------------------------------------------
    def _prepare(self, value: Any) -> tuple[Any, int]:
        """(value with views copied, its size); `InvalidArgumentError` if it cannot be sized."""
        try:
            if self._sizeof is tree_nbytes:  # one walk: views copied and sized together
                prepared = prepare(value)
                return prepared.value, prepared.nbytes
            value = compact(value)
            return value, int(self._sizeof(value))
        except Exception as error:  # e.g. a torch sparse tensor, whose nbytes raises
            raise InvalidArgumentError(
                f"cannot size a value to cache ({describe_input(value)}): {error!r}"
            ) from error

    def put(self, key: str, value: Any, *, cost: float = 0.0, nbytes: int | None = None) -> PutResult:
        """Store ``value`` under ``key``, evicting entries as needed; `InvalidArgumentError` (and
        nothing changed) if the value cannot be sized. ``nbytes`` given: as in `fulfil`."""
        if not self.enabled:
            return PutResult.DISABLED
        if nbytes is None:
            value, nbytes = self._prepare(value)  # outside the lock: walking a tree can take a while
        with self._lock:
            return self._put_locked(key, value, nbytes, cost)

    def _put_locked(self, key: str, value: Any, nbytes: int, cost: float) -> PutResult:
        if not self.enabled:
            return PutResult.DISABLED
        self._apply_touches()  # hits before this put count as earlier than it
        old = self._remove(key)
        pinned = self._pins.get(key, 0) > 0
        if not self._can_fit(nbytes):
            self._counters.local()["rejections"] += 1
            return PutResult.REJECTED
        self._evict_for(nbytes)
        entry = Entry(value, nbytes, cost)
        if pinned:
            self._pinned[key] = entry
            self._pinned_nbytes += nbytes
        else:
            self._lru[key] = entry
            self._policy.admitted(self._lru, key, entry)
        self._nbytes += nbytes
        return PutResult.INSERTED if old is None else PutResult.REPLACED

    def _can_fit(self, nbytes: int) -> bool:
        # Only unpinned entries can be evicted, so pinned ones plus the new value must fit.
        if self.max_entries is not None and len(self._pinned) + 1 > self.max_entries:
            return False
        return self.max_bytes is None or self._pinned_nbytes + nbytes <= self.max_bytes

    def _evict_for(self, nbytes: int) -> None:
        while self._lru and (
            (self.max_entries is not None and len(self._lru) + len(self._pinned) >= self.max_entries)
            or (self.max_bytes is not None and self._nbytes + nbytes > self.max_bytes)
        ):
            entry = self._lru.pop(self._policy.victim(self._lru))
            self._policy.evicted(entry)
            self._nbytes -= entry.nbytes
            self._counters.local()["evictions"] += 1

    def _remove(self, key: str) -> Entry | None:
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
            entry = self._lru.get(key) or self._pinned.get(key)
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
        """Release one pin; at zero the entry becomes evictable again, as recently used."""
        with self._lock:
            count = self._pins.get(key, 0) - 1
            if count < 0:
                raise PinMismatchError(f"unpin without a matching pin for key {key!r}")
            if count > 0:
                self._pins[key] = count
                return
            del self._pins[key]
            entry = self._pinned.pop(key, None)
            if entry is not None:
                self._apply_touches()
                self._pinned_nbytes -= entry.nbytes
                self._lru[key] = entry
                self._policy.admitted(self._lru, key, entry)

    # ---- inspection ----------------------------------------------------------------------------
    def clear(self) -> None:
        """Drop every entry and reset the counters; pins and in-flight claims stay valid."""
        with self._lock:
            self._lru.clear()
            self._pinned.clear()
            self._touches.clear()
            self._policy = make_policy(self.policy_name)
            self._nbytes = self._pinned_nbytes = 0
        self._counters.reset()

    def stats(self) -> StoreStats:
        """A consistent snapshot of the counters and sizes."""
        counts = self._counters.snapshot()
        with self._lock:
            entries, nbytes, pinned = len(self._lru) + len(self._pinned), self._nbytes, len(self._pinned)
        integers = {name: int(counts[name]) for name in _COUNTERS if name != "time_saved"}
        return StoreStats(
            **integers, time_saved=counts["time_saved"], entries=entries, bytes=nbytes, pinned=pinned
        )

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._lru) + len(self._pinned)

    def __contains__(self, key: object) -> bool:
        return key in self._lru or key in self._pinned

    def __repr__(self) -> str:
        return f"<Store {len(self)}/{self.max_entries} entries, {self._nbytes}/{self.max_bytes} bytes>"

    # ---- fork safety (`visioncache.forking`) -----------------------------------------------------
    def before_fork(self) -> None:
        self._lock.acquire()  # no thread is inside the store when the process is copied
        self._counters.before_fork()  # second: a thread holding the store's lock may take it

    def after_fork_in_parent(self) -> None:
        self._counters.after_fork_in_parent()
        self._lock.release()

    def after_fork_in_child(self) -> None:
        self._flights = {}  # owned by the parent's threads: never fulfilled here
        self._counters.after_fork_in_child()
        self._lock.release()
