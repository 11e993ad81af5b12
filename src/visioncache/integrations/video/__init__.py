"""Engine-agnostic video: clips, frame sampling and decoding (PyAV), temporal patches."""

from visioncache.integrations.video.clip import (
    Clip,
    ClipResolver,
    VideoFrames,
    VideoInput,
    VideoSettings,
    patch_frames,
    sampled_fps,
)
from visioncache.integrations.video.decode import DEFAULT_FPS

__all__ = [
    "DEFAULT_FPS",
    "Clip",
    "ClipResolver",
    "VideoFrames",
    "VideoInput",
    "VideoSettings",
    "patch_frames",
    "sampled_fps",
]
