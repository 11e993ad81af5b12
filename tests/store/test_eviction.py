"""Eviction policies of the store: cost-aware GreedyDual-Size (opt-in) and LRU (the default).

GreedyDual-Size keeps the entries whose recompute seconds per byte are highest, and ages the rest:
an entry's priority is ``L + cost / nbytes`` when stored or hit, ``L`` rising to each evicted
entry's priority, so an expensive entry nobody uses any more is eventually evicted too.
"""

from __future__ import annotations

import gc
import tracemalloc
import weakref

import numpy as np
import pytest

from tests.support.internals import get, level_store
from visioncache import ConfigurationError, VisionEmbeddingCache
from visioncache.store.store import PutResult, Store

PIXELS = (1000, 0.022)  # bytes, seconds: large and cheap to recompute (decode + preprocess)
EMBEDDING = (300, 3.0)  # small and expensive (a vision-encoder forward)


def array(nbytes: int) -> np.ndarray:
    return np.zeros(nbytes, dtype=np.uint8)


def put(store: Store, key: str, entry: tuple[int, float]) -> PutResult:
    nbytes, cost = entry
    return store.put(key, array(nbytes), cost=cost)


def present(store: Store, candidates: list[str]) -> list[str]:
    return [key for key in candidates if key in store]


@pytest.mark.parametrize(("policy", "survivor"), [("cost", "embedding"), ("lru", "pixels")])
def test_cheap_large_entry_goes_before_an_expensive_small_one(policy: str, survivor: str) -> None:
    store = Store(max_bytes=1500, policy=policy)
    put(store, "embedding", EMBEDDING)  # older: LRU would evict it first
    put(store, "pixels", PIXELS)
    put(store, "new", (400, 0.5))  # 1700 bytes: one of the two must go
    assert [key for key in ("embedding", "pixels") if key in store] == [survivor]
    assert "new" in store and store.stats().evictions == 1
    assert store.nbytes == 400 + (EMBEDDING[0] if survivor == "embedding" else PIXELS[0])


def test_an_unused_expensive_entry_ages_out() -> None:
    store = Store(max_entries=4, policy="cost")
    store.put("expensive", array(100), cost=1.0)  # 0.01 s/byte, never hit again
    evicted_at = None
    for index in range(200):
        store.put(f"cheap-{index}", array(100), cost=0.3)  # 0.003 s/byte each
        if "expensive" not in store:
            evicted_at = index
            break
    # LRU would evict it at the 4th cheap entry (index 3). GreedyDual-Size keeps it while cheap
    # entries go (cost matters: by hand, until index 12), but not forever (L rises with each eviction).
    assert evicted_at is not None and 8 <= evicted_at <= 20, evicted_at
    assert len(store) == 4 and store.nbytes == 400


def test_hits_keep_an_expensive_entry() -> None:
    store = Store(max_entries=4, policy="cost")
    store.put("expensive", array(100), cost=1.0)
    for index in range(500):
        store.put(f"cheap-{index}", array(100), cost=0.3)
        assert get(store, "expensive") is not None  # each hit refreshes it at the current L
    assert store.stats().evictions == 500 - 3


def test_among_equal_costs_per_byte_the_oldest_goes_first() -> None:
    store = Store(max_entries=3, policy="cost")
    for key in "abc":
        store.put(key, array(100), cost=1.0)
    store.put("d", array(100), cost=1.0)
    assert present(store, list("abcd")) == list("bcd")


def test_replacing_an_entry_uses_its_new_cost() -> None:
    store = Store(max_entries=2, policy="cost")
    store.put("a", array(100), cost=5.0)
    store.put("b", array(100), cost=1.0)
    store.put("a", array(100), cost=0.1)  # now the cheapest
    store.put("c", array(100), cost=1.0)
    assert present(store, list("abc")) == list("bc")


def test_cost_policy_never_evicts_pinned_entries() -> None:
    store = Store(max_bytes=1000, policy="cost")
    store.pin("cheap")
    store.put("cheap", array(600), cost=0.001)  # the lowest priority there is, but pinned
    store.put("dear", array(300), cost=10.0)
    store.put("new", array(300), cost=1.0)
    assert present(store, ["cheap", "dear", "new"]) == ["cheap", "new"]
    assert put(store, "huge", (500, 100.0)) is PutResult.REJECTED  # pinned + it would not fit
    assert "cheap" in store and store.stats().rejections == 1
    store.unpin("cheap")
    store.put("next", array(200), cost=1.0)
    assert present(store, ["cheap", "new", "next"]) == ["new", "next"]  # the cheapest per byte went
    assert store.nbytes == 300 + 200


def test_byte_accounting_stays_exact_under_the_cost_policy() -> None:
    rng = np.random.default_rng(0)
    store = Store(max_entries=16, max_bytes=4000, policy="cost")
    sizes: dict[str, int] = {}
    for step in range(3000):
        key = f"k{rng.integers(64)}"
        action = rng.integers(10)
        if action < 6:
            nbytes = int(rng.integers(1, 600))
            if put(store, key, (nbytes, float(rng.random()))) is not PutResult.REJECTED:
                sizes[key] = nbytes
        elif action < 8:
            get(store, key)
        elif action < 9:
            store.discard(key)
        else:
            store.pin(key)
            nbytes = int(rng.integers(1, 100))
            if put(store, key, (nbytes, 1.0)) is not PutResult.REJECTED:
                sizes[key] = nbytes
            store.unpin(key)
        live = {name: nbytes for name, nbytes in sizes.items() if name in store}
        assert len(store) == len(live) <= 16, step
        assert store.nbytes == sum(live.values()) <= 4000, step  # exact, at every step
    assert store.stats().bytes == store.nbytes == sum(live.values())  # what is stored, to the byte


def test_lru_is_the_default_and_ignores_cost() -> None:
    store = Store(max_entries=2)
    assert store.policy_name == "lru"
    store.put("dear", 1, cost=100.0)
    store.put("cheap", 2, cost=0.0)
    get(store, "dear")  # now the most recently used
    store.put("new", 3, cost=0.0)
    assert present(store, ["dear", "cheap", "new"]) == ["dear", "new"]
    store.put("newer", 4)
    assert "dear" not in store  # least recently used, however expensive


def test_the_cache_passes_its_policy_to_every_level() -> None:
    assert {level_store(VisionEmbeddingCache(), name).policy_name for name in ("pixel", "embedding")} == {
        "lru"
    }
    cache = VisionEmbeddingCache(policy="cost")
    names = ("pixel", "pixel_only", "encoding", "embedding")
    assert {level_store(cache, name).policy_name for name in names} == {"cost"}
    with pytest.raises(ConfigurationError, match="policy"):
        VisionEmbeddingCache(policy="lfu")
    with pytest.raises(ConfigurationError):
        Store(policy="random")


# ---- the policy's bookkeeping never keeps a value alive, and stays proportional ---------
def _alive(references: list[weakref.ref[np.ndarray]]) -> int:
    gc.collect()
    return sum(reference() is not None for reference in references)


@pytest.mark.parametrize("policy", ["lru", "cost"])
def test_regression_cost_policy_keeps_replaced_and_evicted_values_alive(policy: str) -> None:
    """The GreedyDual heap held each record's entry, so every value ever replaced or evicted
    stayed alive (re-setting 3 images 48 times with 4 MiB values: +192 MiB for 12 MiB counted)."""
    store = Store(max_entries=3, policy=policy)
    references: list[weakref.ref[np.ndarray]] = []
    for round_ in range(48):
        for key in "abc":
            value = np.full(1024, round_, np.uint8)
            references.append(weakref.ref(value))
            store.put(key, value, cost=1.0)
            del value
    assert _alive(references) == 3  # the values held, no replaced one
    for key in "def":  # evicts a, b and c
        value = np.zeros(1024, np.uint8)
        references.append(weakref.ref(value))
        store.put(key, value, cost=1.0)
        del value
    store.discard("d")
    assert _alive(references) == 2 == len(store)  # e and f: nothing evicted or discarded
    store.pin("e")
    store.put("e", np.ones(1024, np.uint8), cost=1.0)  # replaced while pinned
    store.unpin("e")
    assert _alive(references) == 1  # f; e's new value is not in the list


@pytest.mark.parametrize("policy", ["lru", "cost"])
def test_regression_cost_policy_bookkeeping_grows_with_every_pinned_hit(policy: str) -> None:
    """While the cache was not full, each pinned hit (pin, hit, unpin) pushed a heap record that
    nothing removed: 60,000 hits kept 60,010 records (+16 MiB) for 10 entries."""
    cache = VisionEmbeddingCache(policy=policy)
    images = [b"pinned image %d" % index for index in range(10)]

    def encode(missing: list[bytes]) -> list[np.ndarray]:
        return [np.zeros(16, np.float32) for _ in missing]

    cache.encode_images(images, encode)
    for image in images:  # first pins and hits allocate their counters and keys
        with cache.pinned([image]):
            cache.encode_images([image], encode)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for index in range(10_000):
            image = images[index % len(images)]
            with cache.pinned([image]):
                cache.encode_images([image], encode)
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.snapshot().levels["embedding"].entries == 10
    assert growth < 64 * 1024, f"{growth} bytes of bookkeeping for 10 entries"
