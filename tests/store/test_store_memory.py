"""Byte budgets bound the memory entries keep alive: a value that views a larger buffer (a slice
of a batch output, an array over a received payload) is copied when stored."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np

from tests.conftest import encode_image, random_image
from tests.support.cache_values import (
    IMAGES,
    identity,
    owns_its_memory,
)
from tests.support.optional import needs_torch, torch
from visioncache import (
    VisionEmbeddingCache,
)


# ---- byte budgets do not bound memory for views ------------------------------------------
def test_regression_views_of_a_batch_keep_the_whole_batch_alive() -> None:
    """Per-image slices of one batch array were stored as they were, so an 8 MiB budget
    held the whole 32 MiB batch. Stored values must own their memory (copied when views)."""
    budget = 8 * 2**20
    images = [encode_image(random_image(seed, size=(8, 8))) for seed in range(100, 132)]
    cache = VisionEmbeddingCache(max_embedding_entries=None, max_embedding_bytes=budget)

    def encode(batch: list[bytes]) -> list[np.ndarray]:
        output = np.empty((len(batch), 256, 1024), np.float32)  # 1 MiB per image
        for index, image in enumerate(batch):
            output[index] = identity(image)
        return list(output)  # views into `output`

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        values = cache.encode_images(images, encode)
        assert all(
            np.array_equal(value, np.full((256, 1024), identity(image), np.float32))
            for value, image in zip(values, images, strict=True)
        )
        stored = [value for value in cache.get_image_embeddings(images) if value is not None]
        assert stored and all(owns_its_memory(value) for value in stored)
        del values, stored
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.snapshot().levels["embedding"].bytes <= budget
    assert held <= budget + 2**20, f"{held / 2**20:.1f} MiB alive for an {budget / 2**20:.0f} MiB budget"


def test_regression_arrays_over_a_received_payload_keep_the_whole_payload_alive() -> None:
    """For arrays over a bytes object: an encoder that receives one payload for the batch
    (a remote encoder's response) and returns ``np.frombuffer(payload, offset=..., count=...)``
    per image. Their base is the bytes object, which has no ``nbytes``, so they were taken for
    owners of their memory: an 8 MiB budget kept a 32 MiB payload alive."""
    budget, per_image = 8 * 2**20, 2**20
    images = [encode_image(random_image(seed, size=(8, 8))) for seed in range(200, 232)]
    cache = VisionEmbeddingCache(max_embedding_entries=None, max_embedding_bytes=budget)

    def encode(batch: list[bytes]) -> list[np.ndarray]:
        payload = b"".join(np.full(per_image // 4, identity(image), np.float32).tobytes() for image in batch)
        count = per_image // 4
        return [np.frombuffer(payload, np.float32, count, index * per_image) for index in range(len(batch))]

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        values = cache.encode_images(images, encode)
        assert all(
            bool((value == identity(image)).all()) for value, image in zip(values, images, strict=True)
        )
        stored = [value for value in cache.get_image_embeddings(images) if value is not None]
        assert stored and all(owns_its_memory(value) for value in stored)
        del values, stored
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= budget + 2**20, f"{held / 2**20:.1f} MiB alive for an {budget / 2**20:.0f} MiB budget"


@needs_torch
def test_regression_torch_views_of_a_batch_are_copied_when_stored() -> None:
    """For torch: a stored slice must not keep the batch's whole storage alive."""
    images = IMAGES[:3]
    cache = VisionEmbeddingCache()
    batch_output = torch.arange(3 * 1000, dtype=torch.float32).reshape(3, 1000)
    values = cache.encode_images(images, lambda batch: list(batch_output[: len(batch)]))
    for index, value in enumerate(cache.get_image_embeddings(images)):
        assert (
            value is not None
            and torch.equal(value, batch_output[index])
            and torch.equal(value, values[index])
        )
        assert value.untyped_storage().nbytes() == value.nbytes  # owns exactly its own bytes
    assert cache.snapshot().levels["embedding"].bytes == 3 * 1000 * 4
