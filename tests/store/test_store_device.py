"""The device budget: values on an accelerator stay there within a budget of their own, spill to the
host past it (least recently used first), come back at their next hit, and pinned ones stay put.

Runs with real torch CPU tensors and `tests.support.fake_device.FakePlacement`, which calls the
CPU an accelerator and records every copy, so each test sees where every value came from.
"""

from __future__ import annotations

import os
import random
import sys
import threading
from collections.abc import Iterator
from decimal import Decimal

import numpy as np
import pytest
import torch

from tests.support.fake_device import FakePlacement, check_books, tensor
from tests.support.forks import run_in_child
from tests.support.internals import get
from tests.support.memory_tier import MemoryTier
from visioncache import VisionEmbeddingCache
from visioncache.errors import ConfigurationError
from visioncache.level import Level
from visioncache.store.device import AUTO_FALLBACK_BYTES, TorchPlacement, parse_device_budget
from visioncache.store.store import PutResult, Store
from visioncache.tiers.chain import TierChain

NBYTES = tensor(0).nbytes  # 1 KiB per value


def device_store(
    device_entries: int | None = 2, host_entries: int | None = 2, **kwargs: object
) -> tuple[Store, FakePlacement]:
    placement = FakePlacement()
    budget = None if device_entries is None else device_entries * NBYTES
    host = None if host_entries is None else host_entries * NBYTES
    store = Store(100, host, device_bytes=budget, placement=placement, **kwargs)  # type: ignore[arg-type]
    return store, placement


def test_a_device_hit_returns_the_stored_tensor_itself_with_no_copy() -> None:
    store, placement = device_store()
    value = tensor(1)
    assert store.put("a", value) is PutResult.INSERTED
    assert get(store, "a") is value
    stats = store.stats()
    assert (stats.device_bytes, stats.host_bytes, stats.spills) == (NBYTES, 0, 0)
    assert placement.to_host_calls == placement.to_device_calls == 0


def test_past_the_device_budget_the_least_recently_used_entry_is_spilled_to_the_host_not_dropped() -> None:
    store, placement = device_store(device_entries=2, host_entries=4)
    values = {key: tensor(seed) for seed, key in enumerate("abc")}
    store.put("a", values["a"])
    store.put("b", values["b"])
    assert get(store, "a") is values["a"]  # a is now more recent than b
    store.put("c", values["c"])
    entries = check_books(store)
    assert set(entries) == {"a", "b", "c"}
    assert entries["b"].spilled and id(entries["b"].value) in placement.host_copies
    assert torch.equal(entries["b"].value, values["b"])
    assert entries["a"].value is values["a"] and entries["c"].value is values["c"]
    stats = store.stats()
    assert (stats.device_bytes, stats.host_bytes, stats.spills, stats.evictions) == (2 * NBYTES, NBYTES, 1, 0)


def test_a_hit_on_a_spilled_entry_places_it_back_on_the_device_and_spills_another() -> None:
    store, placement = device_store(device_entries=2, host_entries=4)
    values = [tensor(seed) for seed in range(3)]
    for key, value in zip("abc", values, strict=True):
        store.put(key, value)  # a spilled
    restored = get(store, "a")
    assert restored is not None and id(restored) in placement.device_copies
    assert torch.equal(restored, values[0])
    assert get(store, "a") is restored  # back on the device: the next hit copies nothing
    entries = check_books(store)
    assert entries["b"].spilled and not entries["a"].spilled  # b was the least recent device entry
    stats = store.stats()
    assert (stats.spills, stats.restores, stats.device_bytes, stats.host_bytes) == (2, 1, 2 * NBYTES, NBYTES)
    assert placement.to_device_calls == 1


def test_host_eviction_drops_spilled_entries_when_the_host_budget_is_full() -> None:
    store, _ = device_store(device_entries=1, host_entries=1)
    for seed, key in enumerate("abc"):
        store.put(key, tensor(seed))
    entries = check_books(store)
    assert set(entries) == {"b", "c"} and entries["b"].spilled and not entries["c"].spilled
    stats = store.stats()
    assert (stats.spills, stats.evictions, stats.entries) == (2, 1, 2)


def test_a_spill_the_host_cannot_hold_is_dropped_without_a_copy() -> None:
    store, placement = device_store(device_entries=1, host_entries=0)
    store.put("a", tensor(1))
    store.put("b", tensor(2))
    assert set(check_books(store)) == {"b"}
    assert placement.to_host_calls == 0 and store.stats().evictions == 1


def test_a_pinned_device_entry_is_never_spilled_and_a_new_value_waits_on_the_host() -> None:
    store, placement = device_store(device_entries=2, host_entries=4)
    store.pin("a")
    store.pin("b")
    originals = {key: tensor(seed) for seed, key in enumerate("abc")}
    for key, value in originals.items():
        store.put(key, value)
    entries = check_books(store)
    assert entries["a"].value is originals["a"] and entries["b"].value is originals["b"]
    assert entries["c"].spilled and store.stats().spills == 1
    assert get(store, "c") is entries["c"].value  # no room while a and b are pinned: served from the host
    assert store.stats().restores == 0
    store.unpin("a")
    restored = get(store, "c")  # a is unpinned now: it is spilled, and c placed back
    entries = check_books(store)
    assert id(restored) in placement.device_copies and entries["a"].spilled and not entries["b"].spilled


def test_a_value_larger_than_the_device_budget_is_kept_on_the_host() -> None:
    store, _ = device_store(device_entries=1, host_entries=4)
    big = torch.zeros(1024)  # 4 KiB > 1 KiB
    store.put("big", big)
    store.put("small", tensor(1))
    entries = check_books(store)
    assert entries["big"].spilled and not entries["small"].spilled
    assert get(store, "big") is entries["big"].value  # cannot fit: the host copy
    assert store.stats().restores == 0 and not check_books(store)["small"].spilled


def test_a_zero_device_budget_keeps_every_value_on_the_host() -> None:
    store, placement = device_store(device_entries=0, host_entries=4)
    value = tensor(1)
    store.put("a", value)
    held = get(store, "a")
    assert held is not value and id(held) in placement.host_copies and placement.to_device_calls == 0
    assert store.stats().device_bytes == 0 and store.stats().host_bytes == NBYTES


def test_without_a_device_budget_every_byte_counts_against_the_host_budget() -> None:
    """None is the other levels' setting, and today's: no residency, nothing copied."""
    store, placement = device_store(device_entries=None, host_entries=2)
    values = [tensor(seed) for seed in range(3)]
    for key, value in zip("abc", values, strict=True):
        store.put(key, value)
    assert set(check_books(store)) == {"b", "c"} and store.stats().evictions == 1
    assert placement.to_host_calls == placement.to_device_calls == placement.free_calls == 0


def test_host_values_are_not_device_values() -> None:
    store, placement = device_store()
    store.put("numpy", [1, 2, 3])
    store.put("bytes", b"xyz")
    assert store.stats().device_bytes == 0 and placement.free_calls == 0


@pytest.mark.parametrize(
    ("setting", "free", "expected"),
    [
        ("auto", 4000 * NBYTES, 1000 * NBYTES),
        ("50%", 4000 * NBYTES, 2000 * NBYTES),
        ("auto", None, AUTO_FALLBACK_BYTES),
        ("3KiB", 0, 3 * NBYTES),
    ],
)
def test_the_device_budget_is_resolved_once_at_the_first_device_value(
    setting: str, free: int | None, expected: int
) -> None:
    placement = FakePlacement(free=free)
    store = Store(None, None, device_bytes=setting, placement=placement)
    assert store.device_budget == (None if "%" in setting or setting == "auto" else expected)
    store.put("host", b"bytes")
    assert placement.free_calls == 0  # a host value reads nothing of the device
    store.put("a", tensor(1))
    store.put("b", tensor(2))
    assert store.device_budget == expected
    assert placement.free_calls == (1 if setting in ("auto", "50%") else 0)


@pytest.mark.parametrize("bad", ["-1", "150%", "0%", 1.5, True, "lots", -1, b"1GiB", Decimal(1)])
def test_bad_device_budgets_are_typed_errors_before_anything_is_built(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="device_bytes"):
        parse_device_budget(bad)
    with pytest.raises(ConfigurationError, match="max_embedding_device_bytes"):
        VisionEmbeddingCache(max_embedding_device_bytes=bad)  # type: ignore[arg-type]


def test_a_failed_copy_to_the_host_drops_the_victim_or_rejects_the_value_and_keeps_the_books() -> None:
    store, placement = device_store(device_entries=1, host_entries=4)
    store.put("a", tensor(1))
    placement.fail = True
    store.put("b", tensor(2))  # a cannot be copied: dropped, its tiers keep it
    assert set(check_books(store)) == {"b"} and store.stats().evictions == 1
    store.pin("b")
    assert store.put("c", tensor(3)) is PutResult.REJECTED  # held on the host, but the copy fails
    assert set(check_books(store)) == {"b"}
    placement.fail = False
    store.unpin("b")


def test_a_failed_copy_back_to_the_device_serves_the_hit_from_the_host() -> None:
    store, placement = device_store(device_entries=1, host_entries=4)
    store.put("a", tensor(1))
    store.put("b", tensor(2))
    placement.fail = True
    held = get(store, "a")
    assert held is not None and id(held) in placement.host_copies and store.stats().restores == 0
    check_books(store)


def test_the_cost_policy_orders_the_host_entries_that_spills_land_in() -> None:
    store, _ = device_store(device_entries=1, host_entries=2, policy="cost")
    for seed, key in enumerate("abcd"):
        store.put(key, tensor(seed), cost=float(seed))
    entries = check_books(store)
    assert set(entries) == {"b", "c", "d"} and not entries["d"].spilled
    assert get(store, "b") is not None and not check_books(store)["b"].spilled


def test_clear_forgets_the_device_entries_and_their_bytes() -> None:
    store, _ = device_store()
    store.put("a", tensor(1))
    store.clear()
    assert check_books(store) == {} and store.stats().device_bytes == 0


def test_the_torch_placement_governs_accelerators_only_and_reads_cuda_free_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    placement = TorchPlacement()
    cuda, mps, xpu = torch.device("cuda", 1), torch.device("mps"), torch.device("xpu")
    assert [placement.home(device) for device in (cuda, mps, xpu)] == [cuda, mps, xpu]
    assert placement.home(torch.device("cpu")) is None and placement.home(None) is None
    assert placement.home(torch.device("meta")) is None
    asked: list[object] = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (asked.append(device), (123, 456))[1])
    assert placement.free_bytes(cuda) == 123 and asked == [cuda]
    assert placement.free_bytes(torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "mem_get_info", _no_driver)
    assert placement.free_bytes(cuda) is None  # the fallback budget, not an error mid-put
    host = placement.to_host({"x": tensor(1)})
    assert host["x"].device == torch.device("cpu")


def _no_driver(device: object) -> tuple[int, int]:
    raise RuntimeError("Found no NVIDIA driver on your system")


def test_the_embedding_level_defaults_to_an_auto_device_budget_and_cpu_values_stay_host_values() -> None:
    cache = VisionEmbeddingCache()
    store = cache._levels["embedding"].store
    assert store._budget is not None and store._budget.fraction == Decimal("0.25")
    assert all(cache._levels[name].store._budget is None for name in ("pixel", "pixel_only", "encoding"))
    cache.set_image_embeddings([np.zeros((8, 8, 3), np.uint8)], [tensor(1)])
    stats = cache.snapshot().levels["embedding"]
    assert (stats.device_bytes, stats.host_bytes) == (0, NBYTES)
    assert cache.get_stats()["embedding_cache_spills"] == 0


def test_a_level_keeps_computed_values_on_the_device_within_its_budget() -> None:
    placement = FakePlacement()
    level = Level("embedding", Store(100, 8 * NBYTES, device_bytes=2 * NBYTES, placement=placement))
    computed = [tensor(seed) for seed in range(3)]
    values = level.resolve(["a", "b", "c"], [0, 1, 2], lambda items: [computed[i] for i in items])
    assert all(value is original for value, original in zip(values, computed, strict=True))
    entries = check_books(level.store)
    assert entries["a"].spilled and level.stats().spills == 1
    again = level.resolve(["c"], [2], lambda items: pytest.fail("cached"))
    assert again[0] is computed[2]  # on the device: the tensor itself
    again = level.resolve(["a", "b"], [0, 1], lambda items: pytest.fail("cached"))
    # a comes back (spilling b, the least recent on the device), then b (spilling c)
    assert all(id(value) in placement.device_copies for value in again)
    assert [torch.equal(value, computed[i]) for i, value in enumerate(again)] == [True, True]
    stats = level.stats()
    assert (stats.restores, stats.spills, stats.hits, stats.device_bytes) == (2, 3, 3, 2 * NBYTES)


# ---- threads and forks ------------------------------------------------------------------
@pytest.fixture
def tiny_switch_interval() -> Iterator[None]:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def test_spills_restores_pins_and_evictions_keep_the_books_exact_under_threads(
    tiny_switch_interval: None,
) -> None:
    """Eight threads put, hit, pin and unpin twelve keys in a store whose device holds three and
    host four: every hit is the key's own content, and the books balance after every round."""
    store, _ = device_store(device_entries=3, host_entries=4)
    store.max_entries = 6
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(300):
                key = rng.randrange(12)
                action = rng.random()
                if action < 0.4:
                    store.put(str(key), tensor(key))
                elif action < 0.9:
                    value = get(store, str(key))
                    assert value is None or torch.equal(value, tensor(key)), (key, value)
                else:
                    store.pin(str(key))
                    value = get(store, str(key))
                    assert value is None or torch.equal(value, tensor(key))
                    store.unpin(str(key))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors[0]
    entries = check_books(store)
    stats = store.stats()
    assert stats.spills > 0 and stats.restores > 0
    assert stats.bytes == sum(entry.nbytes for entry in entries.values()) and stats.pinned == 0
    for key, entry in entries.items():
        assert torch.equal(entry.value, tensor(int(key)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_threads_spill_and_restore_reads_its_entries(tiny_switch_interval: None) -> None:
    store, _ = device_store(device_entries=2, host_entries=4)
    stop = threading.Event()

    def churn() -> None:
        rng = random.Random(0)
        while not stop.is_set():
            key = rng.randrange(6)
            store.put(str(key), tensor(key)) if rng.random() < 0.5 else get(store, str(key))

    def child() -> bool:
        before = store.stats()
        for key in range(6):
            store.put(str(key), tensor(key))
        for key in range(6):  # the first four were spilled: each hit places one back
            value = get(store, str(key))
            if value is None or not torch.equal(value, tensor(key)):
                return False
        check_books(store)
        return store.stats().restores >= before.restores + 4

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        outcomes = [run_in_child(child) for _ in range(5)]
    finally:
        stop.set()
        thread.join(60)
    assert outcomes == ["ok"] * 5
    check_books(store)


def test_an_entry_spilled_then_evicted_from_the_host_comes_back_from_the_tiers_onto_the_device() -> None:
    """Write-down happens when a value is stored, so a spill the host then drops is still shared,
    and its tier hit is placed where the level computes (the device budget's again)."""
    placement = FakePlacement()
    store = Store(100, NBYTES, device_bytes=NBYTES, placement=placement)
    level = Level("embedding", store, TierChain([MemoryTier(2**20)], max_pending_write_bytes=0))
    computed = [tensor(seed) for seed in range(3)]
    level.resolve(["a", "b", "c"], [0, 1, 2], lambda items: [computed[i] for i in items])
    level.tiers.flush(60)  # type: ignore[union-attr]
    assert set(check_books(store)) == {"b", "c"} and store.stats().evictions == 1  # a: spilled, dropped
    (loaded,) = level.get_many(["a"])
    assert loaded is not None and torch.equal(loaded, computed[0])
    entries = check_books(store)
    assert not entries["a"].spilled and entries["a"].value is loaded and entries["c"].spilled
    assert store.stats().device_bytes == NBYTES


def test_the_constructor_and_from_env_set_the_embedding_device_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [name for name in os.environ if name.startswith("VISIONCACHE_")]:
        monkeypatch.delenv(name)
    cache = VisionEmbeddingCache.from_env(max_embedding_device_bytes="1GiB")
    assert cache._levels["embedding"].store.device_budget == 2**30
    assert VisionEmbeddingCache(max_embedding_device_bytes=None)._levels["embedding"].store._budget is None
