"""Per-image embeddings: partial hits, one batched encode of deduplicated misses, single-flight, pins."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from visioncache import EncoderOutputError, VisionEmbeddingCache, compute_image_hash
from visioncache.errors import InvalidArgumentError


class Encoder:
    """An encode_fn that records its calls and returns a distinct (2, 4) array per image."""

    def __init__(self, delay: float = 0.0, rows: int = 2):
        self.calls: list[list[str]] = []
        self.delay = delay
        self.rows = rows
        self.lock = threading.Lock()

    def __call__(self, images: list[bytes]) -> list[np.ndarray]:
        with self.lock:
            self.calls.append([compute_image_hash(image)[:8] for image in images])
        time.sleep(self.delay)
        return [np.full((self.rows, 4), int(compute_image_hash(i)[:6], 16), np.float32) for i in images]


def names(images: list[bytes]) -> list[str]:
    return [compute_image_hash(image)[:8] for image in images]


def test_partial_hit_with_repeats_encodes_only_distinct_misses_in_first_seen_order(make_png):
    cache, encoder = VisionEmbeddingCache(), Encoder()
    a, b, c = make_png(1), make_png(2), make_png(3)
    cache.encode_images([a], encoder)
    result = cache.encode_images([a, b, a, c], encoder)
    assert encoder.calls[1:] == [names([b, c])]
    assert result[0] is result[2]
    expected = Encoder()([a, b, a, c])
    assert all(np.array_equal(x, y) for x, y in zip(result, expected, strict=True))


def test_all_hits_do_not_call_encode_fn(make_png):
    cache, encoder = VisionEmbeddingCache(), Encoder()
    images = [make_png(1), make_png(2)]
    first = cache.encode_images(images, encoder)
    second = cache.encode_images(list(reversed(images)), encoder)
    assert len(encoder.calls) == 1 and second == list(reversed(first))
    stats = cache.get_stats()
    assert (stats["embedding_cache_hits"], stats["embedding_cache_misses"]) == (2, 2)
    assert stats["embedding_cache_computed"] == 2 and stats["embedding_hit_rate"] == 0.5


def test_encode_batch_deduplicates_across_requests(make_png):
    cache, encoder = VisionEmbeddingCache(), Encoder()
    a, b, c, d = (make_png(seed) for seed in range(4))
    cache.encode_images([a], encoder)
    results = cache.encode_batch([[a, b], [c, b, a], [d], []], encoder)
    assert encoder.calls[1:] == [names([b, c, d])]
    assert [len(r) for r in results] == [2, 3, 1, 0]
    assert results[0][1] is results[1][1] and results[0][0] is results[1][2]


def test_get_and_set_image_embeddings_round_trip_and_add_time_saved(make_png):
    cache = VisionEmbeddingCache()
    a, b = make_png(1), make_png(2)
    value = {"embeds": np.ones((3, 2)), "grid": (1, 2, 6)}
    cache.set_image_embeddings([a, b], [value, None], encoding_time=2.0)
    got = cache.get_image_embeddings([b, a, make_png(3)])
    assert got[1] is value and got[2] is None
    assert cache.get_stats()["total_time_saved"] == pytest.approx(2.0)  # two hits of 1.0 s each
    with pytest.raises(InvalidArgumentError, match="1 values for 2 images"):  # the caller's mistake
        cache.set_image_embeddings([a, b], [value])


def test_single_flight_sixteen_threads_one_encode(make_png):
    cache, encoder = VisionEmbeddingCache(), Encoder(delay=0.2)
    image = make_png(1)
    barrier = threading.Barrier(16)
    results: list[object] = [None] * 16

    def ask(index: int) -> None:
        barrier.wait()
        results[index] = cache.encode_images([image], encoder)[0]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(encoder.calls) == 1
    assert all(result is results[0] for result in results)
    stats = cache.get_stats()
    assert stats["embedding_cache_computed"] == 1
    assert stats["embedding_cache_singleflight_waits"] + stats["embedding_cache_hits"] == 15


def test_encode_fn_exception_reaches_caller_and_waiters_and_nothing_is_cached(make_png):
    cache = VisionEmbeddingCache()
    image = make_png(1)
    started = threading.Event()

    def failing(images: list[bytes]) -> list[np.ndarray]:
        started.set()
        # Fail only once the other thread waits on this encode (deterministic, no sleep race).
        deadline = time.monotonic() + 30
        while cache.get_stats()["embedding_cache_singleflight_waits"] < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        raise RuntimeError("encoder out of memory")

    waiter_error: list[BaseException] = []
    waiter_encoder = Encoder()

    def wait_for_it() -> None:
        started.wait()
        try:
            cache.encode_images([image], waiter_encoder)
        except RuntimeError as error:
            waiter_error.append(error)

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    with pytest.raises(RuntimeError, match="out of memory"):
        cache.encode_images([image], failing)
    waiter.join()
    assert [str(e) for e in waiter_error] == ["encoder out of memory"]
    assert waiter_encoder.calls == []  # the waiter did not encode: it got the owner's error
    assert cache.get_image_embeddings([image]) == [None]
    encoder = Encoder()
    cache.encode_images([image], encoder)  # a later call retries
    assert len(encoder.calls) == 1


@pytest.mark.parametrize("returned", [0, 1, 3])
def test_wrong_number_of_results_raises_and_caches_nothing(make_png, returned):
    cache = VisionEmbeddingCache()
    images = [make_png(1), make_png(2)]
    with pytest.raises(EncoderOutputError, match=f"returned {returned} values for 2 images"):
        cache.encode_images(images, lambda xs: [np.zeros(1)] * returned)
    assert cache.get_stats()["embedding_cache_size"] == 0
    assert cache.encode_images(images, Encoder())[0].shape == (2, 4)


def test_pinned_embeddings_survive_pressure_and_are_evictable_after_release(make_png):
    value_bytes = 2 * 4 * 4
    cache = VisionEmbeddingCache(max_embedding_bytes=3 * value_bytes)
    a = make_png(100)
    others = [make_png(seed) for seed in range(6)]
    encoder = Encoder()
    with cache.pinned([a]):
        cache.encode_images([a], encoder)
        for other in others:
            cache.encode_images([other], encoder)
        assert cache.get_image_embeddings([a])[0] is not None
        assert cache.get_stats()["embedding_cache_bytes"] <= 3 * value_bytes
    for other in others:
        cache.encode_images([other], encoder)
    assert cache.get_image_embeddings([a]) == [None]


def test_pinned_values_beyond_budget_are_returned_but_not_stored(make_png):
    cache = VisionEmbeddingCache(max_embedding_entries=1)
    a, b = make_png(1), make_png(2)
    with cache.pinned([a]):
        cache.encode_images([a], Encoder())
        value = cache.encode_images([b], Encoder())[0]
        assert value.shape == (2, 4)
        stats = cache.get_stats()
        assert stats["embedding_cache_rejections"] == 1 and stats["embedding_cache_size"] == 1


def tree_value(framework: str) -> tuple[object, int]:
    if framework == "numpy":
        value = {"embeds": np.zeros((5, 8), np.float32), "deepstack": [np.zeros((5, 8), np.float16)] * 2}
        return value, 5 * 8 * 4 + 2 * 5 * 8 * 2
    if framework == "torch":
        torch = pytest.importorskip("torch")
        value = (torch.zeros(5, 8, dtype=torch.bfloat16), torch.tensor([[1, 2, 2]]), 7)
        return value, 5 * 8 * 2 + 3 * 8
    mx = pytest.importorskip("mlx.core", reason="mlx cannot be installed on this platform")
    value = {"features": mx.zeros((5, 8), dtype=mx.bfloat16), "grid": mx.array([[1, 2, 2]], dtype=mx.int32)}
    return value, 5 * 8 * 2 + 3 * 4


@pytest.mark.parametrize("framework", ["numpy", "torch", "mlx"])
def test_byte_accounting_is_the_sum_of_nbytes_and_types_are_preserved(make_png, framework):
    value, expected_bytes = tree_value(framework)
    cache = VisionEmbeddingCache()
    result = cache.encode_images([make_png(1)], lambda images: [value])[0]
    assert result is value
    assert cache.get_stats()["embedding_cache_bytes"] == expected_bytes
    assert cache.get_image_embeddings([make_png(1)])[0] is value


def test_oversize_embedding_is_returned_but_not_stored(make_png):
    cache = VisionEmbeddingCache(max_embedding_bytes=16)
    value = cache.encode_images([make_png(1)], Encoder())[0]
    assert value.shape == (2, 4)
    stats = cache.get_stats()
    assert stats["embedding_cache_size"] == 0 and stats["embedding_cache_rejections"] == 1


@pytest.mark.parametrize(
    "expect_factory",
    [lambda: [3], lambda: lambda value: value.shape[0] == 3],
    ids=["token-count", "callable"],
)
def test_validation_failure_on_hit_re_encodes_and_is_counted(make_png, expect_factory: Callable[[], object]):
    # SGLang once served a 275-token embedding into a 256-token slot after a key collision.
    cache = VisionEmbeddingCache()
    image = make_png(1)
    cache.set_image_embeddings([image], [np.zeros((2, 4))])  # wrong: 2 tokens, expected 3
    encoder = Encoder(rows=3)
    value = cache.encode_images([image], encoder, expect=expect_factory())[0]
    assert value.shape == (3, 4) and len(encoder.calls) == 1
    assert cache.get_image_embeddings([image])[0] is value
    assert cache.get_stats()["embedding_cache_validation_failures"] == 1
    assert cache.encode_images([image], encoder, expect=expect_factory())[0] is value


def test_disabled_cache_encodes_everything_and_stores_nothing(make_png):
    cache, encoder = VisionEmbeddingCache(enabled=False), Encoder()
    images = [make_png(1), make_png(1)]
    assert len(cache.encode_images(images, encoder)) == 2
    assert len(encoder.calls[0]) == 2 and cache.get_stats()["embedding_cache_size"] == 0


def test_preprocess_images_caches_per_image_and_is_visible_to_get_pixel_values(make_png):
    from visioncache import PixelOnlyCacheEntry

    cache = VisionEmbeddingCache()
    calls: list[int] = []

    def preprocess(images: list[bytes]) -> list[PixelOnlyCacheEntry]:
        calls.append(len(images))
        return [PixelOnlyCacheEntry(np.ones((4, 3)), (1, 2, 2)) for _ in images]

    a, b = make_png(1), make_png(2)
    cache.preprocess_images([a, b, a], preprocess)
    cache.preprocess_images([b, a], preprocess)
    assert calls == [2]
    assert isinstance(cache.get_pixel_values([a]), PixelOnlyCacheEntry)
