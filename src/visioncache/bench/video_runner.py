"""The video bench's three modes on one model, turn by turn, timed the same way.

Why: the modes must differ only in how a turn's video output is obtained. ``off`` decodes,
preprocesses and encodes the whole clip every turn (transformers' own work); ``whole_clip``
caches a video's output under one key, as vLLM, SGLang and the other engines do, so any change
to the clip misses whole; ``visioncache`` is ``CachedVisionModel`` (per temporal patch, per frame,
files by their bytes). Every mode's prompt and model inputs are then built by the same code and
prefilled by the same forward, so the logits can be compared exactly.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, ProcessorMixin

from visioncache import ContentId, VisionEmbeddingCache, compute_image_hash
from visioncache.bench.video_workload import VideoWorkload
from visioncache.integrations.fingerprint import fingerprint
from visioncache.integrations.transformers import CachedVisionModel, model_namespace
from visioncache.integrations.transformers.video import VideoOutput, video_output
from visioncache.integrations.transformers.video_pixels import clip_pixels
from visioncache.integrations.video.clip import (
    VideoFrames,
    VideoInput,
    VideoSettings,
    rgb_frame,
    sample_file,
)

__all__ = ["MODES", "TurnResult", "VideoModeResult", "run_video_modes"]

MODES = ("off", "whole_clip", "visioncache")


@dataclass(frozen=True)
class TurnResult:
    """One turn of one mode: what its video cost, and how far its logits are from ``off``'s."""

    patches_sent: int
    patches_encoded: int
    vision_s: float  # decode + preprocess + encode: the video's part of the turn
    ttft_s: float  # the whole turn up to the prefill logits (the first token's)
    max_logit_diff: float


@dataclass
class VideoModeResult:
    mode: str
    workload: str
    turns: list[TurnResult] = field(default_factory=list)


# A mode's way to get a video's output: (video) -> (output, temporal patches it encoded)
Obtain = Callable[[VideoInput], tuple[VideoOutput, int]]


class _Modes:
    """The model, its processor and video settings, with each mode's way to obtain an output."""

    def __init__(
        self, model: PreTrainedModel, processor: ProcessorMixin, settings: VideoSettings, tower_graphs: int
    ) -> None:
        self.model: Any = model
        self.tower_graphs = tower_graphs
        self.cached: CachedVisionModel | None = None  # the visioncache mode's adapter
        self.processor: Any = processor
        self.settings = settings
        self.temporal = int(model.config.vision_config.temporal_patch_size)
        self.namespace = model_namespace(model, processor)
        # Builds prompts and model inputs from outputs; its disabled cache is never used.
        self.inputs = CachedVisionModel(model, processor, cache=VisionEmbeddingCache(enabled=False))

    def whole(self, video: VideoInput) -> VideoOutput:
        """Decode, preprocess and encode the whole clip, uncached (the ``off`` mode's work)."""
        if isinstance(video, bytes):
            frames, indices, stream = sample_file(video, self.settings, self.temporal)
            fps: float | None = stream.fps
            total: int | None = stream.total_frames
        else:
            assert isinstance(video, VideoFrames)
            frames = [rgb_frame(frame) for frame in video.frames]
            fps, total = video.fps, None
            indices = list(video.frame_indices or range(len(frames)))
        pixels, grid = clip_pixels(self.processor.image_processor, frames, self.settings, self.temporal)
        device = self.model.device
        with torch.no_grad():
            output = self.model.get_video_features(pixels.to(device), grid[None].to(device))
        _synchronize(device)
        merge = self.model.config.vision_config.spatial_merge_size
        per_patch = int(grid[1:].prod()) // merge**2
        layers = getattr(output, "deepstack_features", None) or []
        patches = []
        for start in range(0, int(grid[0]) * per_patch, per_patch):
            patch: dict[str, Any] = {"embeddings": output.pooler_output[0][start : start + per_patch]}
            patch["grid"] = torch.tensor([1, int(grid[1]), int(grid[2])])
            if layers:
                patch["deepstack_features"] = [layer[0][start : start + per_patch] for layer in layers]
            patches.append(patch)
        return video_output(patches, fps, indices, total, self.temporal)

    def obtain(self, mode: str) -> Obtain:
        """``mode``'s way to obtain a video's output, with a cache of its own."""
        if mode == "off":
            return lambda video: (self.whole(video), 0)  # patches counted from the output below
        cache = VisionEmbeddingCache(namespace=self.namespace)
        if mode == "visioncache":
            adapter = CachedVisionModel(
                self.model,
                self.processor,
                cache=cache,
                video_settings=self.settings,
                tower_graphs=self.tower_graphs,
            )
            self.cached = adapter

            def per_patch(video: VideoInput) -> tuple[VideoOutput, int]:
                before = adapter.times.patches_encoded
                output = adapter.video_outputs([[video]])[0][0]
                return output, adapter.times.patches_encoded - before

            return per_patch

        def whole_clip(video: VideoInput) -> tuple[VideoOutput, int]:
            encoded: list[int] = []

            def encode(_: list[Any]) -> list[dict[str, Any]]:
                output = self.whole(video)
                encoded.append(len(output.patches))
                return [vars(output)]  # an array tree the cache can size and store

            value = cache.encode_images([self._clip_id(video)], encode)[0]
            return VideoOutput(**value), sum(encoded)

        return whole_clip

    def _clip_id(self, video: VideoInput) -> ContentId:
        """One identity for the whole clip, from content digests: the file's bytes, or all its
        frames' pixels in order, under these settings."""
        if isinstance(video, bytes):
            parts = ["file", compute_image_hash(video)]
        else:
            assert isinstance(video, VideoFrames)
            parts = ["frames", *(compute_image_hash(rgb_frame(frame)) for frame in video.frames)]
        return ContentId("bench whole clip " + fingerprint([repr(self.settings), *parts]))

    def logits(self, prompt: str, output: VideoOutput) -> torch.Tensor:
        inputs = self.inputs.model_inputs([prompt], [[]], [[output]])
        with torch.no_grad():
            logits: torch.Tensor = self.model(**inputs).logits.float()
        _synchronize(logits.device)
        return logits


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_video_modes(
    model: PreTrainedModel,
    processor: ProcessorMixin,
    workload: VideoWorkload,
    settings: VideoSettings,
    tower_graphs: int = 4,
) -> list[VideoModeResult]:
    """Every mode on ``workload``, taking turns request by request (each with its own cache), so
    load from other processes falls on all modes alike; logits are compared with ``off``'s.
    ``tower_graphs``: the visioncache mode's CUDA graphs of the tower (``CachedVisionModel``)."""
    modes = _Modes(model, processor, settings, tower_graphs)
    modes.logits(workload.requests[0].prompt, modes.whole(workload.requests[0].video))  # warm-up, untimed
    runs = [(VideoModeResult(mode, workload.name), modes.obtain(mode)) for mode in MODES]
    for request in workload.requests:
        reference: torch.Tensor | None = None
        for result, obtain in runs:
            start = time.perf_counter()
            output, encoded = obtain(request.video)
            vision = time.perf_counter() - start
            logits = modes.logits(request.prompt, output)
            ttft = time.perf_counter() - start
            reference = logits if reference is None else reference
            sent = len(output.patches)
            encoded = sent if result.mode == "off" else encoded
            diff = float((logits - reference).abs().max())
            result.turns.append(TurnResult(sent, encoded, vision, ttft, diff))
    video = modes.cached._video if modes.cached is not None else None
    if video is not None and video.graphs.device_type == modes.model.device.type:  # graphs apply
        graphs = video.graphs
        print(
            f"{workload.name}: tower graphs (limit {graphs.limit}): {graphs.captures} captured, "
            f"{graphs.replays} replayed" + (f", refused: {graphs.refused}" if graphs.refused else ""),
            file=sys.stderr,
        )
    return [result for result, _ in runs]
