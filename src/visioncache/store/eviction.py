"""Eviction policies: which unpinned entry a full `Store` drops first.

The store owns sizes, pins and locking; a policy only orders its unpinned entries (cachetools'
split). Two policies:

- ``"lru"`` (the default): least-recently-used, the store's ``OrderedDict`` order itself;
- ``"cost"``: GreedyDual-Size (Cao & Irani, 1997). An entry's priority is ``L + cost / nbytes``
  (seconds of recompute per byte), refreshed on every hit; the entry with the lowest priority goes
  first and ``L`` rises to it, so entries that stop being used age out. A cheap, large entry
  (18.8 MB of pixels, ~22 ms to recompute) goes before an expensive, small one (a 3 MB embedding,
  seconds of vision encoder).

Every method runs under the store's lock: hits, which take no lock, are buffered by the store and
handed to `touch` in order before the next write, eviction or admission (a lock-free
reorder raced an eviction's iteration). A policy never holds a reference to an entry or a value:
what it remembers is keys and numbers, and no more records than twice the entries it orders, plus
a constant (records of replaced, evicted and pinned entries kept their values alive).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from visioncache.errors import ConfigurationError

__all__ = ["POLICIES", "CostPolicy", "EvictionPolicy", "LRUPolicy", "make_policy"]


class _Entry(Protocol):
    nbytes: int
    cost: float
    priority: float
    ticket: int


class EvictionPolicy(Protocol):
    """Orders the store's unpinned entries (``lru``: key -> entry, least recently used first)."""

    def touch(self, lru: OrderedDict[str, Any], keys: Sequence[str]) -> None:
        """These keys were hit, in this order (some may be gone or pinned since)."""
        ...

    def admitted(self, lru: OrderedDict[str, Any], key: str, entry: Any) -> None: ...

    def victim(self, lru: OrderedDict[str, Any]) -> str: ...

    def evicted(self, entry: Any) -> None: ...


class LRUPolicy:
    """Least-recently-used first."""

    def touch(self, lru: OrderedDict[str, Any], keys: Sequence[str]) -> None:
        move_to_end = lru.move_to_end
        # Only each key's last hit decides its place: hot keys are moved once, not once a hit.
        for key in reversed(dict.fromkeys(reversed(keys))):
            try:  # noqa: SIM105 - a try costs less than contextlib.suppress, once per hit
                move_to_end(key)
            except KeyError:  # pinned, or evicted since the hit: nothing to reorder
                pass

    def admitted(self, lru: OrderedDict[str, Any], key: str, entry: Any) -> None:
        """The store appended ``key`` to ``lru`` (most recently used): nothing more to do."""

    def victim(self, lru: OrderedDict[str, Any]) -> str:
        return next(iter(lru))

    def evicted(self, entry: Any) -> None:
        """Nothing to remember."""


class CostPolicy:
    """GreedyDual-Size: lowest ``L + cost / nbytes`` first (see the module docstring).

    A heap of ``(priority, ticket, key)`` records, refreshed lazily: a record is current only while
    ``key``'s entry carries its ticket (a replaced, evicted or pinned entry's record is stale), and
    stale records are dropped whenever they outnumber the current ones plus ``_SLACK``.
    """

    _SLACK = 64

    def __init__(self) -> None:
        self._inflation = 0.0  # L: the priority of the last evicted entry
        self._heap: list[tuple[float, int, str]] = []
        self._tickets = itertools.count(1)  # ties go to the older record

    def _priority(self, entry: _Entry) -> float:
        return self._inflation + entry.cost / max(entry.nbytes, 1)

    def touch(self, lru: OrderedDict[str, Any], keys: Sequence[str]) -> None:
        inflation = self._inflation
        for key in keys:
            entry = lru.get(key)
            if entry is not None:  # the heap record is refreshed lazily in `victim`
                entry.priority = inflation + entry.cost / max(entry.nbytes, 1)

    def admitted(self, lru: OrderedDict[str, Any], key: str, entry: _Entry) -> None:
        entry.priority = self._priority(entry)
        self._push(key, entry)
        self._drop_stale(lru)

    def _drop_stale(self, lru: OrderedDict[str, Any]) -> None:
        if len(self._heap) > 2 * len(lru) + self._SLACK:  # amortised O(1) per admission
            self._heap = [record for record in self._heap if _current(lru, record)]
            heapq.heapify(self._heap)

    def _push(self, key: str, entry: _Entry) -> None:
        entry.ticket = next(self._tickets)
        heapq.heappush(self._heap, (entry.priority, entry.ticket, key))

    def victim(self, lru: OrderedDict[str, Any]) -> str:
        self._drop_stale(lru)
        heap = self._heap
        while heap:
            priority, ticket, key = heap[0]
            entry: Any = lru.get(key)
            if entry is None or entry.ticket != ticket:  # removed, replaced or pinned since
                heapq.heappop(heap)
            elif entry.priority != priority:  # hit since: re-queue at its current priority
                heapq.heappop(heap)
                self._push(key, entry)
            else:
                return key
        return next(iter(lru))  # unreachable while every admitted entry has a record

    def evicted(self, entry: _Entry) -> None:
        self._inflation = max(self._inflation, entry.priority)


def _current(lru: OrderedDict[str, Any], record: tuple[float, int, str]) -> bool:
    entry = lru.get(record[2])
    return entry is not None and entry.ticket == record[1]


POLICIES: dict[str, Callable[[], EvictionPolicy]] = {"lru": LRUPolicy, "cost": CostPolicy}


def make_policy(name: str) -> EvictionPolicy:
    """A new policy by name (``"lru"`` or ``"cost"``); a `ConfigurationError` for anything else."""
    if name not in POLICIES:
        raise ConfigurationError(f"policy must be one of {sorted(POLICIES)}, got {name!r}")
    policy: EvictionPolicy = POLICIES[name]()
    return policy
