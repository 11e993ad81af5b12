"""A fake accelerator for the device budget's tests: real torch CPU tensors, a recorded placement.

`visioncache.store.device.Placement` is the seam: ``FakePlacement`` calls the CPU an accelerator
(so values computed on it are device values), and makes every copy to the "host" or back to the
"device" a real ``clone`` whose identity it records, so a test can tell where a value the store
holds or returns came from, and count the copies each step made.
"""

from __future__ import annotations

from typing import Any

import torch

from visioncache.store.store import Entry, Store

__all__ = ["DEVICE", "FakePlacement", "check_books", "tensor"]

DEVICE = torch.device("cpu")  # what `trees.prepare` reports for these tensors: the fake's accelerator


def tensor(seed: int, elements: int = 256) -> torch.Tensor:
    """A float32 tensor of ``elements`` (4 bytes each) whose content names ``seed``."""
    return torch.full((elements,), float(seed))


class FakePlacement:
    """The CPU as an accelerator with ``free`` bytes free; copies are clones, recorded by id."""

    def __init__(self, free: int | None = 1 << 30) -> None:
        self.free = free
        self.to_host_calls = 0
        self.to_device_calls = 0
        self.free_calls = 0
        self.fail = False  # every copy raises while set
        self.host_copies: set[int] = set()  # ids of the values `to_host` made
        self.device_copies: set[int] = set()  # ids of the values `to_device` made
        self._keep: list[Any] = []  # ids stay unique while the copies are alive

    def home(self, device: Any) -> Any | None:
        return device if device == DEVICE else None

    def to_host(self, value: Any) -> Any:
        self.to_host_calls += 1
        return self._copy(value, self.host_copies)

    def to_device(self, value: Any, device: Any) -> Any:
        assert device == DEVICE, device
        self.to_device_calls += 1
        return self._copy(value, self.device_copies)

    def free_bytes(self, device: Any) -> int | None:
        self.free_calls += 1
        return self.free

    def _copy(self, value: Any, into: set[int]) -> Any:
        if self.fail:
            raise RuntimeError("fake device: copy failed")
        copied = value.clone()
        into.add(id(copied))
        self._keep.append(copied)
        return copied


def check_books(store: Store) -> dict[str, Entry]:
    """Every entry of ``store`` by key, after checking each byte count against its entries and
    each budget (under the store's lock): the bookkeeping the spill logic must keep exact."""
    with store._lock:
        host, device, pinned = dict(store._lru), dict(store._device), dict(store._pinned)
        assert not set(host) & set(device) and not (set(host) | set(device)) & set(pinned)
        assert all(entry.device is None for entry in host.values())
        assert all(entry.device is not None for entry in device.values())
        everything = {**host, **device, **pinned}
        on_device = [entry for entry in everything.values() if entry.device is not None]
        assert store._nbytes == sum(entry.nbytes for entry in everything.values())
        assert store._device_nbytes == sum(entry.nbytes for entry in on_device)
        assert store._pinned_device_nbytes == sum(e.nbytes for e in pinned.values() if e.device is not None)
        assert store._pinned_nbytes == sum(e.nbytes for e in pinned.values() if e.device is None)
        if store.max_bytes is not None:
            assert store._nbytes - store._device_nbytes <= store.max_bytes
        if store.device_budget is not None:
            assert store._device_nbytes <= store.device_budget
        if store.max_entries is not None:
            assert len(everything) <= store.max_entries
        return everything
