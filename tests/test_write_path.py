"""The write path walks a new value twice: once to prepare it for memory, once to flatten it for
the tiers; everything else reuses what those walks found.

Defect pinned: one new value was walked 5-6 times per write (compact and its size, its device,
its size again when queued for the tiers, a host snapshot, the serialiser's own walk), and the
tree module was entered 4 times. `trees.prepare` copies views, evaluates mlx arrays, places,
sizes and finds the device in one walk; `serialization.flatten` snapshots and writes the
skeleton in one walk on the caller's thread; the writer only packs bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.conftest import encode_image, random_image
from tests.support.memory_tier import MemoryTier
from tests.support.optional import needs_mlx, needs_torch, torch
from visioncache import VisionEmbeddingCache, trees
from visioncache.tiers import serialization
from visioncache.tiers.chain import TierChain
from visioncache.trees import prepare


@needs_torch
def test_prepare_copies_views_sizes_and_finds_the_device_in_one_result() -> None:
    batch = np.arange(100, dtype=np.float32)
    tensor_batch = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    prepared = prepare({"rows": batch[:10], "tensor": [tensor_batch[0]], "bytes": b"abc", "n": 3})
    assert prepared.value["rows"].base is None  # a view of the batch is copied: it alone is kept
    assert prepared.value["tensor"][0].untyped_storage().nbytes() == 16
    assert prepared.nbytes == 40 + 16 + 3
    assert prepared.device == torch.device("cpu")
    owned = {"rows": np.ones(4), "n": 3}
    again = prepare(owned)
    assert again.value is owned and again.nbytes == 32 and again.device is None  # nothing copied


@needs_torch
def test_prepare_places_torch_leaves_on_the_device_asked() -> None:
    meta = prepare([torch.ones(2)], device=torch.device("meta"))
    assert meta.value[0].device.type == "meta" and meta.device.type == "meta"


@needs_mlx
def test_prepare_evaluates_mlx_leaves() -> None:
    mx = pytest.importorskip("mlx.core")
    lazy = mx.arange(6) * 2
    prepared = prepare({"a": lazy})
    assert prepared.nbytes == lazy.nbytes and prepared.value["a"] is lazy
    assert np.array_equal(np.array(prepared.value["a"]), np.arange(6) * 2)


class Walks:
    """Counts `trees.fold` calls over a tree, wherever the package calls it from (the test
    tier's own store walks its blobs, bytes: not counted)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = trees.fold

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += not isinstance(args[0], bytes)
            return real(*args, **kwargs)

        for module in (trees, serialization):
            monkeypatch.setattr(module, "fold", counted)


@pytest.mark.parametrize("value", [np.zeros((4, 8), np.float16), {"a": np.ones(3), "b": [np.zeros(2)]}])
def test_regression_one_new_value_is_walked_five_times_per_write(
    monkeypatch: pytest.MonkeyPatch, value: Any
) -> None:
    cache = VisionEmbeddingCache(tiers=TierChain([MemoryTier(2**20)]))
    walks = Walks(monkeypatch)
    cache.encode_images([encode_image(random_image(1))], lambda images: [value for _ in images])
    assert cache.tiers is not None and cache.tiers.flush(timeout=30)
    assert walks.count == 2  # prepare (memory), flatten (tiers); the writer packs bytes only
    assert cache.tiers.stats().tiers[0].writes == 1
