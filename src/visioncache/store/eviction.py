"""Eviction policies: which unpinned entry a full `Store` drops first.

The store owns sizes, pins and locking; a policy only orders its unpinned entries (cachetools'
split). Two policies:

- ``"lru"`` (the default): least-recently-used, the store's ``OrderedDict`` order itself;
- ``"cost"``: GreedyDual-Size (Cao & Irani, 1997). An entry's priority is ``L + cost / nbytes``
  (seconds of recompute per byte), refreshed on every hit; the entry with the lowest priority goes
  first and ``L`` rises to it, so entries that stop being used age out. A cheap, large entry
  (18.8 MB of pixels, ~22 ms to recompute) goes before an expensive, small one (a 3 MB embedding,
  seconds of vision encoder).

`touch` runs on the hit path without the store's lock: it makes one atomic change (an
``OrderedDict.move_to_end`` or a float assignment). Everything else runs under the store's lock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from visioncache.errors import ConfigurationError

__all__ = ["POLICIES", "CostPolicy", "EvictionPolicy", "LRUPolicy", "make_policy"]


class _Entry(Protocol):
    nbytes: int
    cost: float
    priority: float


class EvictionPolicy(Protocol):
    """Orders the store's unpinned entries (``lru``: key -> entry, least recently used first)."""

    def touch(self, lru: OrderedDict[str, Any], key: str, entry: Any) -> None: ...

    def admitted(self, key: str, entry: Any) -> None: ...

    def victim(self, lru: OrderedDict[str, Any]) -> str: ...

    def evicted(self, entry: Any) -> None: ...


class LRUPolicy:
    """Least-recently-used first."""

    def touch(self, lru: OrderedDict[str, Any], key: str, entry: Any) -> None:
        try:  # noqa: SIM105 - a try costs less than contextlib.suppress on the hit path
            lru.move_to_end(key)
        except KeyError:  # pinned, or evicted since the read: nothing to reorder
            pass

    def admitted(self, key: str, entry: Any) -> None:
        """The store appended ``key`` to ``lru`` (most recently used): nothing more to do."""

    def victim(self, lru: OrderedDict[str, Any]) -> str:
        return next(iter(lru))

    def evicted(self, entry: Any) -> None:
        """Nothing to remember."""


class CostPolicy:
    """GreedyDual-Size: lowest ``L + cost / nbytes`` first (see the module docstring)."""

    def __init__(self) -> None:
        self._inflation = 0.0  # L: the priority of the last evicted entry
        self._heap: list[tuple[float, int, str, _Entry]] = []  # may hold stale records
        self._order = itertools.count()  # ties go to the older record

    def _priority(self, entry: _Entry) -> float:
        return self._inflation + entry.cost / max(entry.nbytes, 1)

    def touch(self, lru: OrderedDict[str, Any], key: str, entry: _Entry) -> None:
        entry.priority = self._priority(entry)  # the heap record is refreshed lazily in `victim`

    def admitted(self, key: str, entry: _Entry) -> None:
        entry.priority = self._priority(entry)
        heapq.heappush(self._heap, (entry.priority, next(self._order), key, entry))

    def victim(self, lru: OrderedDict[str, Any]) -> str:
        if len(self._heap) > 2 * len(lru) + 64:  # drop stale records of removed or pinned entries
            self._heap = [record for record in self._heap if lru.get(record[2]) is record[3]]
            heapq.heapify(self._heap)
        while self._heap:
            priority, _, key, entry = self._heap[0]
            current: Any = lru.get(key)
            if current is not entry:  # removed, replaced or pinned since it was pushed
                heapq.heappop(self._heap)
            elif entry.priority != priority:  # hit since: re-queue at its current priority
                heapq.heapreplace(self._heap, (entry.priority, next(self._order), key, entry))
            else:
                return key
        return next(iter(lru))  # unreachable while every admitted entry has a record

    def evicted(self, entry: _Entry) -> None:
        self._inflation = max(self._inflation, entry.priority)


POLICIES: dict[str, Callable[[], EvictionPolicy]] = {"lru": LRUPolicy, "cost": CostPolicy}


def make_policy(name: str) -> EvictionPolicy:
    """A new policy by name (``"lru"`` or ``"cost"``); a `ConfigurationError` for anything else."""
    if name not in POLICIES:
        raise ConfigurationError(f"policy must be one of {sorted(POLICIES)}, got {name!r}")
    policy: EvictionPolicy = POLICIES[name]()
    return policy
