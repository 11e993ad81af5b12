"""The `Level` contract: what every level promises, run memory-only and over a tier chain.

A level is the one owner of read-through, write-down and single-flight (docs/design.md,
principle 4); each promise here holds whether or not tiers sit below its memory store, and the
tier-only promises (a second level over the same tiers reads what the first wrote) are checked
where there are tiers.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.support.memory_tier import MemoryTier
from visioncache.errors import EncoderOutputError, InvalidArgumentError
from visioncache.level import Level
from visioncache.store.store import Store
from visioncache.store.types import PutResult
from visioncache.tiers.chain import TierChain

JOIN_SECONDS = 30.0


def value(key: str) -> np.ndarray:
    """The value a correct computation gives ``key`` (it names the key)."""
    return np.frombuffer(key.encode().ljust(16, b"\0")[:16], np.uint8).astype(np.float32)


class Compute:
    """A correct computation that counts the items it computed."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, items: list[str]) -> list[np.ndarray]:
        with self.lock:
            self.items.extend(items)
        return [value(item) for item in items]


@pytest.fixture(params=["memory", "tiers"])
def make_level(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory of levels: each a fresh memory store, over one shared chain with ``tiers``."""
    chain = TierChain([MemoryTier(2**24)], max_pending_write_bytes=0) if request.param == "tiers" else None

    def make(max_entries: int | None = 64) -> Level:
        return Level("embedding", Store(max_entries=max_entries, max_bytes=2**24), chain)

    make.tiers = chain  # type: ignore[attr-defined]
    yield make


def test_put_then_get_gives_the_value_and_counts_a_hit(make_level: Any) -> None:
    level = make_level()
    assert level.put("a", value("a")) is PutResult.INSERTED
    assert np.array_equal(level.get("a"), value("a"))
    assert level.get("missing") is None
    stats = level.stats()
    assert (stats.hits, stats.misses, stats.entries) == (1, 1, 1)


def test_get_many_answers_in_order_with_none_for_misses(make_level: Any) -> None:
    level = make_level()
    level.put("a", value("a"))
    level.put("c", value("c"))
    found = level.get_many(["c", "b", "a"])
    assert np.array_equal(found[0], value("c")) and found[1] is None and np.array_equal(found[2], value("a"))


def test_resolve_computes_each_distinct_missing_key_once_in_one_call(make_level: Any) -> None:
    level, compute = make_level(), Compute()
    level.put("a", value("a"))
    results = level.resolve(["a", "b", "b", "c"], ["a", "b", "b", "c"], compute)
    assert compute.items == ["b", "c"]
    assert all(np.array_equal(result, value(key)) for result, key in zip(results, "abbc", strict=True))
    assert level.resolve(["b", "c"], ["b", "c"], compute) and compute.items == ["b", "c"]  # hits now


def test_resolve_runs_a_missing_key_once_under_many_threads(make_level: Any) -> None:
    level, compute = make_level(), Compute()
    barrier = threading.Barrier(8)
    answers: list[Any] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:

        def request() -> None:
            barrier.wait(JOIN_SECONDS)
            answers.append(level.resolve(["k"], ["k"], compute)[0])

        threads = [threading.Thread(target=request) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(JOIN_SECONDS)
    finally:
        sys.setswitchinterval(interval)
    assert compute.items == ["k"] and len(answers) == 8
    assert all(np.array_equal(answer, value("k")) for answer in answers)


def test_a_failing_computation_stores_nothing_and_a_later_call_retries(make_level: Any) -> None:
    level = make_level()

    def failing(items: list[str]) -> list[Any]:
        raise RuntimeError("the encoder broke")

    with pytest.raises(RuntimeError, match="broke"):
        level.resolve(["k"], ["k"], failing)
    with pytest.raises(EncoderOutputError):
        level.resolve(["k"], ["k"], lambda items: [])  # a wrong number of values
    assert level.get("k") is None
    compute = Compute()
    assert np.array_equal(level.resolve(["k"], ["k"], compute)[0], value("k")) and compute.items == ["k"]


def test_a_value_the_validator_rejects_is_computed_again(make_level: Any) -> None:
    level, compute = make_level(), Compute()
    level.put("k", np.zeros(3, np.float32))
    result = level.resolve(["k"], ["k"], compute, validate=lambda index, cached: cached.shape == (16,))
    assert compute.items == ["k"] and np.array_equal(result[0], value("k"))
    # Each cached copy the validator saw is counted: memory's, then the tiers' (where there are).
    assert level.stats().validation_failures == (1 if make_level.tiers is None else 2)


def test_an_unsizable_value_is_bad_input_and_changes_nothing(make_level: Any) -> None:
    class Unsizable:
        @property
        def nbytes(self) -> int:
            raise RuntimeError("no size")

    level = make_level()
    with pytest.raises(InvalidArgumentError):
        level.put("k", Unsizable())
    assert level.stats().entries == 0 and level.get("k") is None


def test_a_pinned_entry_is_not_evicted(make_level: Any) -> None:
    level = make_level(max_entries=2)
    level.put("pinned", value("pinned"))
    level.pin("pinned")
    for key in ("b", "c", "d"):
        level.put(key, value(key))
    assert level.store.find("pinned") is not None  # memory kept it, whatever the tiers hold
    level.unpin("pinned")


def test_a_second_level_over_the_same_tiers_reads_what_the_first_wrote(make_level: Any) -> None:
    first, compute = make_level(), Compute()
    first.resolve(["a", "b"], ["a", "b"], compute)
    first.put("c", value("c"))
    second, again = make_level(), Compute()
    results = second.resolve(["a", "b", "c"], ["a", "b", "c"], again)
    assert all(np.array_equal(result, value(key)) for result, key in zip(results, "abc", strict=True))
    if make_level.tiers is None:
        assert again.items == ["a", "b", "c"]  # memory only: nothing is shared
    else:
        assert again.items == [] and second.stats().hits == 3  # read through, counted as hits
