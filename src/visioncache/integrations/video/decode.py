"""Decode a video file (a path or its bytes) into RGB frames with PyAV, sampled at a frame rate.

Why PyAV: it is transformers' default video backend (``load_video(backend="pyav")``), its wheels
bundle FFmpeg (nothing to install besides ``pip install av``), and it reads from memory as well
as from a path, so a video sent as bytes is decoded without a temporary file. Sampling follows
transformers' Qwen2-VL video processor: ``fps`` frames per second of the source, clamped to
``[min_frames, max_frames]``, a multiple of the temporal patch size, uniformly spaced.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from visioncache.errors import InvalidImageError
from visioncache.extras import requires

__all__ = ["DEFAULT_FPS", "VideoSource", "VideoStream", "decode_frames", "probe_video", "sample_indices"]

VideoSource = str | os.PathLike[str] | bytes
DEFAULT_FPS = 24.0  # transformers' Qwen processors assume it when a video's rate is unknown


@dataclass(frozen=True)
class VideoStream:
    """What sampling needs to know about a video's first video stream."""

    total_frames: int
    fps: float


def _import_av() -> Any:
    with requires("hf", "decoding video files"):
        import av
    return av


def _open(source: VideoSource) -> Any:
    av = _import_av()
    target: Any = io.BytesIO(source) if isinstance(source, bytes) else os.fspath(source)
    try:
        container = av.open(target)
    except (av.FFmpegError, OSError, ValueError) as error:
        raise InvalidImageError(f"cannot open the video: {error}") from None
    if not container.streams.video:
        container.close()
        raise InvalidImageError("the file has no video stream")
    return container


def _decoded(container: Any) -> Iterator[Any]:
    av = _import_av()
    try:
        yield from container.decode(video=0)
    except av.FFmpegError as error:
        raise InvalidImageError(f"cannot decode the video: {error}") from None


def probe_video(source: VideoSource) -> VideoStream:
    """Frame count and frame rate of the first video stream (counted by decoding where the
    container does not state the count)."""
    container = _open(source)
    try:
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        total = int(stream.frames) or sum(1 for _ in _decoded(container))
    finally:
        container.close()
    if total == 0:
        raise InvalidImageError("the video has no frames")
    return VideoStream(total, float(rate) if rate else DEFAULT_FPS)


def decode_frames(source: VideoSource, indices: Sequence[int]) -> list[np.ndarray]:
    """The frames at ``indices`` (ascending, may repeat) as RGB uint8 arrays of shape (H, W, 3)."""
    wanted = sorted(set(indices))
    found: dict[int, np.ndarray] = {}
    container = _open(source)
    try:
        for index, frame in enumerate(_decoded(container)):
            if index > wanted[-1]:
                break
            if index in wanted:
                found[index] = frame.to_ndarray(format="rgb24")
    finally:
        container.close()
    missing = [index for index in wanted if index not in found]
    if missing:
        raise InvalidImageError(f"the video ends before frame {missing[0]}")
    return [found[index] for index in indices]


def sample_indices(
    stream: VideoStream, fps: float, min_frames: int, max_frames: int, temporal_patch_size: int
) -> list[int]:
    """Uniformly spaced frame indices for ``fps`` frames per second, as transformers' Qwen2-VL
    video processor samples them; the count is a multiple of ``temporal_patch_size``."""
    total = stream.total_frames
    cap = math.floor(min(max_frames, total) / temporal_patch_size) * temporal_patch_size
    count = min(max(total / stream.fps * fps, min_frames), cap, total)
    count = math.floor(count / temporal_patch_size) * temporal_patch_size
    if count < temporal_patch_size:
        raise InvalidImageError(
            f"the video has {total} frames: too few for one temporal patch of {temporal_patch_size}"
        )
    return [int(position * total / count) for position in range(count)]
