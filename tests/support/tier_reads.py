"""One-key reads for tests: what the library itself only does in batches.

The chain and the tiers read many keys per call (`TierChain.load_many`, ``Tier.contains_many``);
tests often ask about one key, and these say so without adding one-key methods to the library.
"""

from __future__ import annotations

from typing import Any

from visioncache.tiers import Tier, TierChain

__all__ = ["contains", "load"]


def load(chain: TierChain, key: str) -> Any | None:
    """The tree stored under ``key`` in the first tier with an intact copy, or None."""
    return chain.load_many([key])[0]


def contains(tier: Tier, key: str) -> bool:
    """Whether ``tier`` stores ``key`` (counts nothing)."""
    return tier.contains_many([key])[0]
