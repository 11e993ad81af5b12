"""The one store: bounds, LRU order, replacement, rejection, pins and single-flight claims."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.support.cache_values import (
    JOIN_SECONDS,
)
from tests.support.internals import get
from visioncache.store.store import PutResult, Store


def array(nbytes: int) -> np.ndarray:
    return np.zeros(nbytes, dtype=np.uint8)


def test_entry_bound_evicts_least_recently_used():
    store = Store(max_entries=2)
    store.put("a", 1)
    store.put("b", 2)
    assert get(store, "a") == 1  # a is now most recently used
    store.put("c", 3)
    assert "b" not in store and "a" in store and "c" in store
    assert store.stats().evictions == 1


def test_byte_bound_evicts_until_the_new_value_fits():
    store = Store(max_bytes=100)
    for key in "abc":
        store.put(key, array(40))
    assert len(store) == 2 and store.nbytes == 80 and "a" not in store
    store.put("d", array(90))
    assert [store.stats().entries, store.stats().bytes] == [1, 90]


def test_value_larger_than_budget_is_rejected_and_others_stay():
    store = Store(max_bytes=100)
    store.put("small", array(10))
    assert store.put("huge", array(101)) is PutResult.REJECTED
    assert "huge" not in store and "small" in store
    assert store.stats().rejections == 1 and store.nbytes == 10


def test_replacing_a_key_updates_bytes_and_order_without_evicting():
    store = Store(max_entries=2, max_bytes=100)
    store.put("a", array(30))
    store.put("b", array(30))
    assert store.put("a", array(50)) is PutResult.REPLACED
    assert len(store) == 2 and store.nbytes == 80 and store.stats().evictions == 0
    store.put("c", array(10))  # evicts b, the least recently used after a's replacement
    assert "b" not in store and "a" in store


def test_zero_entries_disables_cleanly():
    store = Store(max_entries=0)
    assert store.put("a", 1) is PutResult.DISABLED
    assert get(store, "a") is None and len(store) == 0
    assert store.stats().rejections == 0


def test_pinned_entries_survive_eviction_and_become_evictable_after_release():
    store = Store(max_entries=2)
    store.pin("a")  # pinned before the value exists
    store.put("a", 1)
    store.put("b", 2)
    store.put("c", 3)
    assert "a" in store and "b" not in store
    store.unpin("a")
    get(store, "c")  # a is now least recently used among unpinned entries
    store.put("d", 4)
    assert "a" not in store


def test_pinned_entries_filling_the_budget_reject_new_values():
    store = Store(max_bytes=100)
    store.pin("a")
    store.put("a", array(80))
    assert store.put("b", array(30)) is PutResult.REJECTED
    assert "a" in store and store.nbytes == 80
    store.unpin("a")
    assert store.put("b", array(30)) is PutResult.INSERTED and "a" not in store


def test_pins_are_counted():
    store = Store(max_entries=1)
    store.pin("a")
    store.pin("a")
    store.put("a", 1)
    store.unpin("a")
    assert store.put("b", 2) is PutResult.REJECTED  # a still holds one pin
    store.unpin("a")
    assert store.put("b", 2) is PutResult.INSERTED
    with pytest.raises(RuntimeError, match="unpin without a matching pin"):
        store.unpin("a")


def test_claim_gives_one_owner_and_others_wait_for_its_value():
    store = Store()
    first, second = store.claim("k"), store.claim("k")
    assert first.owner and not second.owner and second.future is first.future
    store.fulfil("k", "value")
    assert second.future.result(timeout=1) == "value"
    assert store.claim("k").value == "value"


def test_abandoned_claim_passes_the_error_to_waiters_and_allows_a_retry():
    store = Store()
    owner, waiter = store.claim("k"), store.claim("k")
    store.abandon("k", KeyError("boom"))
    with pytest.raises(KeyError):
        waiter.future.result(timeout=1)
    assert store.claim("k").owner and "k" not in store
    assert owner.owner


def test_hits_add_their_recorded_cost_to_time_saved():
    store = Store()
    store.put("a", 1, cost=0.25)
    get(store, "a")
    get(store, "a")
    assert store.stats().time_saved == pytest.approx(0.5)


def test_clear_keeps_pins():
    store = Store(max_entries=1)
    store.pin("a")
    store.put("a", 1)
    store.clear()
    assert len(store) == 0 and store.stats().hits == 0
    store.put("a", 1)
    assert store.put("b", 2) is PutResult.REJECTED  # a is still pinned


# ---- store-then-retire gap ---------------------------------------------------------------
class GapStore(Store):
    """A store that runs queued hooks right after each `put` returns.

    A store whose `fulfil` stores with `put` and retires the claim afterwards (the defect) runs the
    hook inside that gap, which is what a concurrent thread may do there; a store that stores and
    retires under one lock never calls `put` from `fulfil`, so the hook runs after `fulfil`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hooks: list[Callable[[], None]] = []

    def put(self, key: str, value: Any, *, cost: float = 0.0) -> Any:
        result = super().put(key, value, cost=cost)
        while self.hooks:
            self.hooks.pop()()
        return result


def test_regression_store_then_retire_gap_loses_the_pinned_value() -> None:
    """Between storing a fresh (unpinned) value and retiring its claim, a concurrent put
    could evict it; a request that pinned the image then joined the stale claim, got the value,
    and nothing was stored under its pin. Constructed deterministically with `GapStore`."""
    store = GapStore(max_entries=1)
    assert store.claim("image").owner
    seen: dict[str, Any] = {}

    def concurrent_request() -> None:
        store.put("other", "other value")  # another request's value evicts the fresh entry
        store.pin("image")  # a request admitted now pins its image ...
        seen["claim"] = store.claim("image")  # ... and looks it up

    store.hooks.append(concurrent_request)
    store.fulfil("image", "value")
    if store.hooks:  # no gap in this store: the request comes right after
        store.hooks.pop()()
    claim = seen["claim"]
    if claim.owner:  # the entry was gone and nobody computes it: the request computes it
        store.fulfil("image", "value")
    elif claim.future is not None:
        assert claim.future.result(timeout=JOIN_SECONDS) == "value"
    assert "image" in store, "the pinned request's image was not stored under its pin"
    store.put("third", "x")  # the budget is one entry; a pinned one is not evicted
    assert "image" in store and "third" not in store
    store.unpin("image")
    assert store.stats().pinned == 0
