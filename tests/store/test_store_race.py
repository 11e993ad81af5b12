"""Regression tests: hits and evictions are correct by construction.

The defect: a lock-free hit reordered the store's ``OrderedDict`` (``move_to_end``) while an
eviction, under the store's lock, iterated it (``next(iter(lru))``), so a thread switch between
the two raised ``RuntimeError: OrderedDict mutated during iteration`` in about 1 run of 3 of the
issue's workload. Two tests pin it: one puts a thread switch (a full hit by another thread) at
every C call an eviction makes, so any interleaving that can break it does, every time; the other
is the issue's own workload at a 1 µs switch interval, repeated.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import numpy as np
import pytest

from tests.support.internals import get, level_store
from visioncache import VisionEmbeddingCache
from visioncache.errors import UnsupportedRuntimeError
from visioncache.store.store import Store

JOIN_SECONDS = 60.0


class Interleaver:
    """Makes another thread run ``hit()`` before every C call the calling thread makes while armed.

    A profile hook sees a ``c_call`` event before each call of a builtin, so the other thread's hit
    lands between any two C operations of the armed code (e.g. between ``iter(d)`` and ``next()``):
    the adversarial scheduler a 1 µs switch interval only approximates.
    """

    def __init__(self, hit: Callable[[], object]) -> None:
        self._hit = hit
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._stop = False
        self.switches = 0
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._go.acquire()
            if self._stop:
                return
            try:
                self._hit()
            except BaseException as error:  # reported by the test
                self.errors.append(error)
            self._done.release()

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            self.switches += 1
            self._go.release()
            if not self._done.acquire(timeout=JOIN_SECONDS):
                raise AssertionError("the other thread's hit did not finish (it waits for this one?)")

    @contextmanager
    def armed(self) -> Iterator[None]:
        sys.setprofile(self._profile)
        try:
            yield
        finally:
            sys.setprofile(None)

    def close(self) -> None:
        self._stop = True
        self._go.release()
        self._thread.join(JOIN_SECONDS)


@pytest.mark.parametrize("policy", ["lru", "cost"])
def test_regression_lock_free_hit_reorders_the_lru_an_eviction_iterates(policy: str) -> None:
    store = Store(max_entries=4, policy=policy)
    keys = [f"key-{index}" for index in range(4)]
    for key in keys:
        store.put(key, np.full(4, len(key), np.int32))
    turn = iter(range(10**9))
    # `find` is the hit path itself: lock-free, so the hit never waits for the evicting thread
    interleaver = Interleaver(lambda: store.find(keys[next(turn) % len(keys)]))
    try:
        for index in range(8):  # each put of a new key evicts one
            with interleaver.armed():
                store.put(f"new-{index}", np.zeros(4, np.int32))
            keys = [key for key in keys if key in store] + [f"new-{index}"]
    finally:
        interleaver.close()
    assert interleaver.switches > 8 and interleaver.errors == []
    assert len(store) == 4 and store.stats().evictions == 8
    assert store.nbytes == 4 * 16


def test_buffered_hits_keep_lru_order_exact() -> None:
    """Hits buffered on the lock-free path are applied, in order, before the next eviction."""
    store = Store(max_entries=3)
    for key in "abc":
        store.put(key, key)
    assert get(store, "a") == "a" and get(store, "b") == "b"  # c is now least recently used
    store.put("d", "d")
    assert [key for key in "abcd" if key in store] == ["a", "b", "d"]
    for _ in range(1000):  # more hits than the buffer holds: drained on the hit path
        get(store, "a")
    store.put("e", "e")
    assert [key for key in "abde" if key in store] == ["a", "d", "e"]


@pytest.mark.slow
def test_regression_reference_api_churn_raises_ordered_dict_mutated_during_iteration() -> None:
    """The issue's workload: 8 threads of the reference API on tiny budgets at a 1 µs switch
    interval (about 1 run in 3 failed), repeated so that the old code fails almost surely."""
    images = [b"race image %d" % index for index in range(10)]
    value = np.zeros(4, np.float32)
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _run in range(8):
            cache = VisionEmbeddingCache(max_pixel_entries=4, max_encoding_entries=2)
            errors: list[BaseException] = []

            def work(
                seed: int, cache: VisionEmbeddingCache = cache, errors: list[BaseException] = errors
            ) -> None:
                rng = np.random.default_rng(seed)
                try:
                    for _ in range(12_000):
                        image = [images[int(rng.integers(len(images)))]]
                        draw = rng.random()
                        if draw < 0.25:
                            cache.set_pixel_cache(image, "p", value, value)
                        elif draw < 0.5:
                            cache.set_encoding_cache(image, "p", value, 1, value)
                        elif draw < 0.75:
                            cache.get_pixel_cache(image, "p")
                        else:
                            cache.get_encoding_cache(image, "p")
                except BaseException as error:  # reported below
                    errors.append(error)

            threads = [threading.Thread(target=work, args=(seed,), daemon=True) for seed in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(JOIN_SECONDS)
            assert not any(thread.is_alive() for thread in threads)
            assert errors == []
            stats = cache.snapshot().levels
            assert stats["pixel"].entries <= 4 and stats["encoding"].entries <= 2
    finally:
        sys.setswitchinterval(previous)


def test_free_threaded_python_without_the_gil_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hit path relies on the GIL (visioncache.runtime): without it a cache refuses to start."""
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
    with pytest.raises(UnsupportedRuntimeError, match="PYTHON_GIL=1"):
        VisionEmbeddingCache()
    with pytest.raises(UnsupportedRuntimeError):
        Store()
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)  # PYTHON_GIL=1
    assert len(level_store(VisionEmbeddingCache(max_pixel_entries=2), "pixel")) == 0


def test_regression_membership_saw_a_pinned_key_missing_while_another_thread_replaced_it() -> None:
    """The defect: ``key in store`` read the dicts without the lock, and a replacement (``put`` of a
    stored key: out of the dicts, then back in, under the lock) looked like an eviction in between:
    the churn test reported "image 62 evicted while pinned" on a loaded machine. Here the replacing
    thread stops between the two; membership must wait for it and answer True."""
    store = Store(max_entries=4)
    store.pin("k")
    store.put("k", np.zeros(4, np.int32))
    inside, go_on = threading.Event(), threading.Event()
    insert = store._insert

    def paused_insert(key: str, entry: Any) -> None:
        inside.set()
        assert go_on.wait(JOIN_SECONDS)
        insert(key, entry)

    store._insert = paused_insert  # type: ignore[method-assign]
    writer = threading.Thread(target=store.put, args=("k", np.ones(4, np.int32)), daemon=True)
    writer.start()
    assert inside.wait(JOIN_SECONDS)
    seen: list[bool] = []
    reader = threading.Thread(target=lambda: seen.append("k" in store), daemon=True)
    reader.start()
    reader.join(0.05)  # the reader is blocked on the lock (with the defect: answered False already)
    go_on.set()
    writer.join(JOIN_SECONDS)
    reader.join(JOIN_SECONDS)
    assert seen == [True]
    assert store.stats().pinned == 1 and store.lookup("k") is not None
