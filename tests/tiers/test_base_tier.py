"""`BaseTier`: a new tier writes four methods, and a chain and a cache run on it like on any tier.

The contract suite (test_contract.py) runs `FourMethodTier` beside the library's tiers; this file
proves what the base promises beyond it: how few methods a subclass writes, what the defaults answer,
and that the chain's batched reads, writes, purges and stats work through them.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.four_method_tier import FourMethodTier
from visioncache import VisionEmbeddingCache
from visioncache.errors import CorruptEntryError
from visioncache.tiers import BaseTier, Tier, TierChain
from visioncache.tiers.disk import DiskTier
from visioncache.tiers.stats import TierSizes

INTERFACE = {"get", "get_many", "put", "delete", "contains_many", "keys", "sizes", "stored_bytes", "close"}


def written(cls: type) -> set[str]:
    """The interface methods ``cls`` defines itself (not inherited from `BaseTier`)."""
    return {name for name in INTERFACE if name in vars(cls)}


def embedding_keys(tier: BaseTier) -> list[str]:
    stored = tier.keys()
    return [key for key in stored if "/embedding/" in key]


def test_a_tier_on_the_base_writes_at_most_five_methods() -> None:
    assert written(FourMethodTier) == {"get", "put", "delete", "keys"}
    assert isinstance(FourMethodTier(), Tier)  # the chain's interface, all of it


def test_a_subclass_missing_one_of_the_four_cannot_be_made() -> None:
    class NoKeys(BaseTier):
        def get(self, key: str) -> bytes | None:
            return None

        def put(self, key: str, blob: bytes) -> None:
            pass

        def delete(self, key: str) -> None:
            pass

    with pytest.raises(TypeError, match="keys"):
        NoKeys()  # type: ignore[abstract]


def test_the_defaults_answer_through_get() -> None:
    tier = FourMethodTier()
    tier.put("a", b"123")
    tier.put("b", b"")
    assert tier.get_many(["a", "missing", "b"]) == [b"123", None, b""]
    assert tier.contains_many(["a", "missing", "b"]) == [True, False, True]
    assert tier.stored_bytes(["a", "b", "missing"]) == 3
    assert tier.sizes() == TierSizes()
    tier.close()  # nothing to release, and no error


def test_the_default_get_many_answers_a_corrupt_key_as_empty_and_reads_the_rest() -> None:
    """One bad key must not fail the batch: the chain deletes a ``b""`` answer as a corrupt entry."""

    class OneBadKey(FourMethodTier):
        def get(self, key: str) -> bytes | None:
            if key == "bad":
                raise CorruptEntryError("bad: wrong type")
            return super().get(key)

    tier = OneBadKey()
    tier.put("good", b"x")
    assert tier.get_many(["bad", "good"]) == [b"", b"x"]


def test_a_cache_over_a_four_method_tier_shares_and_purges_entries() -> None:
    tier = FourMethodTier()
    image = np.full((8, 8, 3), 7, dtype=np.uint8)
    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    writer = VisionEmbeddingCache(tiers=TierChain([tier], max_pending_write_bytes=0))
    writer.set_image_embeddings([image], [value])
    reader = VisionEmbeddingCache(tiers=TierChain([tier], max_pending_write_bytes=0))
    [found] = reader.get_image_embeddings([image])
    assert found is not None and np.array_equal(found, value)
    assert reader.tiers is not None and reader.tiers.stats().tiers[0].hits == 1
    assert len(embedding_keys(tier)) == 1
    assert reader.discard_images([image]) >= 1  # the tier's copy, through contains_many and delete
    assert embedding_keys(tier) == []
    assert VisionEmbeddingCache(tiers=TierChain([tier])).get_image_embeddings([image]) == [None]


def test_the_library_tiers_are_on_the_base() -> None:
    assert issubclass(DiskTier, BaseTier)
    pytest.importorskip("redis")
    from visioncache.tiers.redis import RedisTier

    assert issubclass(RedisTier, BaseTier)
