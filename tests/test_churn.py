"""Churn: 8 threads, over 100k mixed operations on small budgets, at a
1 µs switch interval (so threads switch between almost any two operations).

Operations: `encode_batch` over overlapping images, lookups, stores, pinned blocks under pressure,
encoders that fail, encoders that look other images up (re-entrant), per-image preprocessing and
``expect=`` validation, with the LRU policy over a disk tier and the cost policy over a (memory)
tier. Every value names its image, so every value returned is checked. Asserted afterwards: no
thread hung or raised, no value was wrong, pinned entries were never evicted while pinned, the
budgets held at every moment, byte accounting is exact, and RSS grew by at most the byte budgets
plus ``RSS_SLACK`` (a stated constant for the interpreter's and allocator's own growth: per-thread
malloc arenas, numpy's caches, counters, SQLite's page cache). The figures are printed
(``pytest -s tests/test_churn.py``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.internals import level_store
from tests.support.memory_tier import MemoryTier
from visioncache import PixelOnlyCacheEntry, VisionEmbeddingCache
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.trees import tree_nbytes

THREADS = 8
OPERATIONS_PER_THREAD = 12_600  # > 100k in all
POOL = 160  # distinct images; the budgets hold about a third of their values
IMAGES = [b"churn image %05d" % index for index in range(POOL)]
SIZES = [256 + (index % 8) * 448 for index in range(POOL)]  # int32 elements: 1 KiB to 13 KiB
EMBEDDING_BYTES, PIXEL_BYTES = 256 * 1024, 128 * 1024
TIER_BYTES, PENDING_WRITE_BYTES = 512 * 1024, 128 * 1024
RSS_SLACK = 64 * 2**20
SWITCH_INTERVAL = 1e-6
JOIN_SECONDS = 300.0


class EncoderFailure(RuntimeError):
    """An injected encoder failure (an out-of-memory, a device error)."""


def index_of(image: bytes) -> int:
    return int(image[-5:])


def embedding(index: int) -> np.ndarray:
    return np.full(SIZES[index], index, np.int32)


def pixels(index: int) -> PixelOnlyCacheEntry:
    return PixelOnlyCacheEntry(np.full(SIZES[index] // 2, index, np.int32), (1, index, 1))


def is_embedding(value: Any, index: int) -> bool:
    return (
        isinstance(value, np.ndarray)
        and value.dtype == np.int32
        and value.shape == (SIZES[index],)
        and bool((value == index).all())
    )


def is_pixels(value: Any, index: int) -> bool:
    return (
        isinstance(value, PixelOnlyCacheEntry)
        and tuple(value.image_grid_thw) == (1, index, 1)
        and value.pixel_values.shape == (SIZES[index] // 2,)
        and bool((value.pixel_values == index).all())
    )


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass
class Tally:
    operations: int = 0
    wrong: list[str] = field(default_factory=list)
    pin_violations: list[str] = field(default_factory=list)
    injected_failures: int = 0
    errors: list[BaseException] = field(default_factory=list)


class Worker:
    """One thread's random mix of operations against the shared caches (one picked per step)."""

    def __init__(self, caches: list[VisionEmbeddingCache], seed: int) -> None:
        self.caches = caches
        self.cache = caches[0]
        self.rng = np.random.default_rng(seed)
        self.tally = Tally()

    def images(self, low: int, high: int) -> list[bytes]:
        return [IMAGES[index] for index in self.rng.integers(0, POOL, size=int(self.rng.integers(low, high)))]

    def check_embeddings(
        self, values: list[Any], images: list[bytes], where: str, *, allow_none: bool
    ) -> None:
        for value, image in zip(values, images, strict=True):
            if value is None and allow_none:
                continue
            if not is_embedding(value, index_of(image)):
                self.tally.wrong.append(f"{where}: image {index_of(image)}")

    def encode(self, images: list[bytes]) -> list[np.ndarray]:
        """The encode_fn: sometimes fails, sometimes looks other images up first (re-entrant)."""
        draw = self.rng.random()
        if draw < 0.04:
            raise EncoderFailure("injected")
        if draw < 0.20:
            others = self.images(1, 4)
            self.check_embeddings(
                self.cache.get_image_embeddings(others), others, "re-entrant", allow_none=True
            )
            got = self.cache.preprocess_images(others, self.preprocess)
            self.check_pixels(got, others)
        return [embedding(index_of(image)) for image in images]

    def preprocess(self, images: list[bytes]) -> list[PixelOnlyCacheEntry]:
        return [pixels(index_of(image)) for image in images]

    def check_pixels(self, values: list[Any], images: list[bytes]) -> None:
        for value, image in zip(values, images, strict=True):
            if not is_pixels(value, index_of(image)):
                self.tally.wrong.append(f"pixels: image {index_of(image)}")

    def encode_batch(self) -> None:
        requests = [self.images(1, 4) for _ in range(int(self.rng.integers(1, 3)))]
        try:
            results = self.cache.encode_batch(requests, self.encode)
        except EncoderFailure:  # ours, or the owner's of an image this step waited for
            self.tally.injected_failures += 1
            return
        for result, request in zip(results, requests, strict=True):
            self.check_embeddings(result, request, "encode_batch", allow_none=False)

    def pinned_block(self) -> None:
        pinned = self.images(2, 3)
        store = level_store(self.cache, "embedding")
        keys = [str(self.cache.key("embedding", [image])) for image in pinned]
        with self.cache.pinned(pinned):
            for _attempt in range(20):  # another thread's failing encoder may be the owner
                try:
                    values = self.cache.encode_images(
                        pinned, lambda images: [embedding(index_of(i)) for i in images]
                    )
                    break
                except EncoderFailure:
                    self.tally.injected_failures += 1
            else:
                return
            self.check_embeddings(values, pinned, "pinned", allow_none=False)
            for _ in range(3):  # pressure while pinned
                self.encode_batch()
            for key, image in zip(keys, pinned, strict=True):
                if key not in store:
                    self.tally.pin_violations.append(f"image {index_of(image)} evicted while pinned")

    def step(self) -> None:
        # Three steps in four on the LRU cache, one on the cost-policy cache (whose memory tier's
        # reads and writes serialise, so cost about four times as much).
        self.cache = self.caches[0] if self.rng.random() < 0.75 else self.caches[1]
        draw = self.rng.random()
        if draw < 0.40:
            self.encode_batch()
        elif draw < 0.60:
            images = self.images(1, 4)
            self.check_embeddings(self.cache.get_image_embeddings(images), images, "get", allow_none=True)
        elif draw < 0.70:
            images = self.images(1, 4)
            self.cache.set_image_embeddings(images, [embedding(index_of(image)) for image in images], 0.01)
        elif draw < 0.78:
            self.pinned_block()
        elif draw < 0.90:
            images = self.images(1, 4)
            self.check_pixels(self.cache.preprocess_images(images, self.preprocess), images)
        else:
            images = self.images(1, 4)
            expect = [SIZES[index_of(image)] for image in images]
            try:
                values = self.cache.encode_images(images, self.encode, expect=expect)
            except EncoderFailure:
                self.tally.injected_failures += 1
                return
            self.check_embeddings(values, images, "expect", allow_none=False)

    def run(self, start: threading.Barrier) -> None:
        try:
            start.wait()
            for _ in range(OPERATIONS_PER_THREAD):
                self.step()
                self.tally.operations += 1
        except BaseException as error:  # reported by the test
            self.tally.errors.append(error)


def make_caches(directory: Path) -> list[VisionEmbeddingCache]:
    """An LRU cache over a disk tier, and a cost-policy cache over a (memory) tier, each with a
    small write queue."""
    budgets: dict[str, Any] = {
        "max_embedding_entries": 64,
        "max_embedding_bytes": EMBEDDING_BYTES,
        "max_pixel_entries": 64,
        "max_pixel_bytes": PIXEL_BYTES,
    }
    disk = TierChain([DiskTier(directory, TIER_BYTES)], max_pending_write_bytes=PENDING_WRITE_BYTES)
    memory = TierChain([MemoryTier(TIER_BYTES)], max_pending_write_bytes=PENDING_WRITE_BYTES)
    return [
        VisionEmbeddingCache(tiers=disk, **budgets),
        VisionEmbeddingCache(policy="cost", tiers=memory, **budgets),
    ]


def assert_exact_accounting(cache: VisionEmbeddingCache, level: str) -> None:
    store = level_store(cache, level)
    entries = [store.lookup(str(cache.key(level, [image]))) for image in IMAGES]
    present = [entry for entry in entries if entry is not None]
    stats = cache.snapshot().levels[level]
    assert stats.entries == len(present) == len(store)
    assert stats.bytes == store.nbytes == sum(entry.nbytes for entry in present)
    assert all(entry.nbytes == tree_nbytes(entry.value) for entry in present)
    assert stats.pinned == 0 and stats.bytes <= (EMBEDDING_BYTES if level == "embedding" else PIXEL_BYTES)


@pytest.fixture
def one_microsecond_switches() -> Any:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)
    yield
    sys.setswitchinterval(previous)


@pytest.mark.slow
@pytest.mark.usefixtures("one_microsecond_switches")
def test_churn_no_hang_no_wrong_value_pins_honoured_exact_bytes_bounded_rss(tmp_path: Path) -> None:
    caches = make_caches(tmp_path / "disk")
    warm = Worker(caches, seed=999)
    for _ in range(400):  # imports, first allocations and thread-local counters before measuring
        warm.step()
    assert not warm.tally.wrong and not warm.tally.errors
    rss_before = rss_bytes()

    workers = [Worker(caches, seed=seed) for seed in range(THREADS)]
    start = threading.Barrier(THREADS)
    threads = [threading.Thread(target=worker.run, args=(start,), daemon=True) for worker in workers]
    bounds: list[str] = []
    done = threading.Event()

    def watch() -> None:  # the budgets hold at every moment, not only at the end
        while not done.is_set():
            for cache in caches:
                for name, limit in (("embedding", EMBEDDING_BYTES), ("pixel_only", PIXEL_BYTES)):
                    stats = cache.snapshot().levels[name]
                    if stats.bytes > limit or stats.entries > 64:
                        bounds.append(f"{name}: {stats.entries} entries, {stats.bytes} bytes")
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + JOIN_SECONDS
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    seconds = time.perf_counter() - started
    done.set()
    watcher.join(10)
    hung = sum(thread.is_alive() for thread in threads)
    assert hung == 0, f"{hung} threads still running after {JOIN_SECONDS} s"

    tallies = [worker.tally for worker in workers]
    operations = sum(tally.operations for tally in tallies)
    errors = [error for tally in tallies for error in tally.errors]
    wrong = [wrong for tally in tallies for wrong in tally.wrong]
    violations = [violation for tally in tallies for violation in tally.pin_violations]
    for cache in caches:
        assert cache.tiers is not None and cache.tiers.flush(timeout=60)
    budgets = 2 * (EMBEDDING_BYTES + 2 * PIXEL_BYTES) + 2 * (TIER_BYTES + PENDING_WRITE_BYTES)
    growth = rss_bytes() - rss_before
    print(
        f"\nchurn: {THREADS} threads, {operations} operations in {seconds:.1f} s at a "
        f"{SWITCH_INTERVAL * 1e6:g} µs switch interval: {len(errors)} errors, {len(wrong)} wrong values, "
        f"{len(violations)} pins broken, {len(bounds)} budget overruns, "
        f"{sum(tally.injected_failures for tally in tallies)} injected encoder failures"
    )
    for cache, name in zip(caches, ("lru + disk tier", "cost + memory tier"), strict=True):
        levels, tiers = cache.snapshot().levels, cache.snapshot().tiers
        embedding = levels["embedding"]
        assert tiers is not None
        print(
            f"  {name}: embedding hits {embedding.hits}, misses {embedding.misses}, evictions "
            f"{embedding.evictions}, single-flight waits {embedding.singleflight_waits}; "
            f"{tiers.tiers[0].name} tier hits {tiers.tiers[0].hits}, errors {tiers.tiers[0].errors}"
        )
    print(
        f"  RSS grew {growth / 2**20:.1f} MiB; budgets {budgets / 2**20:.1f} MiB + slack "
        f"{RSS_SLACK / 2**20:.0f} MiB"
    )

    assert errors == []
    assert operations >= 100_000
    assert wrong == []
    assert violations == []
    assert bounds == []
    assert sum(tally.injected_failures for tally in tallies) > 0  # failures were exercised
    for cache in caches:
        embedding_stats = cache.snapshot().levels["embedding"]
        assert embedding_stats.evictions > 1000 and embedding_stats.singleflight_waits > 0
        for level in ("embedding", "pixel_only"):
            assert_exact_accounting(cache, level)
        tier_stats = cache.snapshot().tiers  # tier errors (SQLite lock waits past the timeout on
        assert tier_stats is not None and tier_stats.tiers[0].hits > 0  # a busy machine) fail no request
    assert growth <= budgets + RSS_SLACK, f"RSS grew {growth / 2**20:.1f} MiB"
    for cache in caches:
        cache.close()
