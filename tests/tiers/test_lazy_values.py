"""Values still lazy where they were computed (mlx) are evaluated there before another thread gets them.

MLX evaluates an array's pending work only on a thread that holds the stream the work was built
on (mlx 0.32: "There is no Stream(cpu, N) in current thread"). The tier writer, a thread waiting
on another's computation, and a later hit on another thread all read values they did not compute:
each must get them evaluated, on the thread (and stream) that produced them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.memory_tier import MemoryTier
from visioncache import TierSettings, VisionEmbeddingCache
from visioncache.tiers.chain import TierChain

mx = pytest.importorskip("mlx.core", reason="mlx cannot be imported here (pip install 'visioncache[mlx]')")

KEY = "0123456789abcdef/embedding/" + "ab" * 32


def lazy_value(seed: int) -> dict[str, Any]:
    """An encoder-like value whose arrays are pending work on a stream of this thread's own
    (as vllm-mlx's generation stream is): rows split out of a batch, a grid, bfloat16 rows."""
    stream = mx.new_stream(mx.default_device())
    with mx.stream(stream):
        batch = mx.arange(seed, seed + 96, dtype=mx.float32).reshape(8, 12)
        mx.eval(batch)  # the tower's output is evaluated; what is cut out of it is not
        rows = mx.array(mx.split(batch * 2 + 1, [3])[1])
        return {
            "image_features": rows,
            "image_grid_thw": mx.array([[1, 2, 3]]) + seed,
            "deepstack_features": (rows / 3).astype(mx.bfloat16),
        }


def on_another_thread(function: Callable[[], Any]) -> Any:
    """``function()`` run on a new thread: its result, or the exception it raised."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(function())
        except Exception as error:  # the point: what reading there raises
            outcome.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return outcome[0]


def as_numpy(value: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Each array's dtype and values (bfloat16 as float32: exact), for comparing trees."""
    return {
        name: (str(array.dtype), np.array(array.astype(mx.float32) if array.dtype == mx.bfloat16 else array))
        for name, array in value.items()
    }


def assert_same(loaded: dict[str, Any], expected: dict[str, tuple[str, Any]]) -> None:
    assert set(loaded) == set(expected)
    for name, (dtype, values) in as_numpy(loaded).items():
        assert dtype == expected[name][0], name
        assert np.array_equal(values, expected[name][1]), name


def test_regression_an_mlx_value_lazy_on_another_stream_reaches_the_tier_through_the_background_writer() -> (
    None
):
    """The writer thread serialised mlx arrays still pending on the producer's stream: every save
    failed with "There is no Stream(cpu, 1) in current thread" and only a log line said so (the
    serve-mlx chat path stored no feature in any shared tier)."""
    tier = MemoryTier(None)
    chain = TierChain([tier], max_pending_write_bytes=1 << 20)
    value = lazy_value(7)
    assert chain.save_entry(KEY, value, 0.25)
    assert chain.flush(timeout=None)
    assert chain.stats().unserializable == 0
    loaded = chain.load_entry(KEY)
    assert loaded is not None and loaded[1] == 0.25
    assert_same(loaded[0], as_numpy(value))
    chain.close()


def test_regression_lazy_mlx_features_are_usable_from_another_thread_and_survive_a_restart(
    tmp_path: Path,
) -> None:
    """Features computed lazily on one thread were handed as they were to the memory store (a
    later hit on another thread could not read them) and to the disk tier's writer (not stored)."""
    calls: list[int] = []

    def encode(images: list[Any]) -> list[dict[str, Any]]:
        calls.append(len(images))
        return [lazy_value(index) for index, _ in enumerate(images)]

    images = [b"first image bytes", b"second image bytes"]
    settings = TierSettings(disk_dir=str(tmp_path / "tier"))
    with VisionEmbeddingCache(tiers=settings) as cache:
        computed = cache.encode_images(images, encode)
        served = on_another_thread(lambda: [as_numpy(value) for value in cache.get_image_embeddings(images)])
        assert not isinstance(served, Exception), served
        expected = [as_numpy(value) for value in computed]
    assert cache.snapshot().tiers is not None and cache.snapshot().tiers.unserializable == 0
    with VisionEmbeddingCache(tiers=settings) as restarted:
        assert restarted.encode_images(images, encode) is not None
        loaded = restarted.get_image_embeddings(images)
    assert calls == [2]  # the restarted cache encoded nothing: both came from the disk tier
    for value, want, again in zip(loaded, expected, served, strict=True):
        assert value is not None
        assert_same(value, want)
        assert all(np.array_equal(again[name][1], want[name][1]) for name in want)


def test_regression_a_thread_waiting_on_another_threads_lazy_mlx_computation_can_read_it() -> None:
    """Single-flight: a thread waiting for a key another thread computes got the computed value as
    it was, pending on the computing thread's stream, and failed reading it."""
    started, release = threading.Event(), threading.Event()

    def encode(images: list[Any]) -> list[dict[str, Any]]:
        started.set()
        assert release.wait(120)
        return [lazy_value(3) for _ in images]

    cache = VisionEmbeddingCache()
    owner = threading.Thread(target=lambda: cache.encode_images([b"image"], encode))
    owner.start()
    assert started.wait(120)  # the owner holds the claim and computes until released
    waiter: list[Any] = []
    reader = threading.Thread(target=lambda: waiter.append(on_another_thread(read_waiting(cache, encode))))
    reader.start()
    while cache.snapshot().levels["embedding"].singleflight_waits == 0:  # the reader is waiting
        assert reader.is_alive()
        reader.join(0.01)
    release.set()
    owner.join()
    reader.join()
    assert not isinstance(waiter[0], Exception), waiter[0]
    assert_same(cache.get_image_embeddings([b"image"])[0], waiter[0])


def read_waiting(cache: VisionEmbeddingCache, encode: Any) -> Callable[[], dict[str, tuple[str, Any]]]:
    def read() -> dict[str, tuple[str, Any]]:
        (value,) = cache.encode_images([b"image"], encode)
        return as_numpy(value)

    return read
