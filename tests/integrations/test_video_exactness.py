"""Per-temporal-patch encoding is exact for Qwen2-VL, Qwen2.5-VL and Qwen3-VL, as installed.

The claim visioncache's video cache rests on: the vision tower attends only within a temporal
patch, so a clip's output is the concatenation of its patches' outputs encoded one by one. The
first test reads it off transformers' own helpers (each one the vision towers call), the second
proves it end to end on each family's tower, and the third shows that a tower attending across
the clip is detected and refused rather than approximated.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformers import vision_utils

from tests.integrations.video_reference import VIDEO, chat, noise_frames
from visioncache.errors import ConfigurationError
from visioncache.integrations.transformers import CachedVisionModel
from visioncache.integrations.transformers.video import check_temporal_locality
from visioncache.integrations.transformers.video_pixels import patch_pixels, preprocess_frames
from visioncache.integrations.video.clip import VideoSettings

pytestmark = pytest.mark.slow

CLIP = torch.tensor([[3, 12, 16]])  # t, h, w in patches: 6x8 merged tokens per frame
PATCHES = torch.tensor([[1, 12, 16]] * 3)  # the same clip, one temporal patch per row


def test_transformers_helpers_keep_each_temporal_patch_apart() -> None:
    # cu_seqlens: one attention segment per temporal patch, as for three one-patch clips.
    assert vision_utils.get_vision_cu_seqlens(CLIP).tolist() == [0, 192, 384, 576]
    assert torch.equal(vision_utils.get_vision_cu_seqlens(CLIP), vision_utils.get_vision_cu_seqlens(PATCHES))
    # Rotary (h, w) positions repeat per temporal patch.
    positions = vision_utils.get_vision_position_ids(CLIP, 2)
    assert torch.equal(positions, vision_utils.get_vision_position_ids(PATCHES, 2))
    assert torch.equal(positions[:192], positions[192:384])
    # Qwen3-VL's interpolated learned position embeddings: the same taps and weights per patch.
    for clip, patches in zip(
        vision_utils.get_vision_interpolation_indices_and_weights(CLIP, 48, spatial_merge_size=2),
        vision_utils.get_vision_interpolation_indices_and_weights(PATCHES, 48, spatial_merge_size=2),
        strict=True,
    ):
        assert torch.equal(clip, patches)
    # Qwen2.5-VL's windows: the same order and boundaries, and no window holds tokens of two
    # temporal patches (window_index counts merged tokens, 48 per patch here).
    window_index, cu_windows = vision_utils.get_vision_window_index(CLIP, 2, 112, 14)
    split_index, split_windows = vision_utils.get_vision_window_index(PATCHES, 2, 112, 14)
    assert torch.equal(window_index, split_index) and torch.equal(cu_windows, split_windows)
    merged_bounds = (cu_windows // 4).tolist()
    assert len(merged_bounds) - 1 == 3 * 4  # four windows per frame: padding never joins frames
    for start, end in itertools.pairwise(merged_bounds):
        assert len(set((window_index[start:end] // 48).tolist())) == 1


def _outputs(model: Any, pixels: Any, grid: Any) -> list[Any]:
    with torch.no_grad():
        output = model.get_video_features(pixels, grid)
    tensors = [torch.cat(output.pooler_output)]
    tensors += [torch.cat(layer) for layer in getattr(output, "deepstack_features", None) or []]
    return tensors


def test_each_family_encodes_a_clip_as_its_patches_one_by_one(family_model: Any) -> None:
    family, model, _ = family_model
    vision = model.config.vision_config
    generator = torch.Generator().manual_seed(0)
    row = 3 * vision.temporal_patch_size * vision.patch_size**2
    pixels = torch.randn(3 * 12 * 16, row, generator=generator)
    whole, apart = _outputs(model, pixels, CLIP), _outputs(model, pixels, PATCHES)
    assert len(whole) == (3 if family == "qwen3_vl" else 1)  # embeddings (+ two deepstack layers)
    for joint, split in zip(whole, apart, strict=True):
        torch.testing.assert_close(split, joint, rtol=0, atol=1e-6)
    # The check CachedVisionModel runs before caching video passes on every family.
    check_temporal_locality(model)


def test_a_temporal_patch_stacks_its_frames_in_time_order(family_model: Any) -> None:
    _, model, processor = family_model
    first, second = noise_frames(2, seed=3)
    temporal = model.config.vision_config.temporal_patch_size
    rows = preprocess_frames(processor.image_processor, [first, second], VideoSettings(), temporal)
    patch = patch_pixels([pixels for pixels, _ in rows])
    size = processor.image_processor.patch_size
    # The image processor repeats one image on the temporal axis of each row: frame 0 of the
    # patch must be the first frame's pixels, frame 1 the second's.
    for frame, image in enumerate((first, second)):
        alone = processor.image_processor(images=[image], return_tensors="pt")["pixel_values"]
        expected = alone.view(len(alone), 3, temporal, size, size)[:, :, frame]
        assert torch.equal(patch.view(len(patch), 3, temporal, size, size)[:, :, frame], expected)


def test_a_model_attending_across_the_clip_is_refused(
    family_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, model, processor = family_model
    visual = model.model.visual
    forward = visual.forward

    def clip_wide_attention(hidden_states: Any, grid_thw: Any, **kwargs: Any) -> Any:
        # The convention of towers whose attention spans the clip (e.g. kimi_k25).
        kwargs["cu_seqlens"] = vision_utils.get_vision_cu_seqlens(grid_thw, merge_temporal=True)
        return forward(hidden_states, grid_thw, **kwargs)

    monkeypatch.setattr(visual, "forward", clip_wide_attention)
    cached = CachedVisionModel(model, processor)
    with pytest.raises(ConfigurationError, match="spans temporal patches"):
        cached.prepare(chat(VIDEO), videos=[noise_frames(4)])
    stats = cached.cache.get_stats()
    assert stats["embedding_cache_misses"] == stats["pixel_only_cache_misses"] == 0
    assert cached.times.patches_encoded == 0
