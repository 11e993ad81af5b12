"""where a value lives does not depend on where it came from.

A value read from a tier is placed on the embedding level's device: ``embedding_device=`` when
given, else the device of the last value the level computed, else the CPU (as deserialised). Its
bytes are counted once. torch's ``meta`` device stands in for a GPU: it exists on CPU builds, and a
tensor that ends up there was moved on purpose (nothing else produces it).
"""

from __future__ import annotations

from tests.support.optional import skip_without

skip_without("torch", "hf")  # placement is about torch devices

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import encode_image, random_image
from tests.support.cache_values import (
    JOIN_SECONDS,
    A,
    Encoder,
    UnsizableArray,
    run_with_timeout,
    sparse_value,
    value_of,
)
from tests.support.memory_tier import MemoryTier
from visioncache import (
    EncoderOutputError,
    VisionEmbeddingCache,
    compute_image_hash,
)
from visioncache.store.store import Store
from visioncache.tiers.chain import TierChain
from visioncache.trees import tree_nbytes

IMAGES = [encode_image(random_image(seed)) for seed in range(300, 306)]


def embedding(image: bytes, device: str = "cpu") -> dict[str, torch.Tensor]:
    """An encoder output that names its image: features and a grid."""
    digest = torch.frombuffer(bytearray.fromhex(compute_image_hash(image)), dtype=torch.uint8)
    features = digest.to(torch.float32).reshape(4, 8)
    return {"features": features.to(device), "grid": torch.tensor([1, 2, 2]).to(device)}


def encoder(device: str) -> Any:
    return lambda images: [embedding(image, device) for image in images]


def must_not_encode(images: list[bytes]) -> list[Any]:
    raise AssertionError(f"encoded {len(images)} images that the tier holds")


def shared_tier_with(images: list[bytes]) -> MemoryTier:
    """A tier holding CPU embeddings of ``images``, written by another cache."""
    tier = MemoryTier(2**24)
    writer = VisionEmbeddingCache(tiers=TierChain([tier], max_pending_write_bytes=0))
    writer.encode_images(images, encoder("cpu"))
    return tier


def reader(tier: MemoryTier, **settings: Any) -> VisionEmbeddingCache:
    return VisionEmbeddingCache(tiers=TierChain([tier], max_pending_write_bytes=0), **settings)


def devices(value: dict[str, torch.Tensor]) -> set[str]:
    return {tensor.device.type for tensor in value.values()}


def same_values(value: dict[str, torch.Tensor], image: bytes) -> bool:
    expected = embedding(image)
    return all(
        value[name].shape == expected[name].shape and value[name].dtype == expected[name].dtype
        for name in expected
    )


def test_tier_hits_are_placed_on_the_configured_device_and_counted_once() -> None:
    tier = shared_tier_with(IMAGES[:4])
    cache = reader(tier, embedding_device="meta")
    read = cache.get_image_embeddings(IMAGES[:2])  # the lookup path
    resolved = cache.encode_images(IMAGES[2:4], must_not_encode)  # the continuous-batching path
    for value, image in zip(read + resolved, IMAGES[:4], strict=True):
        assert value is not None and devices(value) == {"meta"} and same_values(value, image)
    level = cache.snapshot().levels["embedding"]
    assert (level.hits, level.entries) == (4, 4)
    assert level.bytes == sum(tree_nbytes(value) for value in read + resolved) == 4 * (32 * 4 + 3 * 8)
    again = cache.get_image_embeddings(IMAGES[:4])  # served from memory: the placed values
    assert all(a is b for a, b in zip(again, read + resolved, strict=True))


def test_by_default_tier_hits_land_where_the_last_local_encode_produced() -> None:
    tier = shared_tier_with(IMAGES)
    cache = reader(tier)
    (first,) = cache.get_image_embeddings(IMAGES[:1])
    assert first is not None and devices(first) == {"cpu"}  # nothing computed here yet: the CPU

    local = encode_image(random_image(399))
    cache.encode_images([local], encoder("meta"))  # this host's encoder produces on "meta"
    hit = cache.encode_images(IMAGES[1:2], must_not_encode)[0]
    (looked_up,) = cache.get_image_embeddings(IMAGES[2:3])
    assert devices(hit) == devices(looked_up) == {"meta"}
    assert same_values(hit, IMAGES[1]) and same_values(looked_up, IMAGES[2])

    cache.encode_images([encode_image(random_image(398))], encoder("cpu"))  # and back on the CPU
    (later,) = cache.get_image_embeddings(IMAGES[3:4])
    assert later is not None and devices(later) == {"cpu"}
    assert torch.equal(later["features"], embedding(IMAGES[3])["features"])
    level = cache.snapshot().levels["embedding"]
    assert level.bytes == 6 * (32 * 4 + 3 * 8)  # six entries, each counted once wherever it lives


def test_numpy_values_from_a_tier_are_left_as_they_are() -> None:
    tier = MemoryTier(2**20)
    writer = VisionEmbeddingCache(tiers=TierChain([tier], max_pending_write_bytes=0))
    writer.encode_images(IMAGES[:1], lambda images: [np.ones((2, 3), np.float32) for _ in images])
    (value,) = reader(tier, embedding_device="meta").get_image_embeddings(IMAGES[:1])
    assert isinstance(value, np.ndarray) and np.array_equal(value, np.ones((2, 3), np.float32))


# ---- a request can hang forever ----------------------------------------------------------
@pytest.mark.parametrize(
    "unsizable", [sparse_value, lambda _images: [UnsizableArray()]], ids=["sparse", "raises"]
)
def test_regression_unsizable_value_releases_its_claim(unsizable: Callable[[list[bytes]], list[Any]]) -> None:
    """Sizing the value raised inside `fulfil` before the claim was retired, so the next
    request for that image waited forever. Now: `EncoderOutputError`, and the claim is released."""
    cache = VisionEmbeddingCache()
    with pytest.raises(EncoderOutputError, match="cannot size"):
        run_with_timeout(lambda: cache.encode_images([A], unsizable))
    # A second request for the same image must not hang on the dead claim: it encodes it.
    value = run_with_timeout(lambda: cache.encode_images([A], Encoder())[0])
    assert np.array_equal(value, value_of(A))
    stats = cache.snapshot().levels["embedding"]
    assert (stats.entries, stats.computed) == (1, 1)  # the unsizable value was never stored


def test_regression_unsizable_value_wakes_the_waiters_with_the_error() -> None:
    """At the store: a waiter joined before the owner's value turned out unsizable gets the
    error (no hang), and the next claim owns the key again."""
    store = Store(max_entries=4)
    owner, waiter = store.claim("k"), store.claim("k")
    assert owner.owner and waiter.future is not None and not waiter.owner
    with pytest.raises(EncoderOutputError):
        store.fulfil("k", torch.zeros(3, 3).to_sparse())
    with pytest.raises(EncoderOutputError):
        waiter.future.result(timeout=JOIN_SECONDS)
    assert store.claim("k").owner and "k" not in store and store.nbytes == 0
