"""Regression testsa child forked at any moment never waits forever.

The fork hooks covered stores and the writer's queue, not the other locks visioncache threads hold,
so a child forked while one of its parent's threads was inside one of them inherited it held, by a
thread that does not exist in the child, and its first use waited forever. Every such lock is now
taken across the fork (`visioncache.forking.lock`): the fork waits until no thread is inside it.
Each test forks while another thread is inside one lock and times the child out by PID; the shared
tiers' locks, connections and SQLite are in tests/tiers/test_fork_tiers.py.
"""

from __future__ import annotations

import importlib
import io
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.conftest import encode_image, random_image, settle
from tests.support.forks import held_by_another_thread, run_in_child, start_child, wait_for_child
from visioncache import VisionEmbeddingCache, compute_image_hash
from visioncache.identity import pil

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def value_of(image: object) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(compute_image_hash(image)), np.uint8).astype(np.float32)


def encode(images: list[Any]) -> list[np.ndarray]:
    return [value_of(image) for image in images]


def encodes_correctly(cache: VisionEmbeddingCache, images: list[Any]) -> bool:
    values = cache.encode_images(images, encode)
    return all(np.array_equal(value, value_of(image)) for value, image in zip(values, images, strict=True))


def animated_gif(frames: int = 12, side: int = 96) -> Image.Image:
    pictures = [random_image(seed, (side, side)) for seed in range(frames)]
    buffer = io.BytesIO()
    pictures[0].save(buffer, "GIF", save_all=True, append_images=pictures[1:])
    return Image.open(io.BytesIO(buffer.getvalue()))


def settled(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return settle(path)  # the path memo remembers settled files only


def test_regression_child_forked_inside_the_pil_identity_lock_waits_forever() -> None:
    """A thread hashing a multi-frame PIL image holds the module's seek lock: a child forked then
    waited forever at its first multi-frame hash (every time)."""
    gif = animated_gif(frames=3, side=8)
    with held_by_another_thread(pil._SEEKING):
        outcome = run_in_child(lambda: len(compute_image_hash(gif)) == 64)
    assert outcome == "ok", f"the child's multi-frame hash {outcome}"


def test_regression_child_forked_while_a_thread_hashes_a_multi_frame_image_waits_forever() -> None:
    """The same, as it happens: one thread keeps hashing a 12-frame GIF while the test forks."""
    gif, other = animated_gif(), animated_gif(frames=2, side=8)
    stop = threading.Event()

    def keep_hashing() -> None:
        while not stop.is_set():
            compute_image_hash(gif)

    thread = threading.Thread(target=keep_hashing, daemon=True)
    thread.start()
    try:
        outcomes = [run_in_child(lambda: len(compute_image_hash(other)) == 64, seconds=5.0) for _ in range(8)]
    finally:
        stop.set()
        thread.join(30)
    assert outcomes == ["ok"] * 8


def test_regression_child_forked_inside_the_path_memo_lock_waits_forever(tmp_path: Path) -> None:
    cache = VisionEmbeddingCache()
    path = settled(tmp_path / "image.png", encode_image(random_image(1)))
    with held_by_another_thread(cache._keys.hasher.path_memo._lock):
        outcome = run_in_child(lambda: encodes_correctly(cache, [str(path)]))
    assert outcome == "ok", f"the child's first path lookup {outcome}"


def test_regression_child_forked_inside_the_reference_levels_lock_waits_forever() -> None:
    cache = VisionEmbeddingCache()
    pixels = np.zeros(4, np.float32)

    def store_and_read() -> bool:
        cache.set_pixel_cache([b"image"], "prompt", pixels, pixels)
        found = cache.get_pixel_cache([b"image"], "prompt")
        return found is not None and cache.get_stats()["total_images_processed"] == 1

    with held_by_another_thread(cache._reference._lock):
        outcome = run_in_child(store_and_read)
    assert outcome == "ok", f"the child's first set_pixel_cache {outcome}"


def test_fork_waits_for_a_lock_holder_not_forever() -> None:
    """The parent's side: a fork waits only until the holder leaves the lock, and the parent's
    own threads carry on afterwards."""
    lock = pil._SEEKING
    started = time.monotonic()
    with held_by_another_thread(lock):
        pid = start_child(lambda: lock.acquire(timeout=1.0))
        waited = time.monotonic() - started
    assert wait_for_child(pid) == "ok"
    assert waited >= 0.1  # the fork began while the lock was held and waited for its release
    assert lock.acquire(timeout=1.0)
    lock.release()


def test_regression_child_forked_inside_the_weights_memo_lock_waits_forever(tmp_path: Path) -> None:
    """`weights_digest`'s memo lock was a plain lock: a child forked while a thread updated the
    memo waited forever at its first model fingerprint."""
    from visioncache.integrations import fingerprint

    (tmp_path / "model.safetensors").write_bytes(b"weights")
    with held_by_another_thread(fingerprint._weights_lock):
        outcome = run_in_child(lambda: fingerprint.weights_digest(tmp_path) is not None)
    assert outcome == "ok", f"the child's first weights digest {outcome}"


def test_regression_child_forked_inside_the_stage_times_lock_waits_forever() -> None:
    """The transformers adapter's `StageTimes` counted under a plain lock (the same defect)."""
    pytest.importorskip("transformers")
    from visioncache.integrations.transformers.model import StageTimes

    times = StageTimes()

    def count() -> bool:
        times.add(encoded=1)
        return times.images_encoded == 1

    with held_by_another_thread(times._lock):
        outcome = run_in_child(count)
    assert outcome == "ok", f"the child's first StageTimes.add {outcome}"


def test_regression_child_forked_inside_the_mlx_self_check_lock_waits_forever() -> None:
    """The mlx family self-check's results lock (the same defect)."""
    pytest.importorskip("mlx_vlm")
    from visioncache.integrations.mlx_vlm.families import selfcheck

    with held_by_another_thread(selfcheck._lock):
        outcome = run_in_child(lambda: selfcheck._lock.acquire(timeout=2.0))
    assert outcome == "ok", f"the child's first self-check lookup {outcome}"


def test_regression_child_forked_while_vllm_mlx_is_installing_waits_forever() -> None:
    """The vllm-mlx installation's lock is not a leaf (installing imports vllm-mlx), so it is not
    taken across a fork: a child forked while a thread held it waited forever at its first
    install() or uninstall(); a child now gets a new one."""
    pytest.importorskip("vllm_mlx")
    install = importlib.import_module("visioncache.integrations.vllm_mlx.install")

    with held_by_another_thread(install._lock):
        outcome = run_in_child(lambda: install._lock.acquire(timeout=2.0))
    assert outcome == "ok", f"the child's first install() {outcome}"
