"""The device budget on a real CUDA device (skipped without one): the torch placement's copies,
the default budget read from ``torch.cuda.mem_get_info``, and a default cache's embeddings.

`tests/store/test_store_device.py` proves the spill logic with a fake device on any machine; this
file proves the thin real path it stands in for, where a GPU is lent (docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.fake_device import check_books
from tests.support.internals import get
from visioncache import VisionEmbeddingCache
from visioncache.store.store import Store

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cuda_tensor(seed: int) -> torch.Tensor:
    return torch.full((1024,), float(seed), device="cuda")


def test_cuda_entries_spill_to_host_memory_and_come_back_to_the_device() -> None:
    nbytes = cuda_tensor(0).nbytes
    store = Store(100, 4 * nbytes, device_bytes=2 * nbytes)
    values = [cuda_tensor(seed) for seed in range(3)]
    for key, value in zip("abc", values, strict=True):
        store.put(key, value)
    entries = check_books(store)
    assert entries["a"].spilled and entries["a"].value.device.type == "cpu"
    assert get(store, "c") is values[2]  # on the device: the tensor itself
    restored = get(store, "a")
    assert restored is not None and restored.device.type == "cuda" and torch.equal(restored, values[0])
    assert check_books(store)["b"].value.device.type == "cpu"
    stats = store.stats()
    assert (stats.spills, stats.restores, stats.device_bytes, stats.host_bytes) == (2, 1, 2 * nbytes, nbytes)


def test_a_default_cache_keeps_cuda_embeddings_on_the_device_within_a_quarter_of_free_memory() -> None:
    free_before, total = torch.cuda.mem_get_info()
    cache = VisionEmbeddingCache()
    value = cuda_tensor(1)
    cache.set_image_embeddings([np.zeros((8, 8, 3), np.uint8)], [value])
    (hit,) = cache.get_image_embeddings([np.zeros((8, 8, 3), np.uint8)])
    assert hit is value
    stats = cache.snapshot().levels["embedding"]
    assert (stats.device_bytes, stats.host_bytes, stats.spills) == (value.nbytes, 0, 0)
    budget = cache._levels["embedding"].store.device_budget
    assert budget is not None and 0 < budget <= total // 4
    assert abs(budget - free_before // 4) <= total // 100  # read once, at the first embedding
