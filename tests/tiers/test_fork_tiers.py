"""Regression testsa child forked at any moment never hangs.

A child forked while the writer was inside the tier guard's or the circuit breaker's lock waited
forever at its first lookup (every time); 4-5 of 64 children forked while the writer was busy on a
disk tier hung, in the guard's counter lock or inside SQLite (a connection, and SQLite's own
mutexes, the parent's threads were using). Now every lock is taken across the fork, and a fork
waits until no thread is inside a disk-tier operation; the child reopens the directory with its own
connections at first use. Each child is timed out by PID.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import encode_image, random_image
from tests.support.forks import (
    CHILD_SECONDS,
    held_by_another_thread,
    run_in_child,
    start_child,
    wait_for_child,
)
from tests.support.optional import needs_redis
from tests.tiers.conftest import free_port
from visioncache import VisionEmbeddingCache, compute_image_hash
from visioncache.tiers.chain import TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.disk_store import BoundedCache

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def image(seed: int) -> bytes:
    return encode_image(random_image(seed, (8, 8)))


def value_of(item: bytes) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(compute_image_hash(item)), np.uint8).astype(np.float32)


def encode(images: list[bytes]) -> list[np.ndarray]:
    return [value_of(item) for item in images]


def child_request(cache: VisionEmbeddingCache, seed: int) -> Any:
    """What a forked worker does first: look up, encode, write down, and wait for the write."""

    def request() -> bool:
        values = cache.encode_images([image(seed), image(0)], encode)
        correct = all(
            np.array_equal(value, value_of(item))
            for value, item in zip(values, [image(seed), image(0)], strict=True)
        )
        return correct and cache.tiers is not None and cache.tiers.flush(timeout=CHILD_SECONDS / 2)

    return request


def disk_cache(directory: Path) -> VisionEmbeddingCache:
    cache = VisionEmbeddingCache(tiers=[DiskTier(directory)])
    cache.encode_images([image(0)], encode)  # opened, written, the writer thread started
    assert cache.tiers is not None and cache.tiers.flush(timeout=30)
    return cache


@pytest.mark.parametrize("lock", ["guard", "breaker", "chain"])
def test_regression_child_forked_inside_a_tier_lock_waits_forever(tmp_path: Path, lock: str) -> None:
    """The writer inside the guard's counter lock, the breaker's lock or the chain's own lock at
    the fork: the child's first lookup (or first write) waited forever."""
    cache = disk_cache(tmp_path / "disk")
    chain = cache.tiers
    assert isinstance(chain, TierChain)
    guard = chain._guarded[0]
    held = {"guard": guard._lock, "breaker": guard.breaker._lock, "chain": chain._lock}[lock]
    with held_by_another_thread(held):
        outcome = run_in_child(child_request(cache, 1))
    assert outcome == "ok", f"the child's first request {outcome}"


def test_regression_child_forked_while_a_disk_tier_opens_waits_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread opening the disk tier (its first operation) holds the tier's open lock: a child
    forked meanwhile waited forever at its own first operation."""
    cache = VisionEmbeddingCache(tiers=[DiskTier(tmp_path / "disk")])
    opening, release = threading.Event(), threading.Event()
    original = BoundedCache.__init__

    def slow_open(self: Any, *args: Any, **kwargs: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            opening.set()
            release.wait(CHILD_SECONDS)
        original(self, *args, **kwargs)

    monkeypatch.setattr(BoundedCache, "__init__", slow_open)
    first = threading.Thread(target=lambda: cache.get_image_embeddings([image(5)]), daemon=True)
    first.start()
    assert opening.wait(CHILD_SECONDS)
    threading.Timer(0.2, release.set).start()  # the open finishes while the fork waits for it
    outcome = run_in_child(child_request(cache, 2))
    first.join(CHILD_SECONDS)
    assert outcome == "ok", f"the child's first request {outcome}"


@needs_redis
def test_regression_child_forked_while_a_redis_client_is_created_waits_forever() -> None:
    """The same for the Redis tier's client lock (held while a client is created: a cluster
    client connects there). The child's request is served without the (absent) server."""
    from visioncache.tiers.redis import RedisTier

    tier = RedisTier(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.2)
    cache = VisionEmbeddingCache(tiers=TierChain([tier], secrets=[b"fork test"], max_pending_write_bytes=0))
    with held_by_another_thread(tier._client_lock):
        outcome = run_in_child(lambda: cache.encode_images([image(3)], encode)[0] is not None)
    assert outcome == "ok", f"the child's first request {outcome}"


PATIENT_SECONDS = 60.0  # a loaded machine can hold SQLite's lock past the default 1 s wait


def stored_in_the_tier(cache: VisionEmbeddingCache) -> bool:
    """Whether every write this process queued was written (counted stored, none failed): what
    a child acknowledges. A flushed queue alone is not that: a write that failed is flushed too."""
    chain = cache.tiers
    assert isinstance(chain, TierChain)
    if not chain.flush(timeout=PATIENT_SECONDS):
        return False
    counts = chain.stats().tiers[0]
    return counts.writes >= 1 and counts.errors == 0 and chain.stats().writes_dropped == 0


def acknowledging_request(directory: Path, item: bytes) -> Any:
    """A forked worker's first request on its own cache over the shared directory: it encodes
    one new image, and succeeds only if the image's write was stored. The image is made before
    the fork: a child that imports (PIL loads its plugins at first use) can wait forever on a
    module lock another thread of the parent held, which is Python's, not visioncache's."""

    def request() -> bool:
        cache = VisionEmbeddingCache(tiers=[DiskTier(directory, timeout=PATIENT_SECONDS)])
        values = cache.encode_images([item], encode)
        return np.array_equal(values[0], value_of(item)) and stored_in_the_tier(cache)

    return request


def readable(directory: Path, seeds: list[int]) -> list[bool]:
    reader = VisionEmbeddingCache(tiers=[DiskTier(directory, timeout=PATIENT_SECONDS)])
    return [value is not None for value in reader.get_image_embeddings([image(seed) for seed in seeds])]


@pytest.mark.slow
def test_regression_children_forked_while_the_writer_is_busy_on_a_disk_tier_hang(tmp_path: Path) -> None:
    """As it happens: threads keep storing new images (the writer keeps writing to disk) and
    reading while the test forks 64 children, each of which looks up, encodes and writes. Each
    child acknowledges only a write counted as stored (on a loaded machine a 1 s lock wait
    can pass, and a failed write is flushed too), and every acknowledged write is on disk."""
    directory = tmp_path / "disk"
    cache = VisionEmbeddingCache(tiers=[DiskTier(directory, timeout=PATIENT_SECONDS)])
    cache.encode_images([image(0)], encode)  # opened, written, the writer thread started
    assert stored_in_the_tier(cache)
    stop = threading.Event()

    def keep_storing(offset: int) -> None:
        seed = offset
        while not stop.is_set():
            seed += 2
            cache.encode_images([image(seed)], encode)
            cache.get_image_embeddings([image(seed - 40)])

    seeds = [100 + child for child in range(64)]
    items = [image(seed) for seed in seeds]  # made before the fork (see acknowledging_request)
    threads = [threading.Thread(target=keep_storing, args=(offset,), daemon=True) for offset in (1000, 1001)]
    for thread in threads:
        thread.start()
    outcomes: list[str] = []
    try:
        for item in items:
            pid = start_child(acknowledging_request(directory, item))
            outcomes.append(wait_for_child(pid, seconds=2 * PATIENT_SECONDS))
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert outcomes.count("ok") == 64, {outcome: outcomes.count(outcome) for outcome in set(outcomes)}
    assert all(readable(directory, seeds))  # every acknowledged write landed


@pytest.mark.slow
def test_regression_fork_hook_iterates_the_sets_other_threads_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The before-fork hook iterated the sets of tracked objects and locks while other threads
    were adding to them ("Set changed size during iteration"): the hook raised, the fork went
    ahead unprotected, and children hung or lost their writes (45-57 of 64 hooks failed at a
    10 us switch interval). Now registering and the fork's snapshot share one lock, held for the
    whole fork. Threads keep creating caches, tiers and chains (every one registers locks and
    tracked objects) and using them while 64 children fork at a 10 us switch interval: every
    hook runs whole, every child finishes, and every acknowledged child write is readable."""
    failures: list[str] = []

    def record(unraisable: Any) -> None:  # an exception in a fork hook is "ignored", not raised
        failures.append(repr(unraisable.exc_value))

    monkeypatch.setattr(sys, "unraisablehook", record)
    stop = threading.Event()

    def keep_creating(offset: int) -> None:
        seed = offset
        while not stop.is_set():
            seed += 3
            tiers = [DiskTier(tmp_path / f"churn{seed % 4}", timeout=PATIENT_SECONDS)]
            created = VisionEmbeddingCache(tiers=TierChain(tiers, max_pending_write_bytes=2**20))
            created.encode_images([image(seed)], encode)
            VisionEmbeddingCache().encode_images([image(seed)], encode)
            created.close()

    directory = tmp_path / "shared"
    seeds = [5000 + child for child in range(64)]
    items = [image(seed) for seed in seeds]  # made before the threads start (see above)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    threads = [threading.Thread(target=keep_creating, args=(offset,), daemon=True) for offset in range(3)]
    outcomes: list[str] = []
    try:
        for thread in threads:
            thread.start()
        for item in items:
            pid = start_child(acknowledging_request(directory, item))
            outcomes.append(wait_for_child(pid, seconds=2 * PATIENT_SECONDS))
    finally:
        stop.set()
        for thread in threads:
            thread.join(PATIENT_SECONDS)
        sys.setswitchinterval(interval)
    assert failures == []
    assert outcomes.count("ok") == 64, {outcome: outcomes.count(outcome) for outcome in set(outcomes)}
    assert all(readable(directory, seeds))


def test_regression_a_thread_ending_closes_its_sqlite_connection_outside_the_gate(
    tmp_path: Path,
) -> None:
    """diskcache closed a thread's SQLite connection when the thread ended (or the cache was
    collected), wherever that happened: a close takes SQLite's process-wide VFS mutex with the GIL
    released, so a fork meanwhile left the child that mutex held, and its first open waited
    forever (1 child of 64 in 2 of 5 runs of the test above, under load). Now a connection whose
    thread ended is handed on unclosed, and closed inside the tier's gate, which forks wait for."""
    tier = DiskTier(tmp_path / "disk")
    tier.put("key", b"blob")
    connections: list[Any] = []

    def use_and_end() -> None:
        assert tier.get("key") == b"blob"
        connections.append(tier._cache()._con)

    thread = threading.Thread(target=use_and_end)
    thread.start()
    thread.join(CHILD_SECONDS)
    (connection,) = connections
    del connections[:]
    assert connection.execute("SELECT 1").fetchone() == (1,)  # the thread ended; it is still open
    assert tier.get("key") == b"blob"  # the next operation, inside the gate, closes it
    with pytest.raises(sqlite3.ProgrammingError):
        connection.execute("SELECT 1")
