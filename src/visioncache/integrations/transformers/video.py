"""Video for the transformers adapter: vision-encoder output cached per temporal patch.

Why this is exact: in Qwen2-VL, Qwen2.5-VL and Qwen3-VL the vision tower attends only within a
temporal patch (``temporal_patch_size`` frames): ``cu_seqlens`` has one segment per ``t``, the
rotary positions (and Qwen3-VL's interpolated position embeddings) repeat per ``t``, Qwen2.5-VL's
attention windows are cut per ``t``, and the merger and deepstack mergers work per token group of
one frame. So a clip's output is the concatenation of its patches' outputs, each encoded alone as
a ``(1, h, w)`` grid. ``check_temporal_locality`` proves this on the loaded model before any video
is cached, and refuses a model whose attention spans the clip.

A request's patches are looked up in the embedding level; the missing ones (of every video in the
batch) are encoded in one call, and only their frames are preprocessed, each frame once, through
the pixel-only level. Frames come from the image processor (resize within the resolution bounds,
rescale, normalise), so a video frame is prepared exactly as an image of the same pixels.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, ProcessorMixin

from visioncache import PixelOnlyCacheEntry, VisionEmbeddingCache
from visioncache.errors import ConfigurationError
from visioncache.identity import VideoPatch
from visioncache.integrations.transformers.encoding import FamilyEncoder
from visioncache.integrations.transformers.families import Family
from visioncache.integrations.transformers.model import StageTimes
from visioncache.integrations.transformers.tower_graphs import TowerGraphs
from visioncache.integrations.transformers.video_pixels import patch_pixels, preprocess_frames
from visioncache.integrations.video import (
    DEFAULT_FPS,
    Clip,
    ClipResolver,
    VideoInput,
    VideoSettings,
    patch_frames,
    sampled_fps,
)

__all__ = [
    "VideoEncoder",
    "VideoOutput",
    "check_temporal_locality",
    "video_inputs",
    "video_output",
    "video_replacement",
]


@dataclass(frozen=True)
class VideoOutput:
    """One video's vision output, patch by patch, and what its prompt text and positions need."""

    patches: list[dict[str, Any]]  # per temporal patch: embeddings (+ deepstack_features)
    grid: torch.Tensor  # (t, h, w) in patches, as the model's video_grid_thw row
    timestamps: list[float]  # seconds per temporal patch (Qwen3-VL writes them into the prompt)
    seconds_per_patch: float  # Qwen2.5-VL's second_per_grid_ts

    @property
    def embeddings(self) -> torch.Tensor:
        return torch.cat([patch["embeddings"] for patch in self.patches])

    @property
    def deepstack_features(self) -> list[torch.Tensor] | None:
        """Per deepstack layer, the clip's features (Qwen3-VL), or None for other families."""
        if "deepstack_features" not in self.patches[0]:
            return None
        layers = range(len(self.patches[0]["deepstack_features"]))
        return [torch.cat([patch["deepstack_features"][layer] for patch in self.patches]) for layer in layers]


def check_temporal_locality(model: PreTrainedModel) -> None:
    """Raise ConfigurationError unless encoding a 2-patch clip whole equals encoding its patches
    one by one: random pixels, so attention across patches would change every output."""
    vision = model.config.vision_config
    merge, temporal = vision.spatial_merge_size, vision.temporal_patch_size
    side = 2 * merge  # two merged tokens a side: more than one attention unit per frame
    channels = getattr(vision, "in_channels", getattr(vision, "in_chans", 3))
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(2 * side * side, channels * temporal * vision.patch_size**2, generator=generator)
    pixels = pixels.to(model.device)
    encode: Any = model.get_video_features
    with torch.no_grad():
        whole = encode(pixels, torch.tensor([[2, side, side]], device=model.device))
        split = encode(pixels, torch.tensor([[1, side, side]] * 2, device=model.device))
    pairs = [(whole.pooler_output[0], torch.cat(split.pooler_output))]
    whole_layers = getattr(whole, "deepstack_features", None) or []
    split_layers = getattr(split, "deepstack_features", None) or []
    for whole_layer, split_layer in zip(whole_layers, split_layers, strict=True):
        pairs.append((whole_layer[0], torch.cat(split_layer)))
    for joint, apart in pairs:
        scale = joint.float().abs().max().item()
        if (joint.float() - apart.float()).abs().max().item() > 1e-3 * scale + 1e-6:
            raise ConfigurationError(
                f"{type(model).__name__}'s vision attention spans temporal patches: encoding a clip's "
                "patches apart changes its output, so visioncache refuses to cache video for this model"
            )


def video_replacement(family: Family, output: VideoOutput, processor: Any) -> str:
    """The prompt text that stands for one video, as the family's processor writes it."""
    tokens_per_patch = int(output.grid[1:].prod()) // processor.image_processor.merge_size**2
    if family.video is None or not family.video.timestamps_in_prompt:
        return str(processor.video_token * tokens_per_patch * len(output.patches))
    frame = (
        processor.vision_start_token + processor.video_token * tokens_per_patch + processor.vision_end_token
    )
    return "".join(f"<{seconds:.1f} seconds>{frame}" for seconds in output.timestamps)


def video_inputs(encoder: FamilyEncoder, videos: list[VideoOutput]) -> tuple[list[str], dict[str, Any]]:
    """The prompt text of each video, and the forward inputs of all of them: ``video_grid_thw``,
    ``mm_encoder_outputs["video"]`` (and Qwen2.5-VL's ``second_per_grid_ts``)."""
    family = encoder.family
    replacements = [video_replacement(family, video, encoder.processor) for video in videos]
    deepstack = [video.deepstack_features for video in videos] if family.deepstack else None
    extra: dict[str, Any] = {
        "video_grid_thw": torch.stack([video.grid for video in videos]),
        "mm_encoder_outputs": {
            "video": encoder.encoder_output([video.embeddings for video in videos], deepstack)
        },
    }
    if family.video is not None and family.video.seconds_per_grid_input:
        extra["second_per_grid_ts"] = torch.tensor([video.seconds_per_patch for video in videos])
    return replacements, extra


def video_output(
    patches: list[dict[str, Any]],
    fps: float | None,
    frame_indices: Sequence[int],
    total_frames: int | None,
    temporal: int,
) -> VideoOutput:
    """A video's output from its patches' values and where its frames sit in time: Qwen3-VL's
    timestamp per patch is the mean of its first and last frame's time, as its processor's."""
    height, width = (int(size) for size in patches[0]["grid"][1:])
    indices = list(frame_indices)
    indices += [indices[-1]] * (-len(indices) % temporal)
    times = [index / (fps or DEFAULT_FPS) for index in indices]
    stamps = [(times[start] + times[start + temporal - 1]) / 2 for start in range(0, len(times), temporal)]
    seconds = temporal / sampled_fps(fps, len(frame_indices), total_frames)
    return VideoOutput(patches, torch.tensor([len(patches), height, width]), stamps, seconds)


def _frame_arrays(frames: list[tuple[Clip, int]]) -> list[Any]:
    """The pixels of ``(clip, position)`` frames, in order, one load per clip for only these."""
    positions: dict[int, list[int]] = {}
    clips: dict[int, Clip] = {}
    for clip, at in frames:
        positions.setdefault(id(clip), []).append(at)
        clips[id(clip)] = clip
    loaded = {
        (key, at): array
        for key, clip in clips.items()
        for at, array in zip(positions[key], clip.frames_at(positions[key]), strict=True)
    }
    return [loaded[(id(clip), at)] for clip, at in frames]


class VideoEncoder:
    """Per-temporal-patch video outputs through the cache's embedding and pixel-only levels."""

    def __init__(
        self,
        model: PreTrainedModel,
        processor: ProcessorMixin,
        cache: VisionEmbeddingCache,
        settings: VideoSettings,
        times: StageTimes,
        family: Family,
        tower_graphs: int = 4,
    ) -> None:
        check_temporal_locality(model)
        self.model: Any = model
        self.processor: Any = processor
        self.cache = cache
        self.settings = settings
        self.times = times
        self.deepstack = family.deepstack
        self.temporal = int(model.config.vision_config.temporal_patch_size)
        self.clips = ClipResolver(cache, settings, self.temporal)
        # Deepstack towers hand features out of middle layers, which a graph of the chain drops.
        self.graphs = TowerGraphs(model, 0 if self.deepstack else tower_graphs)

    def outputs(self, videos_per_request: Sequence[Sequence[VideoInput]]) -> list[list[VideoOutput]]:
        """Per request, each video's output; all missing patches are encoded in one call."""
        clips = self.clips.resolve([video for videos in videos_per_request for video in videos])
        patch_sources: dict[VideoPatch, tuple[Clip, int]] = {}
        items_per_clip = []
        for clip in clips:
            items = [
                self.clips.patch_item(clip, first)
                for first in range(0, len(clip.frame_digests), self.temporal)
            ]
            patch_sources.update((item, (clip, index * self.temporal)) for index, item in enumerate(items))
            items_per_clip.append(items)

        def encode(missing: list[Any]) -> list[dict[str, Any]]:
            return self._encode([patch_sources[item] for item in missing])

        values = self.cache.encode_batch(items_per_clip, encode)
        outputs = [self._output(clip, patches) for clip, patches in zip(clips, values, strict=True)]
        result, start = [], 0
        for videos in videos_per_request:
            result.append(outputs[start : start + len(videos)])
            start += len(videos)
        return result

    def _output(self, clip: Clip, patches: list[dict[str, Any]]) -> VideoOutput:
        return video_output(patches, clip.fps, clip.frame_indices, clip.total_frames, self.temporal)

    def _frame_pixels(self, frames: list[tuple[Clip, int]]) -> list[PixelOnlyCacheEntry]:
        """Per frame, its resized and normalised rows, through the pixel-only level."""
        items = [self.clips.frame_item(clip.frame_digests[position]) for clip, position in frames]
        sources = dict(zip(items, frames, strict=True))

        def preprocess(missing: list[Any]) -> list[PixelOnlyCacheEntry]:
            start = time.perf_counter()
            arrays = _frame_arrays([sources[item] for item in missing])
            rows = preprocess_frames(self.processor.image_processor, arrays, self.settings, self.temporal)
            elapsed = time.perf_counter() - start
            self.times.add(preprocess=elapsed, frames_preprocessed=len(missing))
            return [PixelOnlyCacheEntry(pixels, grid, elapsed / len(missing)) for pixels, grid in rows]

        return self.cache.preprocess_images(items, preprocess)

    def _encode(self, patches: list[tuple[Clip, int]]) -> list[dict[str, Any]]:
        """The vision tower on the missing patches, in one call, split per patch."""
        positions = [patch_frames(len(clip.frame_digests), first, self.temporal) for clip, first in patches]
        frames: dict[tuple[int, int], tuple[Clip, int]] = {}
        for (clip, _), patch in zip(patches, positions, strict=True):
            frames.update(((id(clip), at), (clip, at)) for at in patch)
        entries = dict(zip(frames, self._frame_pixels(list(frames.values())), strict=True))
        pixel_rows, grids = [], []
        for (clip, _), patch in zip(patches, positions, strict=True):
            parts = [entries[(id(clip), at)] for at in patch]
            pixel_rows.append(patch_pixels([part.pixel_values for part in parts]))
            grids.append(torch.as_tensor(parts[0].image_grid_thw))
        model = self.model
        device = model.device  # a walk over the model's parameters: once a call, not three times
        start = time.perf_counter()
        pixels, grid_rows = torch.cat(pixel_rows).to(device), torch.stack(grids)
        grid = grid_rows.to(device)
        deepstack: list[torch.Tensor] = []

        def eager() -> Sequence[torch.Tensor]:
            output = model.get_video_features(pixels, grid)
            deepstack.extend(output.deepstack_features if self.deepstack else ())
            pooled: Sequence[torch.Tensor] = output.pooler_output
            return pooled

        with torch.no_grad():  # not inference_mode: cached tensors must stay usable under autograd
            pooled = self.graphs.encode(pixels, grid_rows, eager)  # a graph replay for a repeated grid
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # time the tower's work, not just its launch
        self.times.add(encode=time.perf_counter() - start, patches_encoded=len(patches))
        values = []
        for index in range(len(grids)):
            # clone: a slice of the batch output would keep the whole batch's storage alive.
            value: dict[str, Any] = {"embeddings": pooled[index].clone(), "grid": grids[index].clone()}
            if self.deepstack:
                value["deepstack_features"] = [layer[index].clone() for layer in deepstack]
            values.append(value)
        return values
