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
- device residency (``device_bytes``, `visioncache.store.device`): values that live on an
  accelerator are kept there within a device budget of their own, and ``max_bytes`` bounds the
  host memory only. A device value that does not fit has the least-recently-used unpinned device
  entries *spilled* to the host (copied, then counted against ``max_bytes``, whose eviction drops
  them as usual); a value that still does not fit (pinned entries fill the device budget) is
  itself kept on the host. A hit on a device entry returns the device value itself; a hit on a
  spilled entry places it back on its device (outside the lock, then installed under it, spilling
  others) when it fits, and returns it. A pinned device entry is never spilled. Copies made to
  make room run under the lock, so budgets and the order are exact under threads;
- fork-safe: a fork waits until no thread is inside a store's lock, and a child starts with no
  claims in flight (their owners, the parent's threads, do not exist there): it computes them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from typing_extensions import override

from visioncache import forking
from visioncache.errors import EncoderOutputError, InvalidArgumentError, PinMismatchError, describe_input
from visioncache.runtime import require_gil
from visioncache.store.counters import ThreadCounters
from visioncache.store.device import Placement, TorchPlacement, parse_device_budget
from visioncache.store.eviction import EvictionPolicy, make_policy
from visioncache.store.room import Rooms, touch_device
from visioncache.store.types import Claim, Entry, PutResult, StoreStats
from visioncache.trees import compact, leaf_device, prepare, tree_nbytes

__all__ = ["TOUCH_BUFFER", "Claim", "Entry", "PutResult", "Store", "StoreStats"]

TOUCH_BUFFER = 128  # hits buffered before a hit applies them (if the lock is free)

_GAUGES = ("entries", "bytes", "pinned", "device_bytes", "host_bytes")
_COUNTERS = tuple(name for name in StoreStats.__slots__ if name not in _GAUGES)


class Store(Rooms):
    """A bounded, thread-safe cache of array trees (see the module docstring for its guarantees)."""

    def __init__(
        self,
        max_entries: int | None = None,
        max_bytes: int | None = None,
        *,
        sizeof: Callable[[Any], int] = tree_nbytes,
        policy: str = "lru",
        device_bytes: int | str | None = None,
        placement: Placement | None = None,
    ):
        require_gil("visioncache's Store")
        self._budget = parse_device_budget(device_bytes, name="device_bytes")
        self._placement: Placement = TorchPlacement() if placement is None else placement
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.policy_name = policy
        self._policy: EvictionPolicy = make_policy(policy)
        self._sizeof = sizeof
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, Entry] = OrderedDict()  # unpinned host entries, LRU first
        self._device: OrderedDict[str, Entry] = OrderedDict()  # unpinned device entries, LRU first
        self._touches: list[str] = []  # keys hit since the order was last brought up to date
        self._pinned: dict[str, Entry] = {}  # entries whose key holds pins
        self._pins: dict[str, int] = {}
        self._flights: dict[str, Future[Any]] = {}
        self._nbytes = 0  # all entries
        self._device_nbytes = 0  # entries on a device, pinned or not
        self._pinned_nbytes = 0  # pinned host entries
        self._pinned_device_nbytes = 0  # pinned device entries
        self._counters = ThreadCounters(_COUNTERS)
        forking.track(self)

    @property
    def enabled(self) -> bool:
        return self.max_entries != 0

    # ---- lookups -------------------------------------------------------------------------------
    def find(self, key: str, *, restore: bool = True) -> Entry | None:
        """The entry of ``key``, touched as recently used; counts nothing. Takes no lock (but to
        place a spilled entry back on its device, unless ``restore`` is false, as it must be
        under the lock): a miss here may be a move between the dicts, so callers that need
        certainty use `lookup` or `claim`."""
        entry = self._lru.get(key) or self._device.get(key) or self._pinned.get(key)
        if entry is not None:
            if restore and entry.home is not None and entry.device is None:
                entry = self._restore(key, entry)
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

    @override
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
            if self._device:
                touch_device(self._device, keys)

    def lookup(self, key: str) -> Entry | None:
        """`find`, certain: a miss is confirmed under the lock. Counts nothing."""
        entry = self.find(key)
        if entry is None:
            with self._lock:
                entry = self.find(key, restore=False)
            if entry is not None and entry.spilled:
                entry = self._restore(key, entry)
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
            entry = self.find(key, restore=False)
            if entry is None:
                future = self._flights.get(key)
                if future is not None:
                    return Claim(future=future)
                future = Future()
                self._flights[key] = future
                return Claim(future=future, owner=True)
        if entry.spilled:
            entry = self._restore(key, entry)
        return Claim(value=entry.value, cost=entry.cost)

    def fulfil(
        self, key: str, value: Any, cost: float = 0.0, *, nbytes: int | None = None, device: Any = None
    ) -> Any:
        """End an owned claim: store ``value`` (within the budget) and wake the waiters with it.

        Returns the value as stored (a view is copied). A value that cannot be sized abandons the
        claim (waiters get the error) and raises `EncoderOutputError`. ``nbytes`` given: the caller
        prepared the value already (`visioncache.trees.prepare`), and it is stored as it is, on
        ``device`` (its first tensor's device, which decides its residency).
        """
        try:
            if nbytes is None:
                nbytes = 0
                if self.enabled:  # a disabled store keeps nothing, so there is nothing to size
                    value, nbytes, device = self._prepare(value)
        except InvalidArgumentError as error:
            failure = EncoderOutputError(str(error))
            self.abandon(key, failure)
            raise failure from error
        with self._lock:
            self._put_locked(key, value, nbytes, cost, device)
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
    def _prepare(self, value: Any) -> tuple[Any, int, Any]:
        """(value with views copied, its size, its device); `InvalidArgumentError` if it cannot be
        sized."""
        try:
            if self._sizeof is tree_nbytes:  # one walk: views copied, sized and located together
                return prepare(value)
            value = compact(value)
            return value, int(self._sizeof(value)), None if self._budget is None else leaf_device(value)
        except Exception as error:  # e.g. a torch sparse tensor, whose nbytes raises
            raise InvalidArgumentError(
                f"cannot size a value to cache ({describe_input(value)}): {error!r}"
            ) from error

    def put(
        self, key: str, value: Any, *, cost: float = 0.0, nbytes: int | None = None, device: Any = None
    ) -> PutResult:
        """Store ``value`` under ``key``, evicting entries as needed; `InvalidArgumentError` (and
        nothing changed) if the value cannot be sized. ``nbytes`` and ``device`` given: as in `fulfil`."""
        if not self.enabled:
            return PutResult.DISABLED
        if nbytes is None:  # outside the lock: walking a tree can take a while
            value, nbytes, device = self._prepare(value)
        with self._lock:
            return self._put_locked(key, value, nbytes, cost, device)

    def _put_locked(self, key: str, value: Any, nbytes: int, cost: float, device: Any) -> PutResult:
        if not self.enabled:
            return PutResult.DISABLED
        self._apply_touches()  # hits before this put count as earlier than it
        old = self._remove(key)
        home = None if self._budget is None or device is None else self._placement.home(device)
        entry = Entry(value, nbytes, cost, device=home, home=home)
        on_device = home is not None and self._room_on_device(nbytes, home)
        if not self._can_fit(0 if on_device else nbytes):
            self._counters.local()["rejections"] += 1
            return PutResult.REJECTED
        if home is not None and not on_device:  # no room on the device: held on the host
            try:
                entry.value, entry.device = self._placement.to_host(value), None
            except Exception:  # a failed copy stores nothing; the caller keeps its value
                self._counters.local()["rejections"] += 1
                return PutResult.REJECTED
            self._counters.local()["spills"] += 1
        self._evict_for(0 if on_device else nbytes)
        self._insert(key, entry)
        return PutResult.INSERTED if old is None else PutResult.REPLACED

    def discard(self, key: str, value: Any = None) -> bool:
        """Remove ``key`` (only if it still holds ``value``, when one is given)."""
        with self._lock:
            entry = self._stored(key)
            if entry is None or (value is not None and entry.value is not value):
                return False
            self._remove(key)
            return True

    # ---- pins ----------------------------------------------------------------------------------
    def pin(self, key: str) -> None:
        """Keep ``key`` from eviction until a matching `unpin` (the value may arrive later)."""
        with self._lock:
            self._pins[key] = self._pins.get(key, 0) + 1
            entry = self._lru.pop(key, None) or self._device.pop(key, None)
            if entry is not None:
                self._pinned[key] = entry
                self._count_pinned(entry, 1)

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
                self._count_pinned(entry, -1)
                self._nbytes -= entry.nbytes
                self._device_nbytes -= entry.nbytes if entry.device is not None else 0
                self._insert(key, entry)  # as recently used, among the device or host entries

    # ---- inspection ----------------------------------------------------------------------------
    def clear(self) -> None:
        """Drop every entry and reset the counters; pins and in-flight claims stay valid."""
        with self._lock:
            self._lru.clear()
            self._device.clear()
            self._pinned.clear()
            self._touches.clear()
            self._policy = make_policy(self.policy_name)
            self._nbytes = self._pinned_nbytes = self._device_nbytes = self._pinned_device_nbytes = 0
        self._counters.reset()

    def stats(self) -> StoreStats:
        """A consistent snapshot of the counters and sizes."""
        counts = self._counters.snapshot()
        with self._lock:
            entries, nbytes, pinned, device = len(self), self._nbytes, len(self._pinned), self._device_nbytes
        integers = {name: int(counts[name]) for name in _COUNTERS if name != "time_saved"}
        return StoreStats(
            **integers,
            time_saved=counts["time_saved"],
            entries=entries,
            bytes=nbytes,
            pinned=pinned,
            device_bytes=device,
            host_bytes=nbytes - device,
        )

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def device_budget(self) -> int | None:
        """The device budget in bytes (None: no residency, or ``"auto"`` not yet resolved)."""
        return None if self._budget is None else self._budget.limit

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is stored, certain (under the lock): a replacement moves an entry out and
        back in, and a lock-free look between the two would report a stored key missing."""
        with self._lock:
            return key in self._lru or key in self._pinned or key in self._device

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
