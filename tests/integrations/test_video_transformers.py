"""CachedVisionModel with videos: the logits of transformers' own whole-clip path, patches reused.

Each family is checked for a whole clip (cold and warm), a live window sliding over a stream, an
odd frame count (the last temporal patch padded) and an image + video mix, within 1e-4 (fp32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
av = pytest.importorskip("av")

from tests.integrations.video_reference import (
    IMAGE,
    VIDEO,
    chat,
    logits,
    max_difference,
    noise_frames,
    reference_inputs,
)
from visioncache import VisionEmbeddingCache
from visioncache.bench.video_workload import mp4_bytes
from visioncache.errors import (
    InvalidImageError,
    PlaceholderMismatchError,
    UnsupportedImageTypeError,
)
from visioncache.integrations.transformers import CachedVisionModel, VideoFrames
from visioncache.integrations.video.clip import ClipResolver, VideoSettings
from visioncache.integrations.video.decode import decode_frames

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4  # the bound for fp32; the measured differences are ~1e-6 or 0


def check(model: Any, processor: Any, cached: CachedVisionModel, text: str, **request: Any) -> None:
    actual = logits(model, cached.prepare(text, **request))
    expected = logits(model, reference_inputs(model, processor, text, **request))
    assert max_difference(actual, expected) <= TOLERANCE


def test_whole_clip_cold_and_warm(family_model: Any) -> None:
    _, model, processor = family_model
    cached = CachedVisionModel(model, processor)
    clip = VideoFrames(noise_frames(8, 112, 168), fps=4.0)  # Qwen2.5-VL: several windows a frame
    check(model, processor, cached, chat(VIDEO), videos=[clip])
    assert (cached.times.patches_encoded, cached.times.frames_preprocessed) == (4, 8)
    check(model, processor, cached, chat(VIDEO, "what is in this picture"), videos=[clip])
    assert (cached.times.patches_encoded, cached.times.frames_preprocessed) == (4, 8)  # re-sent: 0


def test_sliding_window_encodes_only_the_new_patch(family_model: Any) -> None:
    _, model, processor = family_model
    cached = CachedVisionModel(model, processor)
    stream = noise_frames(14, seed=1)
    for turn, start in enumerate(range(0, 7, 2)):
        window = VideoFrames(stream[start : start + 8], fps=4.0, frame_indices=range(start, start + 8))
        check(model, processor, cached, chat(VIDEO), videos=[window])
        # 4 patches on the first turn, then one new patch (two new frames) per turn.
        assert cached.times.patches_encoded == 4 + turn
        assert cached.times.frames_preprocessed == 8 + 2 * turn


def test_odd_frame_count_pads_the_last_patch(family_model: Any) -> None:
    _, model, processor = family_model
    cached = CachedVisionModel(model, processor)
    check(model, processor, cached, chat(VIDEO), videos=[VideoFrames(noise_frames(7, seed=2), fps=2.0)])
    assert cached.times.patches_encoded == 4


def test_image_and_video_mix(family_model: Any, images: Any) -> None:
    _, model, processor = family_model
    cached = CachedVisionModel(model, processor)
    first, second = (
        VideoFrames(noise_frames(4, seed=4)),
        VideoFrames(noise_frames(6, 84, 56, seed=5), fps=3.0),
    )
    text = chat(f"{IMAGE}{VIDEO}{IMAGE}{VIDEO}")
    check(model, processor, cached, text, images=images[:2], videos=[first, second])
    check(model, processor, cached, text, images=images[:2], videos=[first, second])  # warm
    assert (cached.times.images_encoded, cached.times.patches_encoded) == (2, 5)


def test_batch_of_requests_encodes_shared_patches_once(family_model: Any) -> None:
    _, model, processor = family_model
    cached = CachedVisionModel(model, processor)
    stream = noise_frames(6, seed=6)
    cached.prepare_batch([(chat(VIDEO), [], [stream[:4]]), (chat(VIDEO), [], [stream[2:]])])
    assert cached.times.patches_encoded == 3  # frames 2-3 are one patch of both windows


def _video_file(frames: list[np.ndarray], fps: int = 4) -> bytes:
    return mp4_bytes(frames, fps)


def test_video_file_is_decoded_once_and_then_known_by_its_bytes(tmp_path: Path) -> None:
    from visioncache.bench.models import build_offline_model

    model, processor = build_offline_model("qwen2_vl")
    data = _video_file(noise_frames(16, 64, 96, seed=7))
    path = tmp_path / "clip.mp4"
    path.write_bytes(data)
    settings = VideoSettings(fps=2.0)  # 16 frames at 4 fps: 8 frames sampled, every other one
    cached = CachedVisionModel(model, processor, video_settings=settings)
    frames = decode_frames(data, list(range(0, 16, 2)))
    reference = reference_inputs(
        model, processor, chat(VIDEO), videos=[VideoFrames(frames)], settings=settings
    )
    expected = logits(model, reference)
    assert max_difference(logits(model, cached.prepare(chat(VIDEO), videos=[data])), expected) <= TOLERANCE
    assert cached.times.patches_encoded == 4
    resolver = cached._video.clips  # type: ignore[union-attr]
    assert resolver.decoded_files == 1
    # The same bytes as a path, then again as bytes: one lookup gives the frames' digests, every
    # patch hits, and nothing is decoded or preprocessed again.
    for video in (path, data):
        actual = logits(model, cached.prepare(chat(VIDEO), videos=[video]))
        assert max_difference(actual, expected) <= TOLERANCE
    assert (resolver.decoded_files, cached.times.patches_encoded, cached.times.frames_preprocessed) == (
        1,
        4,
        8,
    )
    # The frames sent decoded share the file's entries: same pixels, same keys.
    cached.prepare(chat(VIDEO), videos=[frames])
    assert cached.times.patches_encoded == 4


def test_a_warm_file_turn_hashes_and_decodes_nothing_and_a_miss_decodes_only_its_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a file clip with one missing patch decoded every sampled frame (Clip.frames()
    loaded the whole clip) to preprocess the two frames that patch needed."""
    import visioncache.identity.hasher as hasher_module
    from visioncache.bench.models import build_offline_model

    model, processor = build_offline_model("qwen2_vl")
    data = _video_file(noise_frames(16, 64, 96, seed=12))
    path = tmp_path / "clip.mp4"
    path.write_bytes(data)
    settings = VideoSettings(fps=2.0)  # 8 frames sampled (0, 2, ..., 14): 4 patches
    cached = CachedVisionModel(model, processor, video_settings=settings)
    hasher = cached.cache._keys.hasher
    monkeypatch.setattr(hasher.path_memo, "settle_seconds", 0.0)  # remember a file just written
    file_hashes: list[str] = []
    real_hash_file = hasher_module.hash_file

    def counted_hash_file(name: str, *args: Any) -> Any:
        file_hashes.append(name)
        return real_hash_file(name, *args)

    monkeypatch.setattr(hasher_module, "hash_file", counted_hash_file)
    frame_hashes: list[int] = []
    real_digests = ClipResolver.frame_digests

    def counted_digests(self: ClipResolver, frames: Any) -> list[bytes]:
        frame_hashes.append(len(frames))
        return real_digests(self, frames)

    monkeypatch.setattr(ClipResolver, "frame_digests", counted_digests)
    expected = logits(
        model,
        reference_inputs(
            model,
            processor,
            chat(VIDEO),
            videos=[VideoFrames(decode_frames(data, list(range(0, 16, 2))))],
            settings=settings,
        ),
    )

    def turn() -> None:
        actual = logits(model, cached.prepare(chat(VIDEO), videos=[path]))
        assert max_difference(actual, expected) <= TOLERANCE

    turn()  # cold: the file is read and hashed once, decoded once, its 8 frames hashed once
    resolver = cached._video.clips  # type: ignore[union-attr]
    assert (len(file_hashes), frame_hashes, resolver.decoded_files, resolver.loaded_frames) == (1, [8], 1, 0)
    for _ in range(2):  # warm: the path memo names the file, one lookup gives its frames' digests
        turn()
    assert (len(file_hashes), frame_hashes, resolver.decoded_files, resolver.loaded_frames) == (1, [8], 1, 0)
    assert (cached.times.patches_encoded, cached.times.frames_preprocessed) == (4, 8)
    # The last patch's output and its two frames' pixels are evicted: the next turn decodes
    # those two frames only (no other frame is converted), and encodes that one patch.
    clip = resolver.resolve([path])[0]
    last = resolver.patch_item(clip, 6)
    assert cached.cache.discard_images([last, *(resolver.frame_item(d) for d in last.frames)]) == 3
    turn()
    assert (len(file_hashes), frame_hashes, resolver.decoded_files, resolver.loaded_frames) == (1, [8], 1, 2)
    assert (cached.times.patches_encoded, cached.times.frames_preprocessed) == (5, 10)


def test_other_video_settings_never_share_entries() -> None:
    from visioncache.bench.models import build_offline_model

    model, processor = build_offline_model("qwen2_vl")
    cache = VisionEmbeddingCache()
    clip = noise_frames(4, 112, 112, seed=8)
    small = CachedVisionModel(model, processor, cache=cache, video_settings=VideoSettings(max_pixels=56 * 56))
    large = CachedVisionModel(model, processor, cache=cache)
    assert small.video_outputs([[clip]])[0][0].grid.tolist() == [2, 4, 4]
    assert large.video_outputs([[clip]])[0][0].grid.tolist() == [2, 8, 8]
    assert large.times.patches_encoded == 2  # no hit on the other settings' patches


def test_bad_video_input_is_a_typed_error_and_encodes_nothing() -> None:
    from visioncache.bench.models import build_offline_model

    model, processor = build_offline_model("qwen2_vl")
    cached = CachedVisionModel(model, processor)
    frames = noise_frames(3)
    bad_requests: list[tuple[type[Exception], Any]] = [
        (InvalidImageError, [frames[0], noise_frames(1, 28, 28)[0]]),  # frames of two sizes
        (UnsupportedImageTypeError, [np.zeros((4, 4), np.float32)]),  # not an RGB uint8 frame
        (UnsupportedImageTypeError, 42),
        (InvalidImageError, "/no/such/video.mp4"),
        (InvalidImageError, b"not a video"),
    ]
    for error, video in bad_requests:
        with pytest.raises(error):
            cached.prepare(chat(VIDEO), videos=[video])
    with pytest.raises(PlaceholderMismatchError):
        cached.prepare(chat(VIDEO + VIDEO), videos=[frames])
    stats = cached.cache.get_stats()
    assert stats["embedding_cache_misses"] == 0 and cached.times.patches_encoded == 0


def test_a_batch_of_prompts_takes_its_videos_in_placeholder_order(family_model: Any) -> None:
    """prepare(text=[...], videos=[...]): each video fills the next video placeholder across the
    batch, as prepare_batch with the videos per request; a count that differs is refused."""
    _, model, processor = family_model
    cached = CachedVisionModel(model, processor)
    first, second = noise_frames(4, seed=8), noise_frames(4, seed=9)
    texts = [chat(VIDEO), chat(VIDEO, "what is in this picture")]
    together = cached.prepare(texts, videos=[first, second])
    apart = cached.prepare_batch([(texts[0], [], [first]), (texts[1], [], [second])])
    assert torch.equal(together["input_ids"], apart["input_ids"])
    assert max_difference(logits(model, together), logits(model, apart)) == 0
    swapped = cached.prepare(texts, videos=[second, first])
    assert max_difference(logits(model, swapped), logits(model, together)) > 1e-3
    before = cached.cache.snapshot()
    with pytest.raises(PlaceholderMismatchError, match="2 video placeholders but 1"):
        cached.prepare(texts, videos=[first])
    assert cached.cache.snapshot() == before
