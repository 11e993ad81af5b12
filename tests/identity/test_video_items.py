"""Video identity: one identity path for images and videos.

The defect: video files were hashed by a second path (`file_digest`: mmap of any path, no size
bound, no regular-file check, no memo), and the cache's keys for a video's file index, frames and
patches were 32-byte digests disguised as uint8 arrays, so the cache hashed them as images: an
image array of those 32 bytes was one of them. Now a video file is content for the cache's own
hasher (regular files only, within ``max_image_bytes``, memoised by file state), a decoded frame
is an array for it, and the file index, frames and patches are typed items
(`visioncache.identity.VideoFile`, `VideoFrame`, `VideoPatch`), each hashed under its own domain.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import random_image, settle
from visioncache import VisionEmbeddingCache, compute_image_hash
from visioncache.errors import ImageTooLargeError, InvalidArgumentError, InvalidImageError
from visioncache.identity import ContentId, VideoFile, VideoFrame, VideoPatch
from visioncache.integrations.video.clip import ClipResolver, VideoFrames, VideoSettings

SETTINGS = VideoSettings(fps=2.0)
A, B, S, T = (bytes([value]) * 32 for value in (1, 2, 3, 4))


def frames(count: int, seed: int = 0) -> list[np.ndarray]:
    return [np.asarray(random_image(seed + index, (32, 24))) for index in range(count)]


def mp4(count: int = 8, seed: int = 0) -> bytes:
    from visioncache.bench.video_workload import mp4_bytes

    pytest.importorskip("av")
    return mp4_bytes(frames(count, seed), 4)


def settled(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return settle(path)  # the path memo remembers settled files only


def test_regression_a_video_patch_key_is_an_image_array_of_its_32_bytes() -> None:
    """A patch's key was its digest as a uint8 array, which the cache hashed as an image: an
    array image of those 32 bytes was served the patch's vision output."""
    cache = VisionEmbeddingCache()
    resolver = ClipResolver(cache, SETTINGS, 2)
    clip = resolver.resolve([VideoFrames(frames(4))])[0]
    item: Any = resolver.patch_item(clip, 0)
    patch_output = np.full(8, 7.0, np.float32)
    cache.encode_images([item], lambda missing: [patch_output for _ in missing])
    named_by = item.tobytes() if isinstance(item, np.ndarray) else cache.image_digests([item])[0]
    disguised = np.frombuffer(named_by, np.uint8).copy()  # an image that is those 32 bytes
    assert cache.get_image_embeddings([disguised]) == [None]


def test_regression_video_file_is_hashed_without_the_size_bound() -> None:
    """A video file over ``max_image_bytes`` was hashed (mmap, no bound) and decoded."""
    data = mp4(16)
    cache = VisionEmbeddingCache(max_image_bytes=len(data) - 1)
    resolver = ClipResolver(cache, SETTINGS, 2)
    with pytest.raises(ImageTooLargeError, match="max_image_bytes"):
        resolver.resolve([data])
    assert resolver.decoded_files == 0 and cache.snapshot().levels["pixel_only"].entries == 0


def test_regression_video_file_path_is_hashed_without_the_size_bound(tmp_path: Path) -> None:
    data = mp4(16)
    path = settled(tmp_path / "clip.mp4", data)
    resolver = ClipResolver(VisionEmbeddingCache(max_image_bytes=len(data) - 1), SETTINGS, 2)
    with pytest.raises(ImageTooLargeError):
        resolver.resolve([path])
    assert resolver.decoded_files == 0


def test_a_video_file_has_one_identity_as_a_path_and_as_bytes_and_an_unchanged_path_is_not_reread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = mp4()
    path = settled(tmp_path / "clip.mp4", data)
    cache = VisionEmbeddingCache()
    resolver = ClipResolver(cache, SETTINGS, 2)
    from_bytes = resolver.resolve([data])[0]
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(
        "os.open", lambda name, *args: opened.append(os.fspath(name)) or real_open(name, *args)
    )
    from_path = resolver.resolve([path])[0]
    assert from_path.frame_digests == from_bytes.frame_digests and resolver.decoded_files == 1
    assert opened.count(str(path)) == 1  # hashed once, through the cache's hasher (not decoded)
    resolver.resolve([str(path)])
    assert opened.count(str(path)) == 1  # unchanged: the path memo answers
    assert cache.image_digests([path]) == cache.image_digests([data])


def test_a_video_path_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "clip.mp4"
    os.mkfifo(fifo)
    resolver = ClipResolver(VisionEmbeddingCache(), SETTINGS, 2)
    with pytest.raises(InvalidImageError):
        resolver.resolve([fifo])


def test_frames_are_digested_as_the_arrays_they_are() -> None:
    """A frame's digest is the hasher's digest of its RGB array (no second array-hash scheme)."""
    pixels = frames(3)
    resolver = ClipResolver(VisionEmbeddingCache(), SETTINGS, 2)
    clip = resolver.resolve([VideoFrames(pixels)])[0]
    assert [digest.hex() for digest in clip.frame_digests] == [compute_image_hash(frame) for frame in pixels]


def video_items() -> dict[str, Any]:
    return {
        "file A": VideoFile(A, S),
        "file B": VideoFile(B, S),
        "file A, other settings": VideoFile(A, T),
        "frame A": VideoFrame(A, S),
        "frame A, other settings": VideoFrame(A, T),
        "patch A": VideoPatch((A,), S),
        "patch A A": VideoPatch((A, A), S),
        "patch A B": VideoPatch((A, B), S),
        "patch B A": VideoPatch((B, A), S),
        "patch A B, other settings": VideoPatch((A, B), T),
    }


def test_collision_video_items_of_every_kind_field_order_and_length() -> None:
    items = video_items()
    digests = {name: compute_image_hash(item) for name, item in items.items()}
    assert len(set(digests.values())) == len(digests), digests
    assert compute_image_hash(VideoPatch((A, B), S)) == compute_image_hash(VideoPatch((A, B), S))


@pytest.mark.parametrize("name", list(video_items()))
def test_collision_video_items_never_meet_an_image_or_an_identifier(name: str) -> None:
    item = video_items()[name]
    fields = b"".join(
        value if isinstance(value, bytes) else b"".join(value)
        for value in (getattr(item, slot) for slot in item.__slots__)
    )
    others = [A, S, fields, np.frombuffer(fields, np.uint8), ContentId(fields.hex()), ContentId(name)]
    assert compute_image_hash(item) not in {compute_image_hash(other) for other in others}


@pytest.mark.parametrize(
    "make",
    [
        lambda: VideoFile(b"short", S),
        lambda: VideoFrame(A, "not bytes"),
        lambda: VideoPatch((), S),
        lambda: VideoPatch([A], S),
        lambda: VideoPatch((A, b"x" * 31), S),
    ],
)
def test_bad_video_items_are_typed_errors(make: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        make()


def test_video_items_key_the_callers_dictionaries_by_value() -> None:
    items = list(video_items().values())
    again = list(video_items().values())
    assert all(a == b and hash(a) == hash(b) for a, b in zip(items, again, strict=True))
    assert len(set(items)) == len(items)
    assert all(a != b for a, b in itertools.combinations(items, 2))
