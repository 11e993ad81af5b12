"""Per-thread counters: exact under concurrency, finished threads folded in, resettable."""

from __future__ import annotations

import threading

from tests.support.internals import get
from visioncache.store.counters import ThreadCounters
from visioncache.store.store import Store


def run_threads(count: int, work) -> None:
    threads = [threading.Thread(target=work) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_no_update_is_lost_across_threads():
    counters = ThreadCounters(["hits", "seconds"])

    def work() -> None:
        for _ in range(20_000):
            tally = counters.local()
            tally["hits"] += 1
            tally["seconds"] += 0.5

    run_threads(8, work)
    assert counters.snapshot() == {"hits": 160_000, "seconds": 80_000.0}


def test_finished_threads_are_folded_into_the_base():
    counters = ThreadCounters(["hits"])
    for _ in range(5):
        run_threads(4, lambda: counters.local().__setitem__("hits", counters.local()["hits"] + 1))
    counters.local()  # registering a live thread folds the finished ones
    assert counters.snapshot()["hits"] == 20
    assert len(counters._tallies) == 1


def test_reset_zeroes_the_totals_and_counting_goes_on():
    counters = ThreadCounters(["hits"])
    counters.local()["hits"] += 3
    counters.reset()
    assert counters.snapshot()["hits"] == 0
    counters.local()["hits"] += 2
    assert counters.snapshot()["hits"] == 2


def test_store_hits_are_exact_under_threads_without_a_lock_on_the_hit_path():
    store = Store(max_entries=4)
    for key in "abcd":
        store.put(key, key)

    def work() -> None:
        for step in range(5_000):
            get(store, "abcde"[step % 5])  # 4 hits, 1 miss per 5 lookups

    run_threads(8, work)
    stats = store.stats()
    assert (stats.hits, stats.misses) == (32_000, 8_000)
