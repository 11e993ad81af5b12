"""Where a store's entries live and what makes room for a new one: the host order, the device
order and the pinned entries, their byte counts, eviction, spills to the host and restores.

`Rooms` is `Store`'s base (`visioncache.store.store`, whose module docstring states the
guarantees): split out so each file stays one subject. Every method here but `_restore` runs
under the store's lock; `_restore` copies outside it and installs under it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from visioncache.store.counters import ThreadCounters
from visioncache.store.device import DeviceBudget, Placement
from visioncache.store.eviction import EvictionPolicy
from visioncache.store.types import Entry

__all__ = ["Rooms", "touch_device"]


class Rooms:
    """The entries of a store by where they live, and the moves between (under its lock)."""

    max_entries: int | None
    max_bytes: int | None
    _budget: DeviceBudget | None
    _placement: Placement
    _policy: EvictionPolicy
    _lock: threading.Lock
    _counters: ThreadCounters
    _lru: OrderedDict[str, Entry]  # unpinned host entries, in the policy's order
    _device: OrderedDict[str, Entry]  # unpinned device entries, least recently used first
    _pinned: dict[str, Entry]
    _pins: dict[str, int]
    _nbytes: int  # all entries
    _device_nbytes: int  # entries on a device, pinned or not
    _pinned_nbytes: int  # pinned host entries
    _pinned_device_nbytes: int  # pinned device entries

    def _apply_touches(self) -> None:
        raise NotImplementedError  # `Store`'s: buffered hits handed to the orders

    def __len__(self) -> int:
        return len(self._lru) + len(self._device) + len(self._pinned)

    def _stored(self, key: str) -> Entry | None:
        return self._lru.get(key) or self._pinned.get(key) or self._device.get(key)

    def _can_fit(self, nbytes: int) -> bool:
        # Only unpinned entries can be evicted, so pinned ones plus the new value must fit.
        if self.max_entries is not None and len(self._pinned) + 1 > self.max_entries:
            return False
        return self.max_bytes is None or self._pinned_nbytes + nbytes <= self.max_bytes

    def _evict_for(self, nbytes: int, *, entry: bool = True) -> None:
        """Drop unpinned entries until ``nbytes`` more host bytes (and, if ``entry``, one more
        entry) fit; host entries go first, by the policy; device entries only for the entry bound."""
        while True:
            host = self._nbytes - self._device_nbytes
            over_bytes = self.max_bytes is not None and host + nbytes > self.max_bytes
            if self._lru and (over_bytes or (entry and self._over_entries())):
                victim = self._lru.pop(self._policy.victim(self._lru))
                self._policy.evicted(victim)
            elif self._device and entry and self._over_entries():
                victim = self._device.popitem(last=False)[1]
                self._device_nbytes -= victim.nbytes
            else:
                return
            self._nbytes -= victim.nbytes
            self._counters.local()["evictions"] += 1

    def _over_entries(self) -> bool:
        return self.max_entries is not None and len(self) >= self.max_entries

    # ---- device residency ----------------------------------------------------------------------
    def _room_on_device(self, nbytes: int, device: Any) -> bool:
        """Spill unpinned device entries (least recently used first) until ``nbytes`` fit in the
        device budget; False, and nothing spilled, if pinned device entries leave too little."""
        assert self._budget is not None
        limit = self._budget.resolve(self._placement, device)
        if self._pinned_device_nbytes + nbytes > limit:
            return False
        while self._device_nbytes + nbytes > limit:
            key, victim = self._device.popitem(last=False)
            self._spill(key, victim)
        return True

    def _spill(self, key: str, victim: Entry) -> None:
        """Move an unpinned device entry (already out of ``_device``) to the host, or drop it
        when the host cannot hold it (its tiers still do)."""
        self._device_nbytes -= victim.nbytes
        host = None
        if self.max_bytes is None or self._pinned_nbytes + victim.nbytes <= self.max_bytes:
            try:
                host = self._placement.to_host(victim.value)
            except Exception:  # a failed copy drops the entry, as an eviction would
                host = None
        if host is None:
            self._nbytes -= victim.nbytes
            self._counters.local()["evictions"] += 1
            return
        victim.value, victim.device = host, None
        self._lru[key] = victim
        self._policy.admitted(self._lru, key, victim)
        self._counters.local()["spills"] += 1
        self._evict_for(0, entry=False)

    def _restore(self, key: str, entry: Entry) -> Entry:
        """A spilled entry placed back on its device (copied outside the lock) if it is still
        stored and fits; else the entry as it is (the host copy, or another thread's restore)."""
        limit = None if self._budget is None else self._budget.limit
        if limit is None or self._pinned_device_nbytes + entry.nbytes > limit:
            return entry  # cannot fit (a lock-free early answer: no copy made only to be dropped)
        try:
            value = self._placement.to_device(entry.value, entry.home)
        except Exception:  # the hit is served from the host
            return entry
        with self._lock:
            if self._stored(key) is not entry or not entry.spilled:
                return entry
            self._apply_touches()
            self._remove(key)  # out of the host order first: spilling others may evict host entries
            if self._room_on_device(entry.nbytes, entry.home):
                entry.value, entry.device = value, entry.home
                self._counters.local()["restores"] += 1
            self._insert(key, entry)
        return entry

    def _insert(self, key: str, entry: Entry) -> None:
        """Admit ``entry`` (room already made) to the pinned, device or host entries; count it."""
        on_device = entry.device is not None
        self._nbytes += entry.nbytes
        self._device_nbytes += entry.nbytes if on_device else 0
        if self._pins.get(key, 0) > 0:
            self._pinned[key] = entry
            self._count_pinned(entry, 1)
        elif on_device:
            self._device[key] = entry
        else:
            self._lru[key] = entry
            self._policy.admitted(self._lru, key, entry)

    def _count_pinned(self, entry: Entry, sign: int) -> None:
        if entry.device is not None:
            self._pinned_device_nbytes += sign * entry.nbytes
        else:
            self._pinned_nbytes += sign * entry.nbytes

    def _remove(self, key: str) -> Entry | None:
        entry = self._lru.pop(key, None) or self._device.pop(key, None)
        if entry is None:
            entry = self._pinned.pop(key, None)
            if entry is not None:
                self._count_pinned(entry, -1)
        if entry is not None:
            self._nbytes -= entry.nbytes
            self._device_nbytes -= entry.nbytes if entry.device is not None else 0
        return entry


def touch_device(device: OrderedDict[str, Entry], keys: list[str]) -> None:
    """Device entries in hit order, least recently used first (what `_room_on_device` spills)."""
    for key in keys:
        if key in device:
            device.move_to_end(key)
