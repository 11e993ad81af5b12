"""`VerifiedItems` (the scheduler's verified entries) and `ConnectorCounters`, without an engine."""

from __future__ import annotations

import torch

from visioncache.integrations.vllm.counters import ConnectorCounters
from visioncache.integrations.vllm.staging import VerifiedItems
from visioncache.tiers.stats import ChainStats, TierStats


def _tensor(rows: int) -> torch.Tensor:
    return torch.zeros(rows, 8, dtype=torch.bfloat16)  # 16 bytes a row


def test_verified_items_stay_within_their_byte_budget_least_recently_used_first() -> None:
    items = VerifiedItems(max_bytes=3 * 16)
    items.put("a", _tensor(1))
    items.put("b", _tensor(1))
    assert items.touch("a")  # "b" is now the least recently used
    items.put("c", _tensor(2))
    assert items.touch("a") and items.touch("c") and not items.touch("b")
    assert items.nbytes == 3 * 16


def test_a_verified_item_larger_than_the_budget_is_still_held_alone() -> None:
    # The scheduler has just answered yes for it: it must reach the step's metadata.
    items = VerifiedItems(max_bytes=16)
    items.put("small", _tensor(1))
    items.put("large", _tensor(4))
    assert items.touch("large") and not items.touch("small")
    popped = items.pop("large")
    assert popped is not None and popped.shape[0] == 4
    assert items.nbytes == 0 and items.pop("large") is None


def test_putting_an_item_again_does_not_count_its_bytes_twice() -> None:
    items = VerifiedItems(max_bytes=1024)
    items.put("a", _tensor(2))
    items.put("a", _tensor(2))
    assert items.nbytes == 2 * 16


def test_counters_report_intervals_and_fold_in_tier_deltas() -> None:
    errors = [0]

    def chain_stats() -> ChainStats:
        return ChainStats(tiers=(TierStats(name="redis", errors=errors[0]),))

    counters = ConnectorCounters(chain_stats, tier_read_seconds=0.0)
    assert counters.take_interval() is None  # nothing happened
    counters.add("hits", 2)
    errors[0] = 3
    interval = counters.take_interval()
    assert interval is not None and interval["hits"] == 2 and interval["tier_errors"] == 3
    assert counters.take_interval() is None  # a new interval starts empty
    assert counters.totals()["hits"] == 2 and counters.totals()["tier_errors"] == 3
